"""Constrained actions: each turn is sampled from what the env admits only, and trained under the same masks.

With `--rollout.constrain-actions` the runner asks the task for its admissible actions before every turn
(`Env.action_constraint()`: webshop_lite's and alfworld_lite's `available_actions()`), and the engine samples the turn
under vLLM's structured outputs with `choice=actions` (the xgrammar backend): at each position only the tokens that
keep the reply a prefix of some admissible action (or, once one is complete, the end-of-turn token) can be drawn.
A 4M-parameter model that cannot copy a product id still picks among real products, and RL learns *which* action,
not how to spell it (the invalid-action rate is 0 by construction). Envs with no finite list of actions may give a
grammar instead (`Env.action_grammar()`): swe's turns are sampled as one well-formed call of its tools
(`envs.tools.tool_call_grammar`), so RL moves what the calls say, not their JSON syntax.

The policy being trained is then the masked distribution q(a_t | s) = p(a_t | s)·m_t / Σ_v p(v | s)·m_t(v), not p:
the engine's logprobs are log q (vLLM applies the grammar's bitmask before it computes them). So the trainer scores
the same tokens under the same masks: `ChoiceMasker.attach` replays every constrained turn's sampled ids through an
xgrammar matcher built exactly as vLLM builds its own (same tokenizer info, same grammar text), stores
the bitmask of each position on the batch, and `packing.logprobs` / `policy.token_logprobs` apply it before the
softmax. Ratios, KL, entropy and the engine-vs-trainer logprob check all see q (tests/test_constrain.py checks the
trainer's masked logprobs against the engine's to 1e-5).

Batch layout: `choice_pos` [N, 2] (row, t) of every constrained position, t in the [B, L-1] coordinates (position t
scores ids[t+1]); `choice_bits` [N, ceil(V/32)] int32, xgrammar's bitmask (bit v of a row set = token v allowed).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nanosky.agent.trajectory import Trajectory


def choice_grammar(choices: list[str]) -> str:
    """The EBNF grammar vLLM compiles for `choice=choices` (its own helper, so the trainer's matcher is the engine's)."""
    from vllm.v1.structured_output.utils import choice_as_grammar

    return choice_as_grammar(list(choices))


class ChoiceMasker:
    """Per-position allowed-token bitmasks of constrained turns, built as vLLM's xgrammar backend builds them. A
    turn's rule is a list of choices or an EBNF grammar (a str), as `Trajectory.constraints` holds it."""

    def __init__(self, tokenizer, vocab_size: int, cache: int = 4096):
        import xgrammar as xgr

        self.xgr, self.vocab_size, self.eos = xgr, vocab_size, tokenizer.eos_token_id
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=[self.eos])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, ...] | str, object] = OrderedDict()  # rule -> compiled grammar (LRU)
        self._max = cache

    def _compiled(self, rule: tuple[str, ...] | str):
        g = self._cache.get(rule)
        if g is None:
            text = rule if isinstance(rule, str) else choice_grammar(list(rule))
            g = self._cache[rule] = self.compiler.compile_grammar(text)
            if len(self._cache) > self._max:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(rule)
        return g

    def turn_bits(self, rule: list[str] | str, ids: list[int]) -> torch.Tensor:
        """[len(ids), W] int32: the bitmask each sampled id of one turn was drawn under (`rule`: its choices or its
        grammar). Raises if an id was not allowed (the turn was not sampled under this rule)."""
        xgr = self.xgr
        matcher = xgr.GrammarMatcher(self._compiled(rule if isinstance(rule, str) else tuple(rule)))
        bits = xgr.allocate_token_bitmask(max(len(ids), 1), self.vocab_size)[: len(ids)]
        for k, tok in enumerate(ids):
            matcher.fill_next_token_bitmask(bits, k)
            if not matcher.accept_token(tok):
                raise ValueError(f"token {tok} at position {k} of a constrained turn is outside its rule")
        return bits

    def attach(self, batch, rows: list[Trajectory | None]) -> None:
        """Set `batch.choice_pos` / `choice_bits` from the rows' `constraints` (None rows are padding)."""
        pos, bits = [], []
        for i, t in enumerate(rows):
            for start, rule in t.constraints if t is not None else ():
                n = _turn_len(t.loss_mask, start)
                b = self.turn_bits(rule, t.ids[start : start + n])
                pos += [(i, start - 1 + k) for k in range(n)]  # id at `start + k` is scored at position start-1+k
                bits.append(b)
        dev = batch.loss_mask.device
        batch.choice_pos = torch.tensor(pos, dtype=torch.long, device=dev).reshape(-1, 2)
        W = (self.vocab_size + 31) // 32
        batch.choice_bits = (torch.cat(bits) if bits else torch.zeros(0, W, dtype=torch.int32)).to(dev)


def _turn_len(loss_mask: list[int], start: int) -> int:
    n = 0
    while start + n < len(loss_mask) and loss_mask[start + n]:
        n += 1
    return n


def unpack(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, W] int32 bitmask -> [N, vocab] bool (bit j of word w = token 32·w + j)."""
    shifts = torch.arange(32, device=bits.device, dtype=torch.int32)
    return (((bits[:, :, None] >> shifts) & 1) != 0).reshape(bits.shape[0], -1)[:, :vocab]


def masked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, allowed: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log q(target) and the entropy of q, q = softmax(logits) renormalised over `allowed`. logits [N, V] (float),
    targets [N], allowed [N, V] bool."""
    logq = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)  # [N, V]
    lp = logq.gather(-1, targets[:, None]).squeeze(-1)
    ent = None
    if with_entropy:
        p = logq.exp()
        ent = -(p * logq.masked_fill(~allowed, 0.0)).sum(-1)
    return lp, ent


def apply(
    logits: torch.Tensor,
    targets: torch.Tensor,
    allowed: tuple[torch.Tensor, torch.Tensor],
    at: tuple[torch.Tensor, torch.Tensor],
    lp: torch.Tensor,
    ent: torch.Tensor | None,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`lp` / `ent` [B, T] with the positions `at` (rows, columns) rescored under their masks. logits [N, V] at those
    positions, targets [N]."""
    ok = unpack(allowed[1], logits.shape[-1])
    mlp, ment = masked_logprobs(logits, targets, ok, ent is not None)
    lp = lp.index_put(at, mlp)
    if ent is not None:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = ent.index_put(at, ment if entropy_grad else ment.detach())
    return lp, ent


def slice_rows(pos: torch.Tensor, bits: torch.Tensor, idx, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of rows `idx` (a slice or index list, as `Batch.slice` takes), rows renumbered."""
    new = torch.full((n_rows,), -1, dtype=torch.long)
    rows = torch.arange(n_rows)[idx]
    new[rows] = torch.arange(len(rows))
    keep = new[pos[:, 0].cpu()] >= 0 if len(pos) else torch.zeros(0, dtype=torch.bool)
    keep = keep.to(pos.device)
    out = pos[keep].clone()
    out[:, 0] = new.to(pos.device)[out[:, 0]]
    return out, bits[keep]
