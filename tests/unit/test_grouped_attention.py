"""Prefix-grouped attention (`nanosky.train.grouped_attention`) against the dense ancestor mask, the reference: the
same log p, entropy and gradients on packed rows, with sliding windows, GQA, several rows and a deeper trie."""

import copy
import functools

import pytest
import torch
from families import build
from gradcheck import assert_same, logprobs_and_grads
from torch.nn.functional import scaled_dot_product_attention as sdpa

from nanosky.train import grouped_attention, head, packing


def _workload(vocab: int, seed: int = 0):
    """Two groups (a prompt, completions), one with a branch shared past its prompt, and a lone sequence."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    a, b = rand(20), rand(14)
    seqs = [a + rand(k) for k in (9, 5, 12)] + [b + rand(k) for k in (7, 3)] + [rand(11)]
    seqs[2][20:24] = seqs[1][20:24]  # a deeper trie: a branch shared past the prompt
    seqs.append(list(seqs[3]))  # a duplicate: it adds no token of its own
    T = max(len(s) for s in seqs) - 1
    keep = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        keep[i, : len(s) - 1] = True
    return seqs, T, keep


@pytest.fixture(scope="module", params=["qwen2", "mistral_swa", "qwen3", "exaone4"])
def models(request, tmp_path_factory):
    """(dense, grouped): the same weights, one on SDPA with the dense mask, one on grouped attention."""
    from transformers import AutoModelForCausalLM

    path = build(request.param, str(tmp_path_factory.mktemp(request.param)))
    dense = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    grouped = copy.deepcopy(dense)
    assert grouped_attention.enable(grouped) and grouped_attention.enabled(grouped)
    assert not grouped_attention.enabled(dense)
    return dense, grouped


@pytest.mark.parametrize("chunk", [0, 8])  # the plain LM head, and the chunked head (its decoder call)
@pytest.mark.parametrize("row_tokens", [1024, 40])
def test_log_p_entropy_and_gradients_equal_the_dense_mask(models, row_tokens, chunk):
    dense, grouped = models
    for m in models:
        head.install(m)
    seqs, T, keep = _workload(dense.config.vocab_size)
    p = packing.pack(seqs, T, row_tokens=row_tokens)
    assert sum(n for _, _, n, _ in p.segments.segs) == p.unique_tokens  # the segments tile the real tokens
    adv = torch.randn(keep.shape, generator=torch.Generator().manual_seed(1))

    ref = logprobs_and_grads(dense, p, keep, adv, chunk=chunk)
    assert_same(ref, logprobs_and_grads(grouped, p, keep, adv, chunk=chunk), keep)


def test_the_build_check_and_unsegmented_forwards_run_on_grouped_attention(models):
    dense, grouped = models
    assert packing.verify(grouped, packing.lm_forward(grouped), 1e-4) < 1e-5  # packed (grouped) vs unpacked
    ids = torch.randint(3, 500, (2, 16))
    with torch.no_grad():  # a forward without segments is transformers' SDPA
        torch.testing.assert_close(grouped(input_ids=ids).logits, dense(input_ids=ids).logits, rtol=0, atol=0)


def test_grouped_rows_never_build_the_dense_mask(models):
    """The [R, 1, Lp, Lp] ancestor mask is built on first use: grouped attention never uses it (at rows of 8192 its
    construction was most of the packing's time), the dense path builds it once."""
    dense, grouped = models
    seqs, T, keep = _workload(dense.config.vocab_size)
    p = packing.pack(seqs, T, row_tokens=40)
    with torch.no_grad():
        packing.logprobs(grouped, p, keep=keep)
        assert p._mask is None
        packing.logprobs(dense, p, keep=keep)
    assert p._mask is not None and p._mask.shape == (p.input_ids.shape[0], 1, *p.input_ids.shape[1:] * 2)


def test_rows_are_capped_by_the_attention_the_model_runs(models):
    """Grouped attention packs a micro-batch into one row (no quadratic cost, no padding); the dense mask, and so the
    critic, which never runs grouped, caps rows at 1024 tokens."""
    from nanosky.agent.trajectory import Trajectory
    from nanosky.config.model import OptimConfig
    from nanosky.train.batch import to_batch
    from nanosky.train.update import pack_batch

    dense, grouped = models
    g = torch.Generator().manual_seed(0)
    trajs = [
        Trajectory(
            ids=torch.randint(3, 500, (300,), generator=g).tolist(), loss_mask=[1] * 300, logprobs=[0.0] * 300, group=i
        )
        for i in range(8)
    ]
    m = to_batch(trajs, 0, torch.device("cpu"))
    _, _, T = m.inputs()
    assert pack_batch(m, T, OptimConfig(), grouped).input_ids.shape == (1, 2400)
    assert pack_batch(m, T, OptimConfig(), dense).input_ids.shape[0] == 3  # 2400 tokens in rows of <= 1024
    assert pack_batch(m, T, OptimConfig(pack_row_tokens=600), grouped).input_ids.shape == (4, 600)


def test_the_choice_by_device_and_flag():
    from nanosky.config.model import OptimConfig

    assert OptimConfig().grouped() and OptimConfig(packed_attention="grouped").grouped()  # auto: grouped
    assert not OptimConfig(packed_attention="mask").grouped()
    assert not OptimConfig(packing="none").grouped()  # unpacked rows have no segments
    # rows: uncapped under grouped attention (by segment: a row's length costs nothing), 1024 under the dense mask
    assert OptimConfig().row_tokens(grouped=True) is None and OptimConfig().row_tokens(grouped=False) == 1024
    assert OptimConfig(pack_row_tokens=300).row_tokens(grouped=True) == 300


def _reference_varlen(
    query, key, value, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), scale=None, enable_gqa=False
):
    """flash-attention's varlen semantics, segment by segment (what torch's CUDA kernel computes): query i of a
    segment with n queries and lk keys sits at key position i + lk - n (causal aligned bottom-right) and sees the keys
    within `window_size` = (left, right) of it, -1 meaning unbounded."""
    assert query.shape[1] == key.shape[1] or enable_gqa
    assert max_q == int((cu_q[1:] - cu_q[:-1]).max()) and max_k == int((cu_k[1:] - cu_k[:-1]).max())
    left, right = window_size
    outs = []
    for s in range(len(cu_q) - 1):
        q = query[cu_q[s] : cu_q[s + 1]].transpose(0, 1)  # [H, n, d]
        k, v = (x[cu_k[s] : cu_k[s + 1]].transpose(0, 1) for x in (key, value))  # [Hkv, lk, d]
        n, lk = q.shape[1], k.shape[1]
        at = torch.arange(n)[:, None] + lk - n  # [n, 1]: each query's own key position
        j = torch.arange(lk)[None]
        mask = (j <= at + right if right >= 0 else True) & (j >= at - left if left >= 0 else True)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[0] != k.shape[0]
        )
        outs.append(out.transpose(0, 1))  # [n, H, d]
    return torch.cat(outs)


