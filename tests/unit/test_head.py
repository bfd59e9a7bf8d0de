"""The chunked LM head (`nanosky.train.head`): log p(target) and the entropy, values and gradients, equal the plain
head's (the full logits, a log-softmax and autograd), on random tensors in float64 and through real models."""

import pytest
import torch
from gradcheck import assert_same, logprobs_and_grads

from nanosky.train import head, packing
from nanosky.train.policy import token_logprobs


def _plain(h, w, b, targets, post):
    """The reference: the whole [N, V] logits, as the model and the losses compute them without chunks."""
    scale, cap, T = post
    y = torch.nn.functional.linear(h, w, b).float() * scale  # the logits in fp32, as `.logits.float()`
    if cap:
        y = torch.tanh(y / cap) * cap
    logp = torch.log_softmax(y / T, -1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("chunk", [1, 5, 0])
@pytest.mark.parametrize("post", [(1.0, None, 1.0), (1.0, None, 0.7), (1.0, 4.0, 1.0), (0.25, None, 1.3)])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_the_plain_head(chunk, post, bias, keep, monkeypatch):
    """Temperature, Gemma's soft-cap and Granite's scale, chunks of 1, 5 and all 13 tokens; a loss on log p and one
    on the entropy, so both backward terms are exercised; forward's log p kept for backward, and recomputed."""
    monkeypatch.setattr(head, "KEEP_BYTES", head.KEEP_BYTES if keep else 0)
    g = torch.Generator().manual_seed(0)
    N, H, V = 13, 16, 50
    h = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    a, c = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)
    params = [x for x in (h, w, b) if x is not None]

    lp0, e0 = _plain(h, w, b, targets, post)
    g0 = torch.autograd.grad((lp0.double() * a).sum() + (e0.double() * c).sum(), params)
    lp1, e1 = head.TargetLogprobs.apply(h, w, b, targets, post, chunk)
    assert lp1.dtype == torch.float32  # the head's outputs are fp32, like the plain path's `.float()` logits
    g1 = torch.autograd.grad((lp1.double() * a).sum() + (e1.double() * c).sum(), params)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    torch.testing.assert_close(e1, e0, rtol=0, atol=1e-5)
    for x, y in zip(g1, g0):  # both through fp32 logits: summation order apart, equal
        assert x.dtype == y.dtype and (x - y).abs().max() <= 1e-5 * y.abs().max()


def test_only_the_log_p_term_or_only_the_entropy_term():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(20, 8, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 20, (6,), generator=g)
    for pick in (0, 1):
        want = torch.autograd.grad(_plain(h, w, None, t, (1.0, None, 1.0))[pick].sum(), [h, w])
        got = torch.autograd.grad(head.TargetLogprobs.apply(h, w, None, t, (1.0, None, 1.0), 4)[pick].sum(), [h, w])
        for x, y in zip(got, want):
            assert (x - y).abs().max() <= 1e-5 * y.abs().max()


@pytest.fixture(scope="module")
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    assert head.install(m)
    return m


def _workload():
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 500, (9,), generator=g).tolist()
    seqs = [prompt + torch.randint(3, 500, (k,), generator=g).tolist() for k in (5, 8, 3, 8)]
    seqs[3][9:13] = seqs[1][9:13]  # a shared branch past the prompt, diverging later
    T = max(len(s) for s in seqs) - 1
    keep = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        keep[i, 8 : len(s) - 1] = True  # the completion, as a loss mask
    return seqs, T, keep


def test_packed_rows_through_the_chunked_head_equal_the_plain_head(model):
    """packing.logprobs with chunks of 4 vs the plain head: kept log p, entropy and every parameter's gradient."""
    seqs, T, keep = _workload()
    p = packing.pack(seqs, T)
    adv = torch.randn(keep.shape, generator=torch.Generator().manual_seed(3))

    ref, got = (
        logprobs_and_grads(model, p, keep, adv, chunk=0),
        logprobs_and_grads(model, p, keep, adv, chunk=4),
    )
    assert (got[0][~keep] == 0).all() and (got[1][~keep] == 0).all()
    assert_same(ref, got, keep)


def test_an_empty_selection_still_runs_every_layer_with_zero_weight(model):
    """A blank micro-batch (FSDP needs every rank to run the same passes): no position kept, zeros out, and a
    backward that reaches every parameter with a zero gradient."""
    seqs, T, keep = _workload()
    p = packing.pack(seqs, T)
    model.zero_grad(set_to_none=True)
    lp, _ = packing.logprobs(model, p, keep=torch.zeros_like(keep), chunk=4)
    assert (lp == 0).all()
    lp.sum().backward()
    assert all(q.grad is not None and (q.grad == 0).all() for q in model.parameters())


def test_verify_accepts_the_model_and_refuses_a_head_it_does_not_reproduce(model):
    assert head.verify(model, 1e-4) < 1e-5
    model.config.logits_scaling = 2.0  # a head-side scale the model's own forward does not apply (Qwen2)
    try:
        with pytest.raises(head.HeadUnsupported, match="Qwen2ForCausalLM"):
            head.verify(model, 1e-4)
    finally:
        del model.config.logits_scaling
    ids = torch.randint(3, 500, (1, 10))
    lp, _ = token_logprobs(model, ids, torch.ones_like(ids))  # the plain path is untouched by install
    assert lp.shape == (1, 9)


def test_a_second_backward_recomputes_what_the_first_turned_into_gradients():
    """Forward's log p are turned into gradients in place by the first backward: a second one (retain_graph)
    recomputes them and gets the same gradients."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(30, 8, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 30, (7,), generator=g)
    lp, _ = head.TargetLogprobs.apply(h, w, None, targets, (1.0, None, 1.0), 3)
    first = torch.autograd.grad(lp.sum(), (h, w), retain_graph=True)
    second = torch.autograd.grad(lp.sum(), (h, w))
    for x, y in zip(first, second):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
