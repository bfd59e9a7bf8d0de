"""Shared-prefix packing: the trainer computes a prefix that several sequences share only once.

A GRPO group's samples share their prompt, multi-turn episodes share their opening, and the step-wise turns of one
group share the system prompt and task (the first turns of a group share the whole prompt). Packing turns the
sequences of a micro-batch into a few packed rows that hold each shared prefix once:

    seqs   [p p p a a]  [p p p b]  [p p p b c]          (B = 3 sequences, 14 tokens)
    packed [p p p a a b c]                              (1 row, 7 tokens: a trie of the sequences, in DFS order)
    pos    [0 1 2 3 4 3 4]                              (position ids: a token's position in its own sequence)

A token attends exactly to its ancestors in the trie (the prefix and its own branch), so every logit equals the
one the unpacked sequence gives, and the prefix receives the summed gradient of its branches. The per-token
outputs are gathered back to the [B, T] layout the losses use (`gather`), so nothing above or below changes: the
model sees `position_ids` and a 4-D attention mask (transformers hands it to attention as it is), with each sliding
layer's window applied and one mask per layer kind where kinds mix (`attention_mask`); `verify` checks at build
that packed equals unpacked on the model itself.

Rows are capped at `row_tokens`: SDPA computes a dense [L, L] score matrix whatever the mask, so one row for a
whole micro-batch would make attention quadratic in the micro-batch. Micro-batches can also be sized by tokens
(`plan_micro_batches`), counted after sharing, so a long-prompt workload fills each forward pass the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanosky import dist
from nanosky.train import constrain, head
from nanosky.train.grouped_attention import KWARG, Segments, enabled
from nanosky.train.grouped_attention import NAME as GROUPED
from nanosky.train.grouped_attention import NAME_SDPA as GROUPED_SDPA


@dataclass
class Packed:
    """Packed rows of B sequences, and where each sequence's tokens landed."""

    input_ids: torch.Tensor  # [R, Lp]
    position_ids: torch.Tensor  # [R, Lp]
    row: torch.Tensor  # [B, T] packed row of the token that predicts ids[b, t+1] (position t of sequence b)
    pos: torch.Tensor  # [B, T] its column in that row
    target: torch.Tensor  # [B, T] ids[b, t+1] (0 past the end)
    valid: torch.Tensor  # [B, T] bool, t+1 < len(ids[b])
    unique_tokens: int  # real tokens in the packed rows
    tokens: int  # Σ len(ids[b]): what the unpacked batch computes (without its padding)
    segments: Segments | None = None  # the rows by segment, for prefix-grouped attention (`grouped_attention`)
    tries: list | None = None  # per row: (owner, depth, lcps), what its ancestor mask is built from
    _mask: torch.Tensor | None = None

    @property
    def attention_mask(self) -> torch.Tensor:
        """[R, 1, Lp, Lp] bool, True = may attend: the rows' ancestor masks, built on first use on the rows' device
        (prefix-grouped attention never reads it: at rows of 8192 it was most of the packing's time)."""
        if self._mask is None:
            R, Lp = self.input_ids.shape
            device = self.input_ids.device
            mask = torch.zeros((R, 1, Lp, Lp), dtype=torch.bool, device=device)
            for r, (owner, depth, lcps) in enumerate(self.tries):
                n = len(owner)
                o, d = (torch.tensor(x, dtype=torch.long, device=device) for x in (owner, depth))
                mask[r, 0, :n, :n] = _ancestor_mask(o, d, lcps)
                pad = torch.arange(n, Lp, device=device)
                # padding sees itself only (an all-False row would give NaN in softmax)
                mask[r, 0, pad, pad] = True
            self._mask = mask
        return self._mask

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Per-packed-token values [R, Lp, ...] -> per-sequence [B, T, ...], zero where not `valid`."""
        out = x[self.row, self.pos]  # [B, T, ...]
        v = self.valid.view(*self.valid.shape, *([1] * (out.dim() - 2)))
        return torch.where(v, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def fill(seqs: list[list[int]], cap: float, share: bool) -> tuple[list[list[int]], list[list[int]]]:
    """Bins of `seqs` (rows of a pack, or micro-batches): in sorted order (sharers neighbours; `share` False: as
    given), each sequence adds its tokens past the longest common prefix with its predecessor in the bin, and opens a
    new bin where that would pass `cap` (a sequence longer than `cap` gets one to itself). Returns (the sequence
    indices per bin, each one's shared prefix length with its predecessor in the bin: 0 for a bin's first)."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i]) if share else list(range(len(seqs)))
    bins: list[list[int]] = []
    lcps: list[list[int]] = []
    used = 0
    for i in order:
        lcp = _lcp(seqs[bins[-1][-1]], seqs[i]) if share and bins else 0
        if not bins or used + len(seqs[i]) - lcp > cap:
            bins.append([]), lcps.append([])
            lcp, used = 0, 0
        bins[-1].append(i)
        lcps[-1].append(lcp)
        used += len(seqs[i]) - lcp
    return bins, lcps


