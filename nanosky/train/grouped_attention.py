"""Prefix-grouped attention for packed rows: attention by segment, not by a dense [Lp, Lp] mask.

A packed row (`nanosky.train.packing`) is a trie of sequences in DFS order: each member adds one contiguous segment,
its tokens past the prefix it shares with the member before it. A token attends to its ancestors, so a segment's
queries attend to [its ancestors' keys; its own keys], causally aligned bottom-right:

    row      [p p p a a | b | c]       segments: (p p p a a) over itself; (b) over p p p + b; (c) over p p p b + c
    dense    one [7, 7] score matrix under a mask (what SDPA computes whatever the mask holds)
    grouped  [5, 5] + [1, 4] + [1, 5] scores: each shared prompt once, each completion over prompt + itself

The idea is PrefixGrouper's (and verl PR #4368's). Registered as a transformers attention function (the
AttentionInterface, no patching): `enable(model)` switches a model to it, and a forward given
`nanosky_segments=` (the `Packed.segments` of its rows) computes by segment; any other forward (unpacked rows,
generation, the probe) runs transformers' own SDPA. Sliding windows are applied per segment from the depths.
Soft-capped attention (Gemma 2) trains with eager attention and never reaches this.

On CUDA in bf16/fp16 every segment of a micro-batch goes through one flash varlen call per layer
(`torch.nn.attention.varlen.varlen_attn`): the queries of all segments packed end to end, each over its own keys
(ancestors then itself, gathered), causal aligned bottom-right, the window as flash's left window. Where this
torch has no varlen kernel, each segment is one SDPA call with the bottom-right causal bias (flash too, but one
launch per segment). On the CPU a group's completions go through one padded call per layer: call by call they were
1.2-1.3x slower than the dense mask; batched, the default since 2026-12-07, they train 8-14 % faster than it on a
Zen 4 (docs/experiments/speed.md). In bf16 the short calls skip torch's CPU flash kernel (`scores_attention`).
"""

from __future__ import annotations

import functools
import inspect
from typing import NamedTuple

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from nanosky.train.unwrap import base_model

NAME = "nanosky_grouped"
NAME_SDPA = NAME + "_sdpa"  # the same, one SDPA call per segment on CUDA too (the varlen kernel never)
KWARG = "nanosky_segments"


class Segments:
    """The segments of packed rows: (row, start column, length, ancestor columns) each, in row order and, within a
    row, in column order (they tile the row's real tokens). Plans are built once per device and window."""

    def __init__(self, segs: list[tuple[int, int, int, list[int]]], rows: int, width: int):
        self.segs, self.rows, self.width = [s for s in segs if s[2] > 0], rows, width
        self._plans: dict = {}

    def _cached(self, key: tuple, build):
        """A plan built once per key (every layer of a forward asks for the same one)."""
        if key not in self._plans:
            self._plans[key] = build()
        return self._plans[key]

    def plan(self, device, window: int | None) -> tuple[list[_Single], list[_Batch]]:
        """The SDPA calls for this device and window: segments run one by one, and batches of segments."""
        return self._cached((str(device), window), lambda: _plan(self.segs, device, window))

    def varlen(self, device) -> _Varlen:
        """Every segment in one varlen call: where its queries and keys sit in the rows, and their offsets."""
        return self._cached((str(device), "varlen"), lambda: _varlen_plan(self.segs, device))


class _Single(NamedTuple):
    """One segment, one call: query columns start..start+n of `row` over key columns `kv` [Lk]."""

    row: int
    start: int
    n: int
    kv: torch.Tensor  # [Lk] long
    mask: torch.Tensor | None  # [n, Lk] bool, or None: causal (square: is_causal; else bottom-right)


class _Batch(NamedTuple):
    """Segments of similar length in one call, padded: S queries of n tokens over Lk keys each."""

    rows: torch.Tensor  # [S, 1] long: each segment's packed row
    q: torch.Tensor  # [S, n] long: its query columns (padding repeats the last)
    kv: torch.Tensor  # [S, Lk] long: its key columns, ancestors then its own (padding repeats the last)
    mask: torch.Tensor  # [S, 1, n, Lk] bool: causal bottom-right (and the window); padded keys masked
    real: torch.Tensor  # [S, n] bool: the query slots holding a real token