def _old_reference_varlen(query, key, value, cu_q, cu_k, max_q, max_k, *, is_causal=False):
    """torch 2.9's signature: causal or not, no window, no scale, no GQA."""
    assert query.shape[1] == key.shape[1]
    return _reference_varlen(query, key, value, cu_q, cu_k, max_q, max_k, window_size=(-1, 0 if is_causal else -1))


def _on_the_varlen_path(kernel, monkeypatch) -> list[dict]:
    """The CUDA path taken on the CPU, its kernel replaced by `kernel`; returns the list each call's kwargs go to."""
    calls = []

    @functools.wraps(kernel)  # the signature is what the path reads to call it
    def counted(*a, **kw):
        calls.append(kw)
        return kernel(*a, **kw)

    monkeypatch.setattr(grouped_attention, "use_varlen", lambda q: True)
    monkeypatch.setattr(grouped_attention, "varlen_kernel", lambda: counted)
    return calls


def _packed_workload(model):
    """The workload packed in rows of 40, and fixed advantages: (seqs, T, keep, packed, adv)."""
    seqs, T, keep = _workload(model.config.vocab_size)
    adv = torch.randn(keep.shape, generator=torch.Generator().manual_seed(1))
    return seqs, T, keep, packing.pack(seqs, T, row_tokens=40), adv


