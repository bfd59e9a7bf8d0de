"""The LM head for training: log p(target) and the entropy of chosen positions, over chunks of tokens.

The plain path materializes the logits of every scored position, [N, V] in fp32, then a log-softmax and (for the
entropy) its exp: three [N, V] fp32 tensors kept for backward. On a 152k vocabulary that is 1.8 GB per 1k tokens,
the peak of a micro-batch. Here the head runs `chunk` tokens at a time and keeps only h [N, H] and one logsumexp and
entropy per token; backward recomputes each chunk's logits (prime-rl's fused output linear is the pattern), unless
the call's log p fit in `KEEP_BYTES` (then they are kept from forward). The gradients are the plain path's
(tests/unit/test_head.py), at one extra head matmul per chunk in backward where they are recomputed.

    install(model)                          # after FSDP2 wraps the root (policy.shard_model does it)
    how = Scoring(temperature, with_entropy=True, chunk=1024)   # how to score: the sampling T, the entropy, chunks
    lp, ent = scored(model, ids, attention_mask=mask, position_ids=pos, rows=rows, cols=cols, targets=targets, how=how)

`scored` runs as an FSDP2 forward method (`register_fsdp_forward_method`), so the root's parameters (embeddings,
final norm, head) are gathered around it as around `forward`. The head-side arithmetic of the families nanosky
covers is applied per chunk (Granite's and Cohere's scale, Gemma's final soft-cap); `verify` checks at build that
the chunked head equals the model's own logits, and a model where it does not trains with the plain head.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch.distributed.fsdp import register_fsdp_forward_method

from nanosky.train.unwrap import base_model

METHOD = "nanosky_scored"


@dataclass(frozen=True)
class Scoring:
    """How target tokens are scored: at the sampling `temperature`, with the entropy (and its gradient: the entropy
    bonus), `chunk` tokens through the head at a time."""

    temperature: float = 1.0
    with_entropy: bool = False
    entropy_grad: bool = False
    chunk: int = 1024


SCORING = Scoring()


class Post(NamedTuple):
    """What the model does to the head's output, then the sampling temperature: logits · scale, soft-capped, / T."""

    scale: float
    softcap: float | None
    temperature: float


def _causal_lm(model):
    """The HF causal LM (inside a peft wrapper too)."""
    return base_model(model)


def install(model) -> bool:
    """Give `model` the `scored` forward method; False for a model without a decoder + output head."""
    hf = _causal_lm(model)
    if not hasattr(hf, "get_decoder") or getattr(hf, "get_output_embeddings", lambda: None)() is None:
        return False

    def method(self, input_ids, *, attention_mask, position_ids, rows, cols, targets, how: Scoring, **kw):
        h = hf.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kw
        ).last_hidden_state  # [R, L, H]
        head = hf.get_output_embeddings()
        post = Post(head_scale(hf.config), getattr(hf.config, "final_logit_softcapping", None), how.temperature)
        with torch.profiler.record_function("nanosky::head"):  # a part of its own in `--log.profile-step`'s traces
            lp, e = TargetLogprobs.apply(h[rows, cols], head.weight, head.bias, targets, post, how.chunk)
        return lp, (e if how.entropy_grad else e.detach()) if how.with_entropy else None

    setattr(model, METHOD, types.MethodType(method, model))
    register_fsdp_forward_method(model, METHOD)  # a no-op for a model FSDP does not wrap
    return True


def installed(model) -> bool:
    return hasattr(model, METHOD)


class HeadUnsupported(ValueError):
    """A model whose chunked head would not equal its own logits (the run then trains with the plain head)."""