class _Varlen(NamedTuple):
    """All segments end to end: segment s's queries are q[cu_q[s]:cu_q[s+1]], its keys k[cu_k[s]:cu_k[s+1]]."""

    q_rows: torch.Tensor  # [Nq] long: each query's row (the segments tile the rows' real tokens)
    q_cols: torch.Tensor  # [Nq] long: its column
    k_rows: torch.Tensor  # [Nk] long: each key's row (a segment's keys: its ancestors' columns, then its own)
    k_cols: torch.Tensor  # [Nk] long
    cu_q: torch.Tensor  # [S + 1] int32
    cu_k: torch.Tensor  # [S + 1] int32
    max_q: int
    max_k: int


def _varlen_plan(segs, device) -> _Varlen:
    q_rows, q_cols, k_rows, k_cols, cu_q, cu_k = [], [], [], [], [0], [0]
    for r, start, n, anc in segs:
        own = list(range(start, start + n))
        q_rows += [r] * n
        q_cols += own
        k_rows += [r] * (len(anc) + n)
        k_cols += anc + own
        cu_q.append(cu_q[-1] + n)
        cu_k.append(cu_k[-1] + len(anc) + n)
    t = lambda x, dt=torch.long: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
    max_q = max((n for _, _, n, _ in segs), default=0)
    max_k = max((len(anc) + n for _, _, n, anc in segs), default=0)
    return _Varlen(t(q_rows), t(q_cols), t(k_rows), t(k_cols), t(cu_q, torch.int32), t(cu_k, torch.int32), max_q, max_k)


def varlen_kernel():
    """torch's flash varlen attention (CUDA; torch >= 2.9), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def use_varlen(query: torch.Tensor) -> bool:
    """The varlen kernel is flash's: CUDA, half precision."""
    return query.is_cuda and query.dtype in (torch.bfloat16, torch.float16)


@functools.cache
def _parameters(kernel) -> frozenset[str]:
    """The keyword names a kernel takes (read once: the attention runs per layer and micro-batch)."""
    return frozenset(inspect.signature(kernel).parameters)


def varlen_kwargs(kernel, window: int | None, scaling: float | None, head_dim: int) -> dict | None:
    """What this torch's varlen kernel takes for causal attention (within `window`), or None where it cannot say it.
    A window of w keeps keys with q - k < w (transformers' convention): flash's left window w - 1."""
    params = _parameters(kernel)
    if head_dim > 256:  # flash's limit (Gemma 4's global layers): one SDPA call per segment
        return None
    if "window_size" in params:
        kw = {"window_size": (window - 1 if window else -1, 0)}
    elif "is_causal" in params and window is None:
        kw = {"is_causal": True}
    else:
        return None
    if "scale" in params:
        kw["scale"] = scaling
    elif scaling is not None and abs(scaling * head_dim**0.5 - 1) > 1e-6:
        return None
    return kw


def _varlen_attention(kernel, kw: dict, plan: _Varlen, query, key, value):
    """query [R, H, Lp, d], key / value [R, Hkv, Lp, d] -> [R, Lp, H, d] through one varlen call."""
    R, H, L, d = query.shape
    qt, kt, vt = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [R, Lp, H(kv), d]
    q = qt[plan.q_rows, plan.q_cols]  # [Nq, H, d]
    k, v = kt[plan.k_rows, plan.k_cols], vt[plan.k_rows, plan.k_cols]  # [Nk, Hkv, d]
    if k.shape[1] != H and "enable_gqa" in _parameters(kernel):
        kw = kw | {"enable_gqa": True}
    elif k.shape[1] != H:  # a torch without it (2.11): the keys' heads repeated for the queries'
        k, v = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // v.shape[1], 1)
    out = kernel(q, k, v, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, **kw)  # [Nq, H, d]
    return query.new_zeros(R, L, H, d).index_put((plan.q_rows, plan.q_cols), out)


def _mask(depth0: int, n: int, lk: int, window: int | None, device) -> torch.Tensor:
    """[n, lk] bool: queries at depths depth0.. over keys at depths 0..lk-1, causal (and within the window)."""
    qd = torch.arange(depth0, depth0 + n, device=device)[:, None]
    kd = torch.arange(lk, device=device)[None]
    mask = kd <= qd
    if window is not None:
        mask &= qd - kd < window  # as transformers' sliding mask: q − k < window
    return mask


