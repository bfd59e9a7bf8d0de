"""Shared-prefix packing (nanosky/train/packing.py): the packed forward equals the unpacked one, in logprobs, entropy,
critic values and parameter gradients (fp32, the bundled tiny model; LoRA too). The gradient's independence of
the micro-batch token budget and the world size is checked end to end in tests/test_update.py."""

import random

import pytest
import torch
from cpu import FP32

from nanosky.train import packing
from nanosky.train.policy import token_logprobs


def _padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(map(len, seqs))
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], att[i, : len(s)] = torch.tensor(s), 1
    return ids, att


def _workload(seed: int = 0) -> tuple[list[list[int]], torch.Tensor]:
    """GRPO groups (a shared prompt, ragged answers), multi-turn episodes (a shared opening, then turns whose
    observation tokens are masked), a duplicate, a sequence that is a prefix of another, and a 1-token row.
    Returns the sequences and a loss mask [B, L-1] (1 on policy tokens)."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randint(3, 1000) for _ in range(n)]  # noqa: E731
    seqs, masks = [], []
    for _ in range(3):  # groups of 4
        prompt = tok(rng.randint(5, 30))
        for _ in range(4):
            ans = tok(rng.randint(1, 12))
            seqs.append(prompt + ans)
            masks.append([0] * len(prompt) + [1] * len(ans))
    opening = tok(20)
    for _ in range(3):  # episodes: act, observe, act
        a1, obs, a2 = tok(rng.randint(2, 6)), tok(rng.randint(3, 8)), tok(rng.randint(2, 6))
        seqs.append(opening + a1 + obs + a2)
        masks.append([0] * 20 + [1] * len(a1) + [0] * len(obs) + [1] * len(a2))
    seqs += [list(seqs[0]), seqs[5][:-2], [7]]
    masks += [masks[0], masks[5][:-2], [0]]
    L = max(map(len, seqs))
    mask = torch.zeros(len(seqs), L)
    for i, m in enumerate(masks):
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return seqs, mask[:, 1:]


@pytest.fixture(scope="module")
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)


def test_layout_is_a_trie_with_ancestor_attention():
    p_, a, b, c = 11, 12, 13, 14
    seqs = [[p_, p_ + 1, p_ + 2, a, a], [p_, p_ + 1, p_ + 2, b], [p_, p_ + 1, p_ + 2, b, c]]
    p = packing.pack(seqs, T=4)
    assert p.input_ids.tolist() == [[11, 12, 13, 12, 12, 13, 14]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 4]]
    assert (p.unique_tokens, p.tokens) == (7, 14)
    allowed = p.attention_mask[0, 0].int().tolist()
    # c (column 6) sees the prompt, b (its parent, column 5) and itself; not the a-branch or anything after
    assert allowed[6] == [1, 1, 1, 0, 0, 1, 1]
    assert allowed[5] == [1, 1, 1, 0, 0, 1, 0]
    assert allowed[4] == [1, 1, 1, 1, 1, 0, 0]
    assert allowed[2] == [1, 1, 1, 0, 0, 0, 0]
    # sequence 2 ([p p p b c]) reads its tokens at columns 0, 1, 2, 5 (b: shared with sequence 1) and 6
    assert p.pos[2].tolist() == [0, 1, 2, 5] and p.target[2].tolist() == [12, 13, 13, 14]
    assert p.valid.sum(-1).tolist() == [4, 3, 4]


def test_rows_respect_the_cap_and_every_token_is_placed():
    seqs, _ = _workload()
    p = packing.pack(seqs, T=max(map(len, seqs)) - 1, row_tokens=40)
    assert p.input_ids.shape[1] <= max(40, max(map(len, seqs)))
    assert p.input_ids.shape[0] > 1
    flat = packing.pack(seqs, T=max(map(len, seqs)) - 1, row_tokens=40, share=False)
    assert flat.unique_tokens == flat.tokens == sum(map(len, seqs))
    assert p.unique_tokens < flat.unique_tokens
    for q in (p, flat):  # every scored position reads the right token's column
        got = q.input_ids[q.row, q.pos]  # [B, T] the token at position t
        for i, s in enumerate(seqs):
            assert got[i, : len(s) - 1].tolist() == s[:-1]


@pytest.mark.parametrize("row_tokens,share", [(1024, True), (40, True), (1024, False)])
def test_logprobs_entropy_and_gradients_equal_unpacked(model, row_tokens, share):
    seqs, mask = _workload()
    ids, att = _padded(seqs)
    T = ids.shape[1] - 1
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))

    def run(fn):
        model.zero_grad(set_to_none=True)
        lp, ent = fn()
        loss = ((lp * adv + 0.1 * ent) * mask).sum() / mask.sum()
        loss.backward()
        grads = {n: q.grad.clone() for n, q in model.named_parameters()}
        return lp.detach(), ent.detach(), grads

    lp0, e0, g0 = run(lambda: token_logprobs(model, ids, att, with_entropy=True, entropy_grad=True))
    p = packing.pack(seqs, T, row_tokens=row_tokens, share=share)
    lp1, e1, g1 = run(lambda: packing.logprobs(model, p, with_entropy=True, entropy_grad=True))
    valid = att[:, 1:].bool()
    assert torch.equal(p.valid, valid)
    assert ((lp0 - lp1)[valid].abs() / lp0[valid].abs().clamp(min=1)).max() < 1e-5
    assert (e0 - e1)[valid].abs().max() < 1e-5 * e0[valid].abs().max()
    assert (lp1[~valid] == 0).all()
    for n in g0:
        scale = g0[n].abs().max()
        assert scale > 0, n  # every parameter gets a gradient, so the comparison means something
        assert (g0[n] - g1[n]).abs().max() <= 1e-5 * scale, n


@pytest.mark.parametrize("row_tokens", [1024, 40])
def test_scoring_only_the_loss_mask_keeps_its_values_and_gradients(model, row_tokens):
    """`keep` = the loss mask: only those columns go through the LM head. The kept logprobs, entropies and every
    gradient of a masked loss equal the full computation; the positions left out come back 0."""
    seqs, mask = _workload(2)
    T = mask.shape[1]
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(3))
    p = packing.pack(seqs, T, row_tokens=row_tokens)

    def run(keep):
        model.zero_grad(set_to_none=True)
        lp, ent = packing.logprobs(model, p, with_entropy=True, entropy_grad=True, keep=keep)
        (((lp * adv + 0.1 * ent) * mask).sum() / mask.sum()).backward()
        return lp.detach(), ent.detach(), {n: q.grad.clone() for n, q in model.named_parameters()}

    lp0, e0, g0 = run(None)
    keep = mask > 0
    lp1, e1, g1 = run(keep)
    assert keep.any() and (p.valid & ~keep).any()  # some scored positions really are left out
    assert (lp0 - lp1)[keep].abs().max() < 1e-5 and (e0 - e1)[keep].abs().max() < 1e-5
    assert (lp1[~keep] == 0).all() and (e1[~keep] == 0).all() and (lp0[p.valid & ~keep] != 0).all()
    for n in g0:
        assert (g0[n] - g1[n]).abs().max() <= 1e-5 * g0[n].abs().max(), n
    # nothing kept (a blank pass): zeros, and backward still reaches every parameter (FSDP's hooks must fire)
    lp, _ = packing.logprobs(model, p, keep=torch.zeros_like(keep))
    assert (lp == 0).all()
    model.zero_grad(set_to_none=True)
    lp.sum().backward()
    assert all(q.grad is not None for q in model.parameters())


def test_critic_values_and_gradients_equal_unpacked(tiny_path):
    from nanosky.train.critic import Critic

    torch.manual_seed(0)
    critic = Critic(tiny_path)
    # the zero-initialised head would hide the backbone
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)
    seqs, mask = _workload(1)
    ids, att = _padded(seqs)
    p = packing.pack(seqs, ids.shape[1] - 1, row_tokens=64)
    out = []
    for fn in (
        lambda: critic(ids, att),
        lambda: p.gather(critic(p.input_ids, p.attention_mask, p.position_ids)),
    ):
        critic.zero_grad(set_to_none=True)
        v = fn()  # [B, T]
        ((v * mask).sum()).backward()
        out.append((v.detach(), {n: q.grad.clone() for n, q in critic.named_parameters()}))
    (v0, g0), (v1, g1) = out
    valid = att[:, 1:].bool()
    assert (v0 - v1)[valid].abs().max() < 1e-5 * v0[valid].abs().max()
    for n in g0:
        assert (g0[n] - g1[n]).abs().max() <= 1e-5 * g0[n].abs().max() + 1e-12, n


def test_lora_gradients_equal_unpacked(tiny_path, dist_info):
    from nanosky.train.lora import LoraConfig, load_lora_model, trainable_parameters

    torch.manual_seed(0)
    model = load_lora_model(tiny_path, LoraConfig(rank=4, alpha=8), dist_info, precision=FP32)
    for n, q in model.named_parameters():
        if "lora_B" in n:  # a fresh adapter's B is 0: make it count
            torch.nn.init.normal_(q, std=0.05)
    seqs, mask = _workload(2)
    ids, att = _padded(seqs)
    p = packing.pack(seqs, ids.shape[1] - 1)
    grads = []
    for fn in (lambda: token_logprobs(model, ids, att)[0], lambda: packing.logprobs(model, p)[0]):
        model.zero_grad(set_to_none=True)
        (fn() * mask).sum().backward()
        grads.append([q.grad.full_tensor().clone() for q in trainable_parameters(model)])
    assert len(grads[0]) > 0
    for a, b in zip(*grads):
        assert a.abs().max() > 0 and (a - b).abs().max() <= 1e-5 * a.abs().max()


def test_token_budget_micro_batches():
    seqs, _ = _workload()
    plan = packing.plan_micro_batches(seqs, max_rows=8, max_tokens=60, share=True)
    assert sorted(i for mb in plan for i in mb) == list(range(len(seqs)))
    for mb in plan:
        computed = packing.pack([seqs[i] for i in mb], T=200).unique_tokens
        assert computed <= 60 or len(mb) == 1, (mb, computed)
    # the groups' members stay together: fewer micro-batches than without sharing
    flat = packing.plan_micro_batches(seqs, max_rows=8, max_tokens=60, share=False)
    assert len(plan) < len(flat)
    rows = packing.plan_micro_batches(seqs, max_rows=8, max_tokens=0, share=True)
    assert rows == [list(range(0, 8)), list(range(8, 16)), list(range(16, 18))]


def test_a_rank_with_fewer_micro_batches_splits_then_pads(monkeypatch):
    """Another rank needs more passes: this one splits its largest micro-batches, then adds empty ones."""
    seqs = [[5, 6, 7], [5, 6, 8], [9]]
    monkeypatch.setattr(packing.dist, "all_reduce_max", lambda v: [5.0])
    plan = packing.plan_micro_batches(seqs, max_rows=8, max_tokens=100, share=True)
    assert len(plan) == 5
    assert sorted(i for mb in plan for i in mb) == [0, 1, 2]
    assert sum(1 for mb in plan if not mb) == 2


def test_packing_takes_eager_attention_with_an_additive_mask_and_refuses_others(tiny_path):
    """Eager attention adds its mask to the scores: the boolean trie mask becomes 0 / -inf, and eager equals SDPA.
    Attention that takes no 4-D mask (flash) or kinds packing cannot mask are refused, naming the fallback."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    sdpa = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    eager = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="eager")
    seqs = [[5, 6, 7, 9, 11], [5, 6, 8], [5, 6, 7, 10]]
    p = packing.pack(seqs, T=4)
    assert packing.attention_mask(eager, p).dtype == torch.float32
    with torch.no_grad():
        a, _ = packing.logprobs(sdpa, p)
        b, _ = packing.logprobs(eager, p)
    assert (a - b).abs().max() < 1e-5 and a.abs().max() > 0.1
    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2", num_hidden_layers=2))
    with pytest.raises(ValueError, match="--optim.packing none"):
        packing.check_attention(flash)
    chunked = SimpleNamespace(
        config=SimpleNamespace(_attn_implementation="sdpa", layer_types=["chunked_attention"], sliding_window=None)
    )
    with pytest.raises(ValueError, match="chunked_attention"):
        packing.check_attention(chunked)


