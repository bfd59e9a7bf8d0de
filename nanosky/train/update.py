"""The policy update: `PolicyUpdate(cfg.optim, cfg.algorithm, model)` owns the optimizer, the LR schedule and the
loss; calling it on a batch runs `ppo_epochs × mini_batches` optimizer steps.

The loss of each micro-batch is `agg_loss(micro) · agg_scale(...)`, so summing micro-batches and ranks gives exactly
the global mini-batch's `agg_loss`; FSDP averages gradients over ranks, hence the extra `× world`. The gradient is
the same for any micro-batch size or world size (tests/test_update.py checks it). The critic (`nanosky.train.critic`)
steps through the same `minibatches`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator

import torch
from torch.distributed.tensor import DTensor

import algos
from algos import AlgoConfig
from nanosky import dist
from nanosky.config.model import OptimConfig
from nanosky.train import grouped_attention, head, packing
from nanosky.train.batch import Batch, micro_slices, signal_rows
from nanosky.train.lora import trainable_parameters
from nanosky.train.policy import accumulate, token_logprobs
from nanosky.train.tracer import Tracer


def train_perf(upd: dict[str, float], n_params: int, seconds: float) -> dict[str, float]:
    """Training throughput from `PolicyUpdate`'s token counts: tokens the policy's passes computed per second
    (a shared prefix counts once), the fraction packing saved, and model FLOP/s as 6·N·tokens / time."""
    if "tokens_computed" not in upd:  # PPO's critic warm-up: no policy step
        return {}
    done, unpacked = upd["tokens_computed"], upd["tokens_unpacked"]
    return {
        "perf/train_tokens_per_s": done / seconds,
        "perf/prefix_saved_frac": 1 - done / max(unpacked, 1.0),
        "perf/train_tflops": 6 * n_params * done / seconds / 1e12,
    }


def row_ids(b: Batch) -> list[list[int]]:
    """Each row's token ids without padding."""
    return [row[:n].tolist() for row, n in zip(b.input_ids, b.attention_mask.sum(-1).tolist())]


def micro_batches(b: Batch, optim: OptimConfig) -> list[tuple[list[int], Batch]]:
    """`b` in micro-batches, as (row indices, rows) (`packing.plan_micro_batches`: the same number on every rank).
    A rank left with too few rows gets blank ones (`blank`, no indices) for its extra passes."""
    plan = packing.plan_micro_batches(
        row_ids(b), optim.micro_batch_size, optim.micro_batch_tokens, optim.packing == "prefix"
    )
    return [(ix, b.slice(ix) if ix else blank(b)) for ix in plan]


def blank(b: Batch) -> Batch:
    """A one-row micro-batch with nothing to learn: every mask 0, so its loss and gradient are exactly 0. It keeps
    FSDP's collectives in step on a rank with fewer micro-batches than the others."""
    m = b.slice([0])
    m.loss_mask, m.row_mask = torch.zeros_like(m.loss_mask), torch.zeros_like(m.row_mask)
    return m


def logprobs(
    model, m: Batch, optim: OptimConfig, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, int, packing.Packed | None]:
    """Logprobs (and entropy) of a micro-batch's tokens, [b, T], through the configured `optim.packing`. Also
    returns T and the packed rows (None when not packed). Packed, only the loss mask's positions are scored (the
    others are 0): every consumer (losses, KL, rollout correction, metrics) reads them through that mask."""
    ids, att, T = m.inputs()
    allowed = m.allowed(T)  # constrained turns (--rollout.constrain-actions): scored under their masks
    chunk = optim.head_chunk_tokens
    if optim.packing == "none":
        if chunk and allowed is None and head.installed(model):  # padded rows through the chunked head
            B, L = ids.shape
            rows = torch.arange(B, device=ids.device)[:, None].expand(B, L - 1)
            cols = torch.arange(L - 1, device=ids.device)[None].expand(B, L - 1)
            how = head.Scoring(with_entropy=with_entropy, entropy_grad=entropy_grad, chunk=chunk)
            lp, ent = head.scored_rows(
                model,
                ids,
                attention_mask=att,
                position_ids=None,
                valid=att[:, 1:] > 0,
                row=rows,
                col=cols,
                target=ids[:, 1:],
                how=how,
            )
        else:
            lp, ent = token_logprobs(model, ids, att, with_entropy, entropy_grad, allowed=allowed)
        return lp, ent, T, None
    p = pack_batch(m, T, optim, model)
    keep = m.loss_mask[:, :T] > 0
    lp, ent = packing.logprobs(model, p, with_entropy, entropy_grad, keep=keep, allowed=allowed, chunk=chunk)
    return lp, ent, T, p