def verify(model, tol: float) -> float:
    """The chunked head against the model's own forward on a probe (two random rows, every position, chunks of 7 so
    several run): the largest |Δ log p(target)|, or HeadUnsupported above `tol` (the model keeps the plain head:
    `uninstall`). Collective under FSDP: every rank runs it on the same probe."""
    cfg = _causal_lm(model).config
    device = next(model.parameters()).device
    ids = torch.randint(3, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)).to(device)
    att = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()  # [2, 23, V]
        want = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [2, 23]
        rows, cols = (x.reshape(-1) for x in torch.meshgrid(torch.arange(2), torch.arange(23), indexing="ij"))
        got, _ = scored(
            model,
            ids,
            attention_mask=att,
            position_ids=None,
            rows=rows.to(device),
            cols=cols.to(device),
            targets=ids[:, 1:].reshape(-1),
            how=Scoring(chunk=7),
        )
    worst = float((got.view(2, 23) - want).abs().max())
    if worst > tol:
        raise HeadUnsupported(
            f"the chunked LM head differs from {type(_causal_lm(model)).__name__}'s logits by {worst:.3g} (> {tol})"
        )
    return worst


def uninstall(model) -> None:
    """Back to the plain head (the model's own logits)."""
    if installed(model):
        delattr(model, METHOD)