def pack(
    seqs: list[list[int]],
    T: int,
    row_tokens: int | None = 1024,
    share: bool = True,
    pad_id: int = 0,
    device=None,
) -> Packed:
    """Pack `seqs` (each ≥ 1 token) into rows of at most max(row_tokens, longest sequence) tokens (None: one row).

    Sequences are sorted so that those sharing a prefix are neighbours; each one adds only its tokens past the
    longest common prefix with its predecessor in the row (`share=False`: all its tokens, i.e. plain padding-free
    packing with a block-diagonal causal mask). T is the width of the [B, T] outputs (≥ longest sequence − 1).
    """
    B = len(seqs)
    cap = max(row_tokens, max(len(s) for s in seqs)) if row_tokens is not None else float("inf")
    rows, lcps = fill(seqs, cap, share)
    lengths = [sum(len(seqs[i]) - lcp for i, lcp in zip(r, ls)) for r, ls in zip(rows, lcps)]
    R, Lp = len(rows), max(lengths)
    ids = torch.full((R, Lp), pad_id, dtype=torch.long)
    position = torch.zeros((R, Lp), dtype=torch.long)
    tries = []
    row_of = torch.zeros((B, T), dtype=torch.long)
    pos_of = torch.zeros((B, T), dtype=torch.long)
    target = torch.zeros((B, T), dtype=torch.long)
    valid = torch.zeros((B, T), dtype=torch.bool)
    segs: list[tuple[int, int, int, list[int]]] = []  # (row, start, length, ancestor columns) per member
    for r, (members, ls) in enumerate(zip(rows, lcps)):
        path: list[int] = []  # packed columns of the previous member's tokens
        owner, depth = [], []  # per packed token: the member (row-local) that emitted it, and its depth
        for j, (i, lcp) in enumerate(zip(members, ls)):
            s, start = seqs[i], len(owner)
            segs.append((r, start, len(s) - lcp, path[:lcp]))
            path = path[:lcp] + list(range(start, start + len(s) - lcp))
            owner += [j] * (len(s) - lcp)
            depth += range(lcp, len(s))
            ids[r, start : start + len(s) - lcp] = torch.tensor(s[lcp:], dtype=torch.long)
            n = len(s) - 1  # scored positions: t predicts s[t+1]
            row_of[i, :n] = r
            pos_of[i, :n] = torch.tensor(path[:n], dtype=torch.long)
            target[i, :n] = torch.tensor(s[1:], dtype=torch.long)
            valid[i, :n] = True
        tries.append((owner, depth, ls))
        position[r, : len(depth)] = torch.tensor(depth, dtype=torch.long)
    to = (lambda x: x.to(device)) if device is not None else (lambda x: x)
    return Packed(
        input_ids=to(ids),
        position_ids=to(position),
        row=to(row_of),
        pos=to(pos_of),
        target=to(target),
        valid=to(valid),
        unique_tokens=sum(lengths),
        tokens=sum(len(s) for s in seqs),
        segments=Segments(segs, R, Lp),
        tries=tries,
    )


def _ancestor_mask(owner: torch.Tensor, depth: torch.Tensor, lcps: list[int]) -> torch.Tensor:
    """[n, n] bool: packed token a may attend to b iff b is an ancestor of a (or a itself) in the row's trie.

    Token b, emitted by member j at depth d, is shared by members j..last(b): the run of following members whose
    common prefix with member j stays longer than d. (In sorted order the common prefix of members j and k is the
    minimum of the neighbour LCPs between them.) b is an ancestor of a iff a's emitting member is in that run and
    b is not deeper than a.
    """
    m = len(lcps)
    # [m] LCP of member j+1 with member j (-1 after the last)
    nxt = torch.tensor(lcps[1:] + [-1], device=owner.device)
    # run[j, k] = min(lcps[j+1..k]) for k > j, else -1: the prefix member j shares with member k
    run = torch.full((m, m), -1, dtype=torch.long, device=owner.device)
    for j in range(m - 1):
        run[j, j + 1 :] = torch.cummin(nxt[j : m - 1], 0).values
    last = owner + (run[owner] > depth[:, None]).sum(-1)  # [n]
    a_owner, a_depth = owner[:, None], depth[:, None]
    return (owner[None, :] <= a_owner) & (a_owner <= last[None, :]) & (depth[None, :] <= a_depth)


