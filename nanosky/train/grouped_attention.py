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
Soft-capped attention (Gemma 2) trains with eager attention and never reaches this. On CUDA a segment without a
window goes through SDPA's bottom-right causal bias, which keeps the flash kernel (a boolean mask would not).
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

NAME = "nanosky_grouped"
KWARG = "nanosky_segments"


class Segments:
    """The segments of packed rows: (row, start column, length, ancestor columns) each, in row order and, within a
    row, in column order (they tile the row's real tokens). Index tensors are built once per device and window."""

    def __init__(self, segs: list[tuple[int, int, int, list[int]]], rows: int, width: int):
        self.segs, self.rows, self.width = [s for s in segs if s[2] > 0], rows, width
        self._plans: dict = {}

    def plan(
        self, device, window: int | None
    ) -> list[tuple[int, int, int, torch.Tensor, torch.Tensor | None]]:
        """(row, start, n, kv columns [Lk], mask [n, Lk] bool or None) per segment."""
        key = (str(device), window)
        if key not in self._plans:
            out = []
            for r, start, n, anc in self.segs:
                kv = torch.tensor(anc + list(range(start, start + n)), dtype=torch.long, device=device)
                # None: a square causal segment (a row's first member: SDPA's is_causal skips the upper blocks), or
                # on CUDA bottom-right causal (the flash kernel takes it); otherwise an explicit mask
                mask = None
                if window is not None or (anc and device.type != "cuda"):
                    qd = torch.arange(len(anc), len(anc) + n, device=device)[:, None]  # query depths
                    kd = torch.arange(len(kv), device=device)[None]  # key depths: ancestors, then own
                    mask = kd <= qd
                    if window is not None:
                        mask &= qd - kd < window  # as transformers' sliding mask: q − k < window
                out.append((r, start, n, kv, mask))
            self._plans[key] = out
        return self._plans[key]


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention signature: query [R, H, Lp, d], key / value [R, Hkv, Lp, d] -> ([R, Lp, H, d], None)."""
    segments: Segments | None = kwargs.pop(KWARG, None)
    if segments is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    from torch.nn.attention.bias import causal_lower_right

    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    rows: list[list[torch.Tensor]] = [[] for _ in range(segments.rows)]
    for r, start, n, kv, mask in segments.plan(query.device, window):
        q = query[r : r + 1, :, start : start + n]  # [1, H, n, d]
        k, v = key[r : r + 1, :, kv], value[r : r + 1, :, kv]  # [1, Hkv, Lk, d]
        causal = mask is None and len(kv) == n  # no ancestors
        bias = mask if mask is not None or causal else causal_lower_right(n, len(kv))
        out = sdpa(q, k, v, attn_mask=bias, dropout_p=p, is_causal=causal, scale=scaling, enable_gqa=gqa)
        rows[r].append(out)
    L = query.shape[2]
    out = []
    for parts in rows:  # each row: its segments in column order, zeros for the padding after them
        filled = sum(x.shape[2] for x in parts)
        pad = query.new_zeros(1, query.shape[1], L - filled, query.shape[3])
        out.append(torch.cat([*parts, pad], dim=2))
    return torch.cat(out).transpose(1, 2).contiguous(), None  # [R, Lp, H, d]


def register() -> None:
    """Make NAME a transformers attention implementation (its masks, for unsegmented forwards, are SDPA's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def enable(model) -> bool:
    """Switch an SDPA model (peft-wrapped too) to grouped attention; False (unchanged) for other implementations."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(hf.config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    hf.set_attn_implementation(NAME)
    return True


def disable(model) -> None:
    """Back to transformers' SDPA with the dense mask."""
    if enabled(model):
        hf = model.get_base_model() if hasattr(model, "get_base_model") else model
        hf.set_attn_implementation("sdpa")


def enabled(model) -> bool:
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(getattr(hf, "config", None), "_attn_implementation", None) == NAME