def _plan(segs, device, window: int | None) -> tuple[list[_Single], list[_Batch]]:
    """A row's first member (no ancestors) runs alone, square-causal (SDPA's is_causal skips the upper blocks). On
    CUDA each other segment runs alone too, bottom-right causal, which keeps the flash kernel; elsewhere they run
    in batches by length (a power-of-two bucket each), so a GRPO group's completions are one call per layer, not
    one each: on the CPU each call's overhead and its index's backward cost more than the scores saved."""
    singles, buckets = [], {}
    for r, start, n, anc in segs:
        if not anc or device.type == "cuda":
            kv = torch.tensor(anc + list(range(start, start + n)), dtype=torch.long, device=device)
            square = not anc
            mask = (
                None
                if window is None and (square or device.type == "cuda")
                else _mask(len(anc), n, len(kv), window, device)
            )
            singles.append(_Single(r, start, n, kv, mask))
        else:
            buckets.setdefault((n - 1).bit_length(), []).append((r, start, n, anc))
    batches = []
    for members in buckets.values():
        n = max(m[2] for m in members)
        lk = max(len(m[3]) + m[2] for m in members)
        rows, q, kv, mask, real = [], [], [], [], []
        for r, start, k, anc in members:
            own = list(range(start, start + k))
            rows.append([r])
            q.append(own + [own[-1]] * (n - k))
            cols = anc + own
            kv.append(cols + [cols[-1]] * (lk - len(cols)))
            m = torch.zeros(n, lk, dtype=torch.bool, device=device)
            m[:k, : len(cols)] = _mask(len(anc), k, len(cols), window, device)
            m[k:, 0] = True  # a padded query attends to one key (an empty row would be NaN); its output is dropped
            mask.append(m)
            real.append([True] * k + [False] * (n - k))
        t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        batches.append(_Batch(t(rows), t(q), t(kv), torch.stack(mask)[:, None], torch.tensor(real, device=device)))
    return singles, batches


SCORES_BYTES = 4 << 20
"""The most fp32 scores one half-precision CPU attention call materialises ([S, H, n, Lk]; kept for backward, with
fp32 copies of q, k, v): a GRPO group's completions over a short prompt (SmolLM2, 8 prompts of the math shape) take
1.5-3 MB a layer. Longer calls (a 400-token agent prompt, 32 prompts' micro-batches) go to SDPA: materialised, they
added 0.5 GiB to a rank's peak and saved no time (docs/experiments/speed.md). In fp32 every call goes to SDPA, whose
CPU kernel was level or faster there."""
HALF = (torch.bfloat16, torch.float16)