SLIDING, FULL = "sliding_attention", "full_attention"


FLOOR_FACTOR = 2.0
"""The build check's tolerance is the run's precision's (`nanosky.precision.BUILD_TOL`). A deep model's own bf16
rounding can exceed it: the check then allows FLOOR_FACTOR x the rounding it measures (`verify`).
How far above the model's own rounding (the same sequence computed in another shape) the packed forward may be.
On a random model shaped like Qwen2.5-7B in bf16 (H100): packed vs unpacked max 0.30-0.42, the same rows alone vs
right-padded 0.45-0.54, while a missed sliding window costs 2-3 (docs/experiments/speed.md)."""


class PackingUnsupported(ValueError):
    """A model whose packed forward would not equal its unpacked one (the run falls back to --optim.packing none)."""


def model_config(model):
    """The HF config of a causal LM (peft too) or of the critic's backbone."""
    return getattr(model, "config", None) or model.model.config


def attention_kinds(cfg) -> tuple[list[str], int | None]:
    """Each decoder layer's attention kind (`full_attention` / `sliding_attention`) and the sliding window. Models
    with mixed layers (Gemma 2 / 3) list them in `layer_types`; one with a window and no list (Mistral) slides in
    every layer; Qwen2's window counts only with `use_sliding_window`."""
    window = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", True) is False:
        window = None
    n = getattr(cfg, "num_hidden_layers", 0)
    kinds = list(getattr(cfg, "layer_types", None) or ([SLIDING if window else FULL] * n))
    if window is None:
        kinds = [FULL if k == SLIDING else k for k in kinds]
    return kinds, window


def check_attention(model) -> None:
    """Packing needs SDPA (a boolean 4-D mask) or eager attention (an additive one, `attention_mask` makes it), and
    attention kinds it can mask: full, or sliding with the window in the mask. Flash attention takes no 4-D mask
    and other kinds (chunked, linear, ...) would compute the wrong thing silently, so they are refused."""
    cfg = model_config(model)
    impl = getattr(cfg, "_attn_implementation", "sdpa")
    if impl not in ("sdpa", "eager", GROUPED, GROUPED_SDPA):
        raise PackingUnsupported(
            f"optim.packing needs attn_implementation 'sdpa' or 'eager', the model uses {impl!r}: "
            "use --optim.packing none"
        )
    odd = sorted(set(attention_kinds(cfg)[0]) - {FULL, SLIDING})
    if odd:
        raise PackingUnsupported(f"optim.packing cannot mask {odd} attention layers: use --optim.packing none")


def attention_mask(model, p: Packed) -> torch.Tensor | dict[str, torch.Tensor]:
    """The mask a packed forward passes: the trie's ancestor mask [R, 1, Lp, Lp], with each sliding layer's window
    applied along the token's own path (position ids restart per branch, so q − k is the distance within the
    sequence; HF's window admits q − k < window). Mixed layers get one mask per kind, as Gemma's forward takes
    them ({"full_attention": ..., "sliding_attention": ...}); transformers hands a 4-D mask to SDPA as it is,
    so without this a sliding layer would attend across its whole window."""
    cfg = model_config(model)
    kinds, window = attention_kinds(cfg)
    if enabled(model):  # grouped attention computes by segment and never reads the mask: a free stand-in
        R, Lp = p.input_ids.shape
        stand_in = torch.ones((), dtype=torch.bool, device=p.input_ids.device).expand(R, 1, Lp, Lp)
        return stand_in if set(kinds) != {FULL, SLIDING} else {FULL: stand_in, SLIDING: stand_in}
    # eager attention adds its mask to the scores: 0 where allowed, the most negative float elsewhere
    form = (lambda m: m) if getattr(cfg, "_attn_implementation", "sdpa") != "eager" else _additive
    if SLIDING not in kinds:
        return form(p.attention_mask)
    dist_ = p.position_ids[:, :, None] - p.position_ids[:, None, :]  # [R, Lp, Lp] q - k
    slide = p.attention_mask & (dist_ < window)[:, None]  # [R, 1, Lp, Lp]
    if set(kinds) == {SLIDING}:
        return form(slide)
    return {FULL: form(p.attention_mask), SLIDING: form(slide)}