@pytest.mark.parametrize("lora", [False, True])
def test_activation_checkpointing_recomputes_each_layer_and_keeps_the_gradients(tiny_path, dist_info, lora):
    """--optim.activation-checkpointing: the same gradients (plain and LoRA, under FSDP2, through the packed path),
    with every decoder layer run a second time in backward (its recompute)."""
    from nanosky.train.lora import LoraConfig, load_lora_model, trainable_parameters
    from nanosky.train.policy import decoder_layers, load_model

    seqs, mask = _workload(3)
    p = packing.pack(seqs, max(map(len, seqs)) - 1)
    grads, calls = [], []
    for ckpt in (False, True):
        torch.manual_seed(0)
        if lora:
            model = load_lora_model(
                tiny_path, LoraConfig(rank=4, alpha=8), dist_info, activation_checkpointing=ckpt, precision=FP32
            )
            for n, q in model.named_parameters():
                if "lora_B" in n:  # a fresh adapter's B is 0: make it count
                    torch.nn.init.normal_(q, std=0.05, generator=torch.Generator().manual_seed(1))
        else:
            model = load_model(tiny_path, dist_info, activation_checkpointing=ckpt, precision=FP32)
        n, layer = [0], decoder_layers(model)[0]
        forward = layer.forward

        def counted(*a, _forward=forward, _n=n, **k):  # (a forward hook does not fire in torch's recompute)
            _n[0] += 1
            return _forward(*a, **k)

        layer.forward = counted
        (packing.logprobs(model, p)[0] * mask).sum().backward()
        grads.append([q.grad.full_tensor().clone() for q in trainable_parameters(model)])
        calls.append(n[0])
    assert calls == [1, 2]  # checkpointed: the layer ran again in backward
    for a, b in zip(*grads):
        assert a.abs().max() > 0 and (a - b).abs().max() <= 1e-5 * a.abs().max()