@pytest.mark.parametrize("kernel", [_reference_varlen, _old_reference_varlen])
def test_the_varlen_path_equals_the_dense_mask(models, kernel, monkeypatch):
    """The CUDA path (one varlen call per layer) with the kernel replaced by its semantics on the CPU: the gathers,
    offsets, window and GQA handling around it give the dense mask's log p, entropy and gradients."""
    calls = _on_the_varlen_path(kernel, monkeypatch)
    dense, grouped = models
    seqs, T, keep, p, adv = _packed_workload(dense)
    ref = logprobs_and_grads(dense, p, keep, adv, chunk=8)
    assert_same(ref, logprobs_and_grads(grouped, p, keep, adv, chunk=8), keep)
    kinds, window = packing.attention_kinds(dense.config)
    if kernel is _old_reference_varlen and window:  # no window in the old signature: windowed layers take SDPA
        assert bool(calls) == (packing.FULL in kinds) and all(kw == {"is_causal": True} for kw in calls)
    else:
        assert len(calls) >= dense.config.num_hidden_layers


def test_the_kernel_is_chosen_by_argument(models, monkeypatch):
    """`enable(model, varlen=False)` runs one SDPA call per segment even where the varlen kernel would run (what
    bench/gpu_check.py compares), with the same log p; `enable(model)` goes back to the kernel. No global flips."""
    calls = _on_the_varlen_path(_reference_varlen, monkeypatch)
    dense, grouped = models
    seqs, T, keep, p, adv = _packed_workload(dense)
    try:
        assert grouped_attention.enable(grouped, varlen=False) and grouped_attention.enabled(grouped)
        per_segment = logprobs_and_grads(grouped, p, keep, adv, chunk=8)
        assert calls == []
        assert grouped_attention.enable(grouped)
        assert_same(per_segment, logprobs_and_grads(grouped, p, keep, adv, chunk=8), keep)
        assert calls
    finally:
        grouped_attention.enable(grouped)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("kind", ["mask", "causal"])
def test_the_cpu_scores_path_equals_sdpa(dtype, tol, kind):
    """The CPU's short calls (`scores_attention`): SDPA's output and gradients, with grouped query heads, a batch's
    bottom-right mask (padded keys off) or a square causal segment."""
    g = torch.Generator().manual_seed(0)
    S, H, Hkv, n, d = 3, 6, 2, 5, 8
    lk = n if kind == "causal" else 11
    q, k, v = (torch.randn(S, h, L, d, generator=g) for h, L in ((H, n), (Hkv, lk), (Hkv, lk)))
    mask = None
    if kind == "mask":
        mask = torch.ones(n, lk, dtype=torch.bool).tril(lk - n).repeat(S, 1, 1, 1)  # [S, 1, n, Lk]
        mask[1, :, :, -3:] = False  # a shorter segment's padded keys
        mask[1, :, -1, 0] = True
    out_grad = torch.randn(S, H, n, d, generator=g)

    def run(f):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = f(*leaves)
        out.float().backward(out_grad)
        return [out.float(), *(t.grad.float() for t in leaves)]

    ref = run(lambda q, k, v: sdpa(q, k, v, attn_mask=mask, is_causal=kind == "causal", scale=0.3, enable_gqa=True))
    got = run(lambda q, k, v: grouped_attention.scores_attention(q, k, v, mask, kind == "causal", 0.3))
    for a, b in zip(ref, got):
        assert (a - b).abs().max() <= tol * max(1.0, a.abs().max())


def test_half_precision_cpu_calls_materialise_their_scores_up_to_a_bound(models, monkeypatch):
    """On the CPU in bf16 the segments' calls materialise their scores (`scores_attention`) up to `SCORES_BYTES`;
    past it, and in fp32, SDPA's kernel takes them. Both agree with the dense mask to bf16's rounding."""
    dense, grouped = (copy.deepcopy(m).to(torch.bfloat16) for m in models)
    calls = []
    real = grouped_attention.scores_attention
    monkeypatch.setattr(grouped_attention, "scores_attention", lambda *a: calls.append(a[0].shape) or real(*a))
    seqs, T, keep = _workload(dense.config.vocab_size)
    p = packing.pack(seqs, T, row_tokens=1024)
    adv = torch.randn(keep.shape, generator=torch.Generator().manual_seed(1))
    ref = logprobs_and_grads(dense, p, keep, adv)
    assert_same(ref, logprobs_and_grads(grouped, p, keep, adv), keep, tol=0.1)
    assert calls
    calls.clear()
    logprobs_and_grads(models[1], p, keep, adv)  # fp32
    assert not calls
    monkeypatch.setattr(grouped_attention, "SCORES_BYTES", 0)
    assert_same(ref, logprobs_and_grads(grouped, p, keep, adv), keep, tol=0.1)
    assert not calls