def pack_batch(m: Batch, T: int, optim: OptimConfig, model) -> packing.Packed:
    """`m`'s rows packed for `model`: rows capped as the attention it runs needs (`OptimConfig.row_tokens`)."""
    rows = optim.row_tokens(grouped_attention.enabled(model))
    share = optim.packing == "prefix"
    return packing.pack(row_ids(m), T, rows, share, pad_id=0, device=m.input_ids.device)


@torch.no_grad()
def forward_logprobs(model, batch: Batch, optim: OptimConfig, signal_only: bool = False) -> torch.Tensor:
    """Logprobs of the batch's tokens under `model`, micro-batched. [B, L-1]
    `signal_only`: score only the rows with a non-zero advantage (`signal_rows`; the others stay 0). For the old
    logprobs under `skip_zero_adv`: the update never reads a skipped row's (42-75 % of an agent step's rows)."""
    out = torch.zeros_like(batch.loss_mask)
    rows = signal_rows(batch) if signal_only else list(range(len(batch)))
    sub = batch if not signal_only else batch.slice(rows) if rows else blank(batch)
    for ix, m in micro_batches(sub, optim):  # the same number of passes on every rank, even one with no rows
        lp, _, T, _ = logprobs(model, m, optim)
        if ix and rows:  # no rows: `sub` is a blank pass, kept for FSDP's collectives only
            out[[rows[i] for i in ix], :T] = lp
    return out


def minibatches(
    batch: Batch, algo: AlgoConfig, optim: OptimConfig, skip_zero_adv: bool = False
) -> Iterator[list[tuple[Batch, float]]]:
    """One item per optimizer step (`ppo_epochs × mini_batches`): the step's micro-batches, each with the factor
    that makes the sum over micro-batches and ranks the global mini-batch's `agg_loss` (0 for a blank one).
    `skip_zero_adv`: rows with no non-zero advantage are counted in the normalisers but not passed on."""
    world, mode = dist.get_info().world, algo.loss_agg_mode
    for _epoch in range(algo.ppo_epochs):
        for ms in micro_slices(len(batch), math.ceil(len(batch) / algo.mini_batches)):
            mb = batch.slice(ms)
            # Global normalisers of this mini-batch: every rank's tokens and rows (fully masked rows count in B;
            # padding rows do not).
            g_tokens, g_seqs = dist.all_reduce_sum([float(mb.loss_mask.sum()), float(mb.row_mask.sum())])
            if skip_zero_adv:
                keep = signal_rows(mb)
                mb = mb.slice(keep) if keep else blank(mb)
            yield [
                (m, algos.agg_scale(mode, m.loss_mask, g_tokens, g_seqs) * world if m.row_mask.any() else 0.0)
                for _, m in micro_batches(mb, optim)
            ]


def skips_exactly(optim: OptimConfig, algo: AlgoConfig) -> bool:
    """Whether leaving zero-advantage rows out leaves the gradient unchanged: the loss vanishes at A = 0 and no
    term that does not (entropy bonus, KL loss) is on."""
    kl_loss = algo.kl_coef > 0 and not algo.kl_in_reward
    return (
        optim.skip_zero_adv
        and algos.registry.POLICY_LOSSES.meta(algo.policy_loss).get("zero_at_zero_adv", False)
        and algo.entropy_coef == 0
        and not kl_loss
    )


def grad_norm_and_clip(model, max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def make_optimizer(params, lr: float, optim: OptimConfig):
    """AdamW with a linear warm-up schedule (the critic uses it with its own learning rate). Fused: one kernel over
    all parameters instead of ~10 ops per parameter, each dispatched through DTensor (on the CPU the loop took
    6 % of the real model's train phase)."""
    params = list(params)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    opt = torch.optim.AdamW(params, lr=lr, betas=optim.betas, weight_decay=optim.weight_decay, fused=fused or None)
    warm = optim.warmup_steps
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)


BY_ORIGIN = tuple(f"mismatch/{o}_{k}" for o in algos.ORIGINS for k in ("abs_mean", "abs_max", "abs_p99", "k3"))
"""`algos.mismatch_by_origin`'s metrics, logged whenever the update is told its weights' version: NaN where no
rank trained a token of that origin (never absent: a step without stale tokens says so)."""

PEAKS = ("is_weight_max", "mismatch/mismatch_abs_max", "rc/mismatch_abs_max")
PEAKS += tuple(f"mismatch/{o}_abs_max" for o in algos.ORIGINS)
"""Metrics reduced by max over micro-batches and ranks."""

