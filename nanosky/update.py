"""The policy update: micro-batched forward/backward with the loss normalised over the global batch.

The loss of each micro-batch is `agg_loss(micro) · agg_scale(...)`, so summing micro-batches and ranks gives exactly
the global batch's `agg_loss`; FSDP averages gradients over ranks, hence the extra `× world`. The gradient is the
same for any micro-batch size or world size (tests/test_update.py checks it).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor

import algos
from nanosky import dist
from nanosky.batch import Batch
from nanosky.policy import token_logprobs


def micro_slices(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _trim(b: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Drop columns that are padding in every row of this micro-batch. Returns ids, attention mask, T (= L-1)."""
    L = int(b.attention_mask.sum(-1).max())
    return b.input_ids[:, :L], b.attention_mask[:, :L], L - 1


@torch.no_grad()
def forward_logprobs(model, batch: Batch, micro_bs: int) -> torch.Tensor:
    """Logprobs of the batch's tokens under `model`, micro-batched. [B, L-1]"""
    out = torch.zeros_like(batch.loss_mask)
    for s in micro_slices(len(batch), micro_bs):
        ids, att, T = _trim(batch.slice(s))
        lp, _ = token_logprobs(model, ids, att)
        out[s, :T] = lp
    return out


def grad_norm_and_clip(model, max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def policy_update(
    model, opt, sched, batch: Batch, cfg: algos.AlgoConfig, micro_bs: int, grad_clip: float, norm_const: int
) -> dict[str, float]:
    """`ppo_epochs` × `mini_batches` optimizer steps over this rank's share of the batch. Returns mean metrics."""
    info = dist.get_info()
    loss_fn = algos.get_policy_loss(cfg.policy_loss)
    pcfg = algos.PolicyLossConfig(**{**cfg.policy_loss_config().__dict__, "norm_const": norm_const})
    mode = cfg.loss_agg_mode
    sums: dict[str, float] = defaultdict(float)
    n_mb_total = 0
    grad_norms = []
    mini = micro_slices(len(batch), math.ceil(len(batch) / cfg.mini_batches))
    for _epoch in range(cfg.ppo_epochs):
        for ms in mini:
            mb = batch.slice(ms)
            # Global normalisers for this mini-batch: every rank's tokens and sequences.
            g_tokens, g_seqs = dist.all_reduce_sum(
                [float(mb.loss_mask.sum()), float((mb.loss_mask.sum(-1) > 0).sum())]
            )
            for s in micro_slices(len(mb), micro_bs):
                m = mb.slice(s)
                ids, att, T = _trim(m)
                mask = m.loss_mask[:, :T]  # [b, T]
                lp, ent = token_logprobs(
                    model, ids, att, with_entropy=True, entropy_grad=cfg.entropy_coef > 0
                )
                # On-policy single pass: the behaviour policy is the current one, so old = current (r = 1 exactly).
                old = m.old_logprobs[:, :T] if m.old_logprobs is not None else lp.detach()
                rollout_lp = m.rollout_logprobs[:, :T]
                weights = None
                if cfg.rollout_correction_level != "none":
                    weights, rc = algos.rollout_correction(
                        old,
                        rollout_lp,
                        mask,
                        cfg.rollout_correction_level,
                        cfg.rollout_correction_mode,
                        cfg.rollout_correction_threshold,
                    )
                    for k, v in rc.items():
                        sums["rc/" + k] += float(v)
                loss, metrics = loss_fn(lp, old, m.advantages[:, :T], mask, pcfg, weights=weights)
                scale = algos.agg_scale(mode, mask, g_tokens, g_seqs) * info.world
                total = loss
                if m.ref_logprobs is not None:  # KL to the reference: a loss term, or only logged (train/kl)
                    kl_term = cfg.kl_coef > 0 and not cfg.kl_in_reward
                    kl = algos.kl_penalty(lp if kl_term else lp.detach(), m.ref_logprobs[:, :T], cfg.kl_kind)
                    kl_loss = algos.agg_loss(kl, mask, mode, norm_const=norm_const)  # [b, T] -> scalar
                    if kl_term:
                        total = total + cfg.kl_coef * kl_loss
                    sums["kl"] += float(kl_loss.detach())
                if cfg.entropy_coef > 0:
                    total = total - cfg.entropy_coef * algos.agg_loss(ent, mask, mode, norm_const=norm_const)
                (total * scale).backward()
                n_mb_total += 1
                sums["pg_loss"] += float(loss.detach())
                sums["entropy"] += float((ent.detach() * mask).sum() / mask.sum().clamp(min=1))
                for k, v in metrics.items():
                    sums[k] += float(v)
                for k, v in algos.mismatch_metrics(old, rollout_lp, mask).items():
                    sums["mismatch/" + k] += float(v)
            grad_norms.append(grad_norm_and_clip(model, grad_clip))
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
    keys = sorted(sums)
    totals = dist.all_reduce_sum([sums[k] for k in keys] + [float(n_mb_total)])
    n = max(totals[-1], 1.0)
    out = {k: v / n for k, v in zip(keys, totals[:-1])}
    out["grad_norm"] = sum(grad_norms) / len(grad_norms)
    out["lr"] = sched.get_last_lr()[0]
    return out