def scored(
    model, input_ids, *, attention_mask, position_ids, rows, cols, targets, how: Scoring = SCORING, **kw
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) [N] (and the entropy [N]) at positions (rows[N], cols[N]) of the model's rows, each distinct
    (position, target) through the head once. `kw`: passed on to the decoder (prefix-grouped attention's segments)."""
    width = input_ids.shape[1]
    key = (rows * width + cols) * (int(targets.max()) + 1 if targets.numel() else 1) + targets
    uniq, inverse = torch.unique(key, return_inverse=True)  # shared-prefix positions are scored once
    first = torch.zeros_like(uniq).scatter_(0, inverse, torch.arange(len(key), device=key.device))
    how = dataclasses.replace(how, entropy_grad=how.entropy_grad and torch.is_grad_enabled())
    lp, ent = getattr(model, METHOD)(
        input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        rows=rows[first],
        cols=cols[first],
        targets=targets[first],
        how=how,
        **kw,
    )
    return lp[inverse], (ent[inverse] if ent is not None else None)


def scored_rows(
    model, input_ids, *, attention_mask, position_ids, valid, row, col, target, how: Scoring = SCORING, **kw
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`scored` in the [B, T] layout the losses use: position t of sequence b sits at (row[b, t], col[b, t]) of the
    model's rows and predicts target[b, t]; only `valid` [B, T] positions are scored, the others are 0."""
    rows, cols, targets = row[valid], col[valid], target[valid]  # [N]
    blank = rows.numel() == 0
    if blank:  # nothing scored (a blank pass): one position keeps every layer in the graph, with weight 0
        rows, cols, targets = (torch.zeros(1, dtype=torch.long, device=valid.device) for _ in range(3))
    lp_n, ent_n = scored(
        model,
        input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        rows=rows,
        cols=cols,
        targets=targets,
        how=how,
        **kw,
    )
    lp = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    ent = torch.zeros_like(lp) if how.with_entropy else None
    if blank:
        return lp + 0.0 * lp_n.sum(), ent
    at = valid.nonzero(as_tuple=True)  # row-major, as boolean indexing took them
    return lp.index_put(at, lp_n), (ent.index_put(at, ent_n) if how.with_entropy else None)


def head_scale(config) -> float:
    """What the causal LM multiplies its head's output by: Granite divides by `logits_scaling`, Cohere multiplies by
    `logit_scale`; 1 elsewhere."""
    return 1.0 / getattr(config, "logits_scaling", 1.0) * getattr(config, "logit_scale", 1.0)


def _logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, post: tuple):
    """One chunk's logits as the model computes them, in fp32, then the sampling temperature: z [n, V], and the
    soft-cap's tanh (for backward) or None. `post` = (scale, softcap, temperature)."""
    scale, softcap, temperature = post
    y = torch.nn.functional.linear(h, w, b).float()  # [n, V] (the head's matmul in the compute dtype)
    if scale != 1.0:
        y = y * scale
    t = None
    if softcap:
        t = torch.tanh(y / softcap)
        y = t * softcap
    return (y / temperature if temperature != 1.0 else y), t


KEEP_BYTES = 128 << 20
"""A head call whose [tokens, vocab] fp32 log p fit in this many bytes keeps them from forward to backward: the
backward's recompute of the logits (a third of the head's matmuls) is skipped. 512 scored tokens of a 49k
vocabulary (100 MB) are kept; 1024 of a 152k vocabulary (620 MB) are recomputed chunk by chunk."""


class TargetLogprobs(torch.autograd.Function):
    """(h [N, H], W [V, H], b [V] | None, targets [N]) -> log p(target) [N], entropy [N], chunk by chunk. Each chunk
    holds two [c, V] fp32 buffers at a time, updated in place."""

    @staticmethod
    def forward(ctx, h, w, b, targets, post, chunk):
        n = h.shape[0]
        chunk = chunk if chunk > 0 else max(n, 1)
        lp = torch.empty(n, dtype=torch.float32, device=h.device)
        ent, lse = torch.empty_like(lp), torch.empty_like(lp)
        # small enough (and no soft-cap, whose backward needs its tanh): backward reuses these log p, not a recompute
        keep = [] if n * w.shape[0] * 4 <= KEEP_BYTES and not post[1] else None
        with torch.no_grad():
            for s in range(0, n, chunk):
                e = slice(s, s + chunk)
                logp, _ = _logits(h[e], w, b, post)  # [c, V] z, made log p in place
                lse[e] = torch.logsumexp(logp, -1)
                logp -= lse[e, None]
                lp[e] = logp.gather(-1, targets[e, None]).squeeze(-1)
                # H = −Σ p log p (not lse − E_p[z]: no cancellation of two large terms)
                ent[e] = -logp.exp().mul_(logp).sum(-1)
                if keep is not None:
                    keep.append(logp)
        ctx.save_for_backward(h, w, b, targets, lse, ent)
        ctx.post, ctx.chunk, ctx.kept = post, chunk, keep
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not a tensor of zeros to multiply
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        h, w, b, targets, lse, ent = ctx.saved_tensors
        (scale, cap, T), chunk = ctx.post, ctx.chunk
        g_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        g_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if ctx.needs_input_grad[1] else None
        g_b = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if ctx.needs_input_grad[2] else None
        if g_lp is None and g_ent is None:
            return None, None, None, None, None, None
        kept, ctx.kept = ctx.kept, None  # used once (turned into gradients in place): a second backward recomputes
        for i, s in enumerate(range(0, h.shape[0], chunk)):
            e = slice(s, s + chunk)
            if kept is not None:
                g, t = kept[i], None  # forward's log p [c, V], turned into d loss / dz in place
            else:
                g, t = _logits(h[e], w, b, ctx.post)  # recomputed z: [c, V], turned into d loss / dz in place
                g -= lse[e, None]  # log p
            # d lp / dz = onehot(target) − p;   d H / dz = −p ⊙ (z − E_p[z]) = −p ⊙ (log p + H)
            # so d loss / dz = onehot · g_lp − p ⊙ (g_lp + g_ent ⊙ (log p + H))
            if g_ent is not None:
                p = g.exp()
                g.add_(ent[e, None]).mul_(g_ent[e, None])
                if g_lp is not None:
                    g.add_(g_lp[e, None])
                g.mul_(p.neg_())
                del p
            else:  # no entropy gradient (the common case): −p · g_lp, in place
                g.exp_().mul_(-g_lp[e, None])
            if g_lp is not None:
                g.scatter_add_(-1, targets[e, None], g_lp[e, None])
            if T != 1.0:
                g /= T
            if cap:  # through y = cap · tanh(y0 / cap)
                g.mul_(1 - t * t)
            if scale != 1.0:
                g *= scale
            g = g.to(h.dtype)  # [c, V]: d loss / d (h Wᵀ + b), in the head's compute dtype
            if g_h is not None:
                g_h[e] = g @ w
            if g_w is not None:
                if g.dtype == torch.float32:
                    g_w.addmm_(g.t(), h[e])
                else:  # bf16 inputs, fp32 sums over chunks (torch has no mixed-dtype addmm on every device)
                    g_w += (g.t() @ h[e]).float()
            if g_b is not None:
                g_b += g.float().sum(0)
        g_w = g_w.to(w.dtype) if g_w is not None else None
        return g_h, g_w, (g_b.to(b.dtype) if g_b is not None else None), None, None, None