def _additive(mask: torch.Tensor) -> torch.Tensor:
    """[R, 1, Lp, Lp] bool -> float: 0 where attending, float32's min elsewhere (as transformers' eager masks)."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return out.masked_fill(~mask, torch.finfo(torch.float32).min)


def verify(model, forward, tol: float) -> float:
    """Packed vs unpacked on a probe batch: three random sequences sharing a prefix, longer than the sliding window
    (up to the model's context), so a window the mask missed, or a soft-cap, embedding scale or norm the packed path
    skips, shows. `forward(ids, mask, position_ids) -> [R, L, ...]` is the per-token output under test: log-probs
    over the vocabulary (`lm_forward`), compared on the *target* tokens only (log p of each next token, what training
    uses; over 152k entries a single bf16 rounding flip at |logit| >= 16 is 0.125, though no trained number moves),
    or values, compared as they are. Returns the largest |difference|; raises PackingUnsupported above `tol`, or
    above FLOOR_FACTOR x the rounding the model shows on the same probe right-padded, where that is larger (a deep
    model in bf16: the packing is then as exact as the unpacked forward is with itself).
    Collective under FSDP: every rank runs it on the same probe."""
    check_attention(model)
    cfg = model_config(model)
    window = attention_kinds(cfg)[1]
    n = min(getattr(cfg, "max_position_embeddings", 256), max(48, (window or 0) + 24))
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, cfg.vocab_size, (n // 2,), generator=g).tolist()
    seqs = [prefix + torch.randint(3, cfg.vocab_size, (n - n // 2 - k,), generator=g).tolist() for k in (0, 3, 7)]
    p = pack(seqs, T=n - 1, device=device)
    worst, floor, pad = 0.0, 0.0, 8
    with torch.no_grad():
        packed = p.gather(forward(p.input_ids, attention_mask(model, p), p.position_ids, **segment_kwargs(model, p)))
        for i, s in enumerate(seqs):
            ids = torch.tensor([s], device=device)
            out = forward(ids, torch.ones_like(ids), None)[0, : len(s) - 1]  # [len - 1, ...]
            # the rounding floor: the same sequence right-padded, other kernel shapes for the same numbers. Computed
            # even where the packed gap is within `tol`: under FSDP each forward is collective, so every rank must
            # run the same forwards whatever its own gap says
            padded = torch.cat([ids, torch.zeros(1, pad, dtype=ids.dtype, device=device)], 1)
            alt = forward(padded, (torch.arange(len(s) + pad, device=device) < len(s)).long()[None], None)
            alt, mine = alt[0, : len(s) - 1], packed[i, : len(s) - 1]
            if out.ndim == 2 and out.shape[-1] == cfg.vocab_size:  # log-probs: the target tokens' only
                nxt = ids[0, 1:, None]  # [len - 1, 1]
                out, mine, alt = out.gather(-1, nxt), mine.gather(-1, nxt), alt.gather(-1, nxt)
            worst = max(worst, float((mine.float() - out.float()).abs().max()))
            floor = max(floor, float((alt.float() - out.float()).abs().max()))
    limit = max(tol, FLOOR_FACTOR * floor)
    if worst > limit:
        raise PackingUnsupported(
            f"packed and unpacked forwards differ by {worst:.3g} (> {limit:.3g}: the tolerance {tol}, or "
            f"{FLOOR_FACTOR:g}x the model's own rounding, {floor:.3g}) on {type(model).__name__}"
        )
    return worst


def lm_forward(model):
    """The causal LM's log-probs [R, L, V], the per-token output `verify` compares."""
    return lambda ids, mask, pos, **kw: torch.log_softmax(
        model(input_ids=ids, attention_mask=mask, position_ids=pos, **kw).logits.float(), -1
    )


def segment_kwargs(model, p: Packed) -> dict:
    """What a forward over `p`'s rows passes for prefix-grouped attention (nothing for a dense-mask model)."""
    return {KWARG: p.segments} if enabled(model) else {}


def logprobs(
    model,
    p: Packed,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    temperature: float = 1.0,
    keep: torch.Tensor | None = None,
    allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
    chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`policy.token_logprobs` on packed rows: log p(ids[b, t+1] | ids[b, ≤t]) [B, T] and the entropy [B, T].
    `chunk` > 0: through the chunked LM head (`nanosky.train.head`, never [tokens, vocab] in fp32) where the model
    has it; constrained turns (`allowed`) take the plain head, which they need whole.

    `keep` [B, T] bool: the positions whose values are wanted (the loss mask); the others come back 0. Only the
    packed columns some kept position sits in go through the LM head: a step-wise row scores ~5 action tokens
    after a ~250-token prompt, and the [V]-wide head and softmax on every prompt token cost ~10 % of the train
    phase there (bench/train_phase.py). `allowed` (positions [N, 2], bitmasks [N, W]): constrained positions, scored
    under their masks (`nanosky.train.constrain`); they must be kept positions."""
    check_attention(model)  # cheap; the full check (`verify`) ran at build
    if chunk > 0 and allowed is None and head.installed(model):
        valid = p.valid & keep if keep is not None else p.valid  # [B, T]: only the kept positions are scored
        how = head.Scoring(temperature, with_entropy, entropy_grad, chunk)
        return head.scored_rows(
            model,
            p.input_ids,
            attention_mask=attention_mask(model, p),
            position_ids=p.position_ids,
            valid=valid,
            row=p.row,
            col=p.pos,
            target=p.target,
            how=how,
            **segment_kwargs(model, p),
        )
    kw, col, valid = {}, p.pos, p.valid
    if keep is not None:
        valid = p.valid & keep
        cols = torch.unique(p.pos[valid])  # [K] sorted packed columns that any row needs
        if cols.numel() == 0:  # nothing scored (a blank pass): one column keeps every layer in the graph
            cols = torch.zeros(1, dtype=torch.long, device=p.pos.device)
        lut = torch.zeros(p.input_ids.shape[1], dtype=torch.long, device=p.pos.device)
        lut[cols] = torch.arange(len(cols), device=p.pos.device)
        kw, col = {"logits_to_keep": cols}, lut[p.pos]  # [B, T] index into the kept columns
    out = model(
        input_ids=p.input_ids,
        position_ids=p.position_ids,
        attention_mask=attention_mask(model, p),
        **kw,
        **segment_kwargs(model, p),
    )
    logits = out.logits.float()  # [R, Lp or K, V]
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)  # [R, Lp or K, V]
    lp = logp[p.row, col, p.target]  # [B, T]
    lp = torch.where(valid, lp, torch.zeros_like(lp))
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            e = -(logp.exp() * logp).sum(-1)[p.row, col]  # [R, Lp or K] -> [B, T]
            ent = torch.where(valid, e, torch.zeros_like(e))
    if allowed is not None:
        b, t = allowed[0].unbind(-1)
        lp, ent = constrain.apply(
            logits[p.row[b, t], col[b, t]], p.target[b, t], allowed, (b, t), lp, ent, entropy_grad
        )
    return lp, ent


def plan_micro_batches(seqs: list[list[int]], max_rows: int, max_tokens: int, share: bool) -> list[list[int]]:
    """Index lists of the micro-batches over `seqs`, the same number on every rank (a collective: FSDP needs every
    rank to run the same number of forward passes).

    `max_tokens` > 0: sequences in sorted order (sharers together) fill a micro-batch until its tokens after
    sharing would pass `max_tokens` (a longer sequence gets one to itself). Otherwise `max_rows` consecutive
    sequences each. A rank with fewer micro-batches splits its largest; one with too few sequences gets empty ones
    (the caller runs a zero-weight pass for those).
    """
    if max_tokens <= 0:
        plan = [list(range(i, min(i + max_rows, len(seqs)))) for i in range(0, len(seqs), max_rows)]
    else:
        plan = fill(seqs, max_tokens, share)[0]
    # Ranks may differ (token budgets, or rows skipped for having no advantage): equalise.
    want = int(dist.all_reduce_max([float(len(plan))])[0])
    while len(plan) < want:
        big = max(range(len(plan)), key=lambda k: len(plan[k]), default=None)
        if big is None or len(plan[big]) < 2:
            plan.append([])
            continue
        mb = plan.pop(big)
        plan[big:big] = [mb[: len(mb) // 2], mb[len(mb) // 2 :]]
    return plan