def fits_scores(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether a call's fp32 scores fit `SCORES_BYTES`."""
    S, H, n, _ = q.shape
    return S * H * n * k.shape[2] * 4 <= SCORES_BYTES


def scores_attention(q, k, v, mask: torch.Tensor | None, causal: bool, scale: float | None) -> torch.Tensor:
    """SDPA's result, computed in fp32 with the [S, H, n, Lk] scores materialised: q [S, H, n, d] over k / v
    [S, Hkv, Lk, d] (a key head serves H / Hkv query heads, as SDPA's `enable_gqa`), `mask` bool broadcastable to
    [S, 1, n, Lk] (True: attend), `causal` square (top-left). For the short calls grouped attention makes on the CPU in
    bf16: torch's CPU flash kernel runs their backward 2-3x slower (1 thread; docs/experiments/speed.md). Scores,
    softmax and the weighted sum in fp32, as flash keeps them; the output in q's dtype."""
    S, H, n, d = q.shape
    Hkv, lk = k.shape[1], k.shape[2]
    scale = d**-0.5 if scale is None else scale
    s = (q.float().reshape(S, Hkv, H // Hkv * n, d) @ k.float().transpose(-1, -2)).view(S, Hkv, -1, n, lk)
    if causal:
        mask = torch.ones(n, lk, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        s = s.masked_fill(~(mask if mask.dim() < 4 else mask[:, :, None]), float("-inf"))
    w = (s * scale).softmax(-1).view(S, Hkv, -1, lk)
    return (w @ v.float()).view(S, H, n, d).to(q.dtype)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, varlen: bool = True, **kwargs):
    """transformers' attention signature: query [R, H, Lp, d], key / value [R, Hkv, Lp, d] -> ([R, Lp, H, d], None).
    `varlen` False (registered as NAME_SDPA): one SDPA call per segment on CUDA too, never the varlen kernel."""
    segments: Segments | None = kwargs.pop(KWARG, None)
    if segments is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    from torch.nn.attention.bias import CausalBias, causal_lower_right

    # the layer's window: what transformers passes for this call (None on a full-attention layer, where some
    # families, EXAONE 4, still keep the config's window on the module); else the module's
    window = kwargs["sliding_window"] if "sliding_window" in kwargs else getattr(module, "sliding_window", None)
    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    kernel = varlen_kernel() if varlen and use_varlen(query) and p == 0.0 else None
    kw = varlen_kwargs(kernel, window, scaling, query.shape[-1]) if kernel is not None else None
    if kw is not None:
        return _varlen_attention(kernel, kw, segments.varlen(query.device), query, key, value), None

    def call(q, k, v, bias, causal):
        if not q.is_cuda and q.dtype in HALF and p == 0.0 and not isinstance(bias, CausalBias) and fits_scores(q, k):
            return scores_attention(q, k, v, bias, causal, scaling)
        return sdpa(q, k, v, attn_mask=bias, dropout_p=p, is_causal=causal, scale=scaling, enable_gqa=gqa)

    singles, batches = segments.plan(query.device, window)
    rows, cols, vals = [], [], []  # where each computed token's output goes: [N] row, [N] column, [N, H, d]
    for r, start, n, kv, mask in singles:
        q = query[r : r + 1, :, start : start + n]  # [1, H, n, d]
        k, v = key[r : r + 1, :, kv], value[r : r + 1, :, kv]  # [1, Hkv, Lk, d]
        causal = mask is None and len(kv) == n  # no ancestors
        bias = mask if mask is not None or causal else causal_lower_right(n, len(kv))
        vals.append(call(q, k, v, bias, causal)[0].transpose(0, 1))  # [n, H, d]
        rows.append(torch.full((n,), r, dtype=torch.long, device=query.device))
        cols.append(torch.arange(start, start + n, device=query.device))
    qt, kt, vt = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [R, Lp, H(kv), d]
    for b in batches:
        q = qt[b.rows, b.q].transpose(1, 2)  # [S, H, n, d]
        k, v = kt[b.rows, b.kv].transpose(1, 2), vt[b.rows, b.kv].transpose(1, 2)  # [S, Hkv, Lk, d]
        out = call(q, k, v, b.mask, False).transpose(1, 2)  # [S, n, H, d]
        vals.append(out[b.real])  # [N_b, H, d]
        rows.append(b.rows.expand_as(b.q)[b.real])
        cols.append(b.q[b.real])
    R, H, L, d = query.shape
    out = query.new_zeros(R, L, H, d).index_put((torch.cat(rows), torch.cat(cols)), torch.cat(vals))
    return out, None  # [R, Lp, H, d]; padding columns stay 0


def register() -> None:
    """Make NAME a transformers attention implementation (its masks, for unsegmented forwards, are SDPA's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionInterface.register(NAME_SDPA, functools.partial(attention, varlen=False))
    for name in (NAME, NAME_SDPA):
        AttentionMaskInterface.register(name, sdpa_mask)


def enable(model, varlen: bool = True) -> bool:
    """Switch an SDPA model (peft-wrapped too) to grouped attention, through the varlen kernel where the device has
    it (`varlen` False: one SDPA call per segment, as bench/gpu_check.py compares); False (unchanged) for other
    implementations."""
    hf = base_model(model)
    if getattr(hf.config, "_attn_implementation", None) not in ("sdpa", NAME, NAME_SDPA):
        return False
    register()
    hf.set_attn_implementation(NAME if varlen else NAME_SDPA)
    return True


def disable(model) -> None:
    """Back to transformers' SDPA with the dense mask."""
    if enabled(model):
        hf = base_model(model)
        hf.set_attn_implementation("sdpa")


def enabled(model) -> bool:
    hf = base_model(model)
    return getattr(getattr(hf, "config", None), "_attn_implementation", None) in (NAME, NAME_SDPA)