TOKEN_MEANS = dict.fromkeys(
    (
        "is_weight_mean",
        "is_masked_frac",
        "mismatch/mismatch_abs_mean",
        "mismatch/mismatch_k3",
        "rc/mismatch_abs_mean",
        "rc/mismatch_k3",
        "rc/frac_corrected",
    ),
    "valid",
)
TOKEN_MEANS |= {f"mismatch/{o}_{k}": o for o in algos.ORIGINS for k in ("abs_mean", "k3")}
"""Per-token means, each with the tokens it is over (`valid`: a micro-batch's loss tokens; `fresh` / `stale`: those
of one origin): summed over micro-batches and ranks weighted by each micro-batch's count of those tokens, then
divided once, so a micro-batch with few (or no) such tokens weighs what it holds. The other metrics are means over
the micro-batches where they are defined (a NaN, a quantile over no token, contributes nothing)."""


class MicroMeans:
    """The update's metrics over its micro-batches and ranks, reduced in one collective: `TOKEN_MEANS` weighted by
    each micro-batch's valid tokens, `PEAKS` by max, the rest as means over the micro-batches that define them. A
    metric that nothing defined is absent, never a reassuring 0; `n_micro` counts the micro-batches that trained
    rows, over every rank, after `reduce`."""

    def __init__(self):
        self.sums, self.counts, self.peaks, self.n_micro = defaultdict(float), defaultdict(float), {}, 0.0

    def add(self, metrics: dict[str, float], tokens: dict[str, int], blank: bool = False) -> None:
        """One micro-batch's metrics; `tokens`: its count of each kind of token a `TOKEN_MEANS` metric is over."""
        for k, v in metrics.items():
            if k in PEAKS:
                self.peaks[k] = max(self.peaks.get(k, -math.inf), -math.inf if blank or math.isnan(v) else v)
                continue
            w = 0.0 if blank or math.isnan(v) else float(tokens[TOKEN_MEANS[k]]) if k in TOKEN_MEANS else 1.0
            self.sums[k] += v * w if w else 0.0
            self.counts[k] += w
        self.n_micro += not blank

    def reduce(self, extra: list[float]) -> tuple[dict[str, float], list[float]]:
        """The step's metrics over every rank, and `extra` summed over ranks in the same collective."""
        keys, n = sorted(self.sums), len(self.sums)
        sums = [self.sums[k] for k in keys] + [self.counts[k] for k in keys] + list(extra) + [self.n_micro]
        totals = dist.all_reduce_sum(sums)
        self.n_micro = totals[-1]
        out = {k: totals[i] / totals[n + i] for i, k in enumerate(keys) if totals[n + i] > 0}
        if top := sorted(self.peaks):
            out |= {k: v for k, v in zip(top, dist.all_reduce_max([self.peaks[k] for k in top])) if v > -math.inf}
        return out, totals[2 * n : -1]


