"""Shared by the tests that prove a packed path equal to its reference: one loss's log p, entropy and every
parameter's gradient through `packing.logprobs`, and their comparison."""

from nanosky.train import packing


def logprobs_and_grads(model, p, keep, adv, **kw):
    """log p and entropy [B, T] of packed rows `p` (only `keep` scored), and every parameter's gradient of
    Σ (log p · adv + 0.1 · entropy) over `keep`."""
    model.zero_grad(set_to_none=True)
    lp, ent = packing.logprobs(model, p, True, True, keep=keep, **kw)
    ((lp * adv + 0.1 * ent) * keep).sum().backward()
    return lp.detach(), ent.detach(), {n: q.grad.clone() for n, q in model.named_parameters()}


def assert_same(ref, got, keep, tol: float = 1e-5) -> None:
    """Kept log p and entropy within `tol`; every gradient non-zero in `ref` and within `tol` of its scale."""
    (lp0, e0, g0), (lp1, e1, g1) = ref, got
    assert (lp0 - lp1)[keep].abs().max() < tol and (e0 - e1)[keep].abs().max() < tol
    for n in g0:
        scale = g0[n].abs().max()
        assert scale > 0, n  # every parameter gets a gradient, so the comparison means something
        assert (g0[n] - g1[n]).abs().max() <= tol * scale, n