class PolicyUpdate:
    """The policy's optimizer, schedule and loss (the registered `algo.policy_loss`, + KL and entropy terms)."""

    def __init__(
        self, optim: OptimConfig, algo: AlgoConfig, model, tracer: Tracer | None = None, off_policy: bool = False
    ):
        """`off_policy`: the batches hold tokens sampled by older weights (partial rollouts): `rollout_correction`
        auto then weights each token's loss by its capped behaviour ratio (`algos.correction_rule`)."""
        self.optim, self.algo, self.model = optim, algo, model
        self.correction = algos.correction_rule(algo, off_policy)
        self.opt, self.sched = make_optimizer(trainable_parameters(model), optim.lr, optim)
        self.loss_fn = algos.get_policy_loss(algo.policy_loss)
        self.skip = skips_exactly(optim, algo)
        self.tracer = tracer or Tracer()  # the step's traced rows and their first pass's values, for the viewer

    def __call__(self, batch: Batch, version: int | None = None) -> dict[str, float]:
        """Optimizer steps over this rank's share of the batch. Returns metrics averaged over micro-batches/ranks.
        `version`: the weights' as the update starts (those of the old logprobs): with it, the mismatch is also
        logged by origin (`BY_ORIGIN`), a token sampled at this version fresh, one sampled earlier stale."""
        a, means, grad_norms = self.algo, MicroMeans(), []
        self.tracer.begin(batch)
        tokens = [0.0, 0.0]  # tokens the forward passes computed, and what they would have computed unpacked
        trained = 0.0  # rows passed on to forward / backward (all epochs)
        for step in minibatches(batch, a, self.optim, self.skip):
            for i, (m, scale) in enumerate(step):
                accumulate(self.model, last=i == len(step) - 1)  # one gradient reduction a step (small models)
                trained += float(m.row_mask.sum())
                metrics, computed, unpacked, counts = self.backward(m, scale, version)
                # a blank pass (or only padding rows) reports nothing, but adds its keys: they must match the other
                # ranks' for the all-reduce (a rank whose rows were all skipped runs only blank passes)
                blank = not m.row_mask.any()
                means.add(metrics, counts, blank=blank)
                if not blank:
                    tokens = [tokens[0] + computed, tokens[1] + unpacked]
            grad_norms.append(grad_norm_and_clip(self.model, self.optim.grad_clip))
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
        rows = float(batch.row_mask.sum()) * a.ppo_epochs
        out, (trained, rows, computed, unpacked) = means.reduce([trained, rows, *tokens])
        if means.n_micro == 0:  # every row skipped on every rank (no advantage anywhere): the loss is exactly 0
            out["pg_loss"] = 0.0
        if version is not None:  # an origin no rank trained a token of: NaN, not a reassuring 0 nor a missing tag
            out |= {k: math.nan for k in BY_ORIGIN if k not in out}
        return out | {
            "skipped_rows_frac": 1 - trained / max(rows, 1.0),  # rows with no advantage, left out
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "lr": self.sched.get_last_lr()[0],
            "tokens_computed": computed,  # every rank's forward/backward tokens, all epochs (no padding)
            "tokens_unpacked": unpacked,
        }

    def backward(
        self, m: Batch, scale: float, version: int | None = None
    ) -> tuple[dict[str, float], int, int, dict[str, int]]:
        """Loss of one micro-batch, scaled into the global mean, and its backward pass. Returns its metrics, the
        tokens its forward computed (after prefix sharing, without padding), its tokens unpacked, and its counts of
        the tokens its per-token means are over (`TOKEN_MEANS`: valid, i.e. loss-masked, and with `version`, fresh
        and stale)."""
        a, out = self.algo, {}
        lp, ent, T, p = logprobs(self.model, m, self.optim, with_entropy=True, entropy_grad=a.entropy_coef > 0)
        mask = m.loss_mask[:, :T]  # [b, T]
        self.tracer.keep(m, lp, ent)
        n_tok = int(m.attention_mask.sum())
        computed = p.unique_tokens if p is not None else n_tok
        # On-policy single pass: the behaviour policy is the current one, so old = current (r = 1 exactly).
        old = m.old_logprobs[:, :T] if m.old_logprobs is not None else lp.detach()
        rollout_lp = m.rollout_logprobs[:, :T]
        weights = None
        if self.correction is not None:  # rho = pi_old / mu per token (pi_old: the proximal policy, this pass)
            weights, rc = algos.rollout_correction(old, rollout_lp, mask, *self.correction)
            out |= {"rc/" + k: float(v) for k, v in rc.items()}
            on = mask.bool()
            w = weights[on]
            out |= {  # over this micro-batch's valid tokens
                "is_weight_mean": float(w.mean()) if w.numel() else float("nan"),
                "is_weight_max": float(w.max()) if w.numel() else float("nan"),
                "is_masked_frac": float((w == 0).float().mean()) if w.numel() else float("nan"),
            }
        loss, metrics = self.loss_fn(lp, old, m.advantages[:, :T], mask, a, weights=weights)
        total = loss
        if m.ref_logprobs is not None:  # KL to the reference: a loss term, or only logged (train/kl)
            kl_term = a.kl_coef > 0 and not a.kl_in_reward
            kl = algos.kl_penalty(lp if kl_term else lp.detach(), m.ref_logprobs[:, :T], a.kl_kind)
            kl_loss = algos.agg_loss(kl, mask, a.loss_agg_mode, a.norm_const)  # [b, T] -> scalar
            if kl_term:
                total = total + a.kl_coef * kl_loss
            out["kl"] = float(kl_loss.detach())
        if a.entropy_coef > 0:
            total = total - a.entropy_coef * algos.agg_loss(ent, mask, a.loss_agg_mode, a.norm_const)
        (total * scale).backward()
        out["pg_loss"] = float(loss.detach())
        out["entropy"] = float((ent.detach() * mask).sum() / mask.sum().clamp(min=1))
        out |= {k: float(v) for k, v in metrics.items()}
        out |= {"mismatch/" + k: float(v) for k, v in algos.mismatch_metrics(old, rollout_lp, mask).items()}
        counts = {"valid": int(mask.sum())}
        if version is not None:
            by_origin, n = algos.mismatch_by_origin(old, rollout_lp, mask, lag(m, T, version))
            out |= {"mismatch/" + k: v for k, v in by_origin.items()}
            counts |= n
        return out, computed, n_tok, counts


def lag(m: Batch, T: int, version: int) -> torch.Tensor:
    """[b, T] how many versions before `version` the weights that sampled each token were (-1: not known)."""
    if m.versions is None:
        return torch.full_like(m.loss_mask[:, :T], -1, dtype=torch.long)
    sampled = m.versions[:, :T]
    return torch.where(sampled >= 0, version - sampled, -1)
