"""The policy update: `PolicyUpdate(cfg.optim, cfg.algorithm, model)` owns the optimizer, the LR schedule and the
loss; calling it on a batch runs `ppo_epochs × mini_batches` optimizer steps.

The loss of each micro-batch is `agg_loss(micro) · agg_scale(...)`, so summing micro-batches and ranks gives exactly
the global mini-batch's `agg_loss`; FSDP averages gradients over ranks, hence the extra `× world`. The gradient is
the same for any micro-batch size or world size (tests/test_update.py checks it). The critic (`nanosky.critic`)
steps through the same `minibatches`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

import algos
from algos import AlgoConfig
from nanosky import dist
from nanosky.batch import Batch, micro_slices
from nanosky.lora import trainable_parameters
from nanosky.policy import token_logprobs


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 1e-4
    """AdamW learning rate for the policy."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    """Clip the global grad norm to this (0 = off)."""
    warmup_steps: int = 0
    """Linear LR warm-up, in optimizer steps."""
    micro_batch_size: int = 16
    """Sequences per forward/backward on each rank; the loss is normalised over the global batch, so this only
    trades memory for speed."""

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.micro_batch_size < 1:
            raise ValueError(f"optim.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("optim.grad_clip, optim.weight_decay and optim.warmup_steps must be >= 0")


@torch.no_grad()
def forward_logprobs(model, batch: Batch, micro_bs: int) -> torch.Tensor:
    """Logprobs of the batch's tokens under `model`, micro-batched. [B, L-1]"""
    out = torch.zeros_like(batch.loss_mask)
    for s in micro_slices(len(batch), micro_bs):
        ids, att, T = batch.slice(s).inputs()
        lp, _ = token_logprobs(model, ids, att)
        out[s, :T] = lp
    return out


def minibatches(batch: Batch, algo: AlgoConfig, micro_bs: int) -> Iterator[list[tuple[Batch, float]]]:
    """One item per optimizer step (`ppo_epochs × mini_batches`): the step's micro-batches, each with the factor
    that makes the sum over micro-batches and ranks the global mini-batch's `agg_loss`."""
    world, mode = dist.get_info().world, algo.loss_agg_mode
    for _epoch in range(algo.ppo_epochs):
        for ms in micro_slices(len(batch), math.ceil(len(batch) / algo.mini_batches)):
            mb = batch.slice(ms)
            # Global normalisers of this mini-batch: every rank's tokens and rows (fully masked rows count in B;
            # padding rows do not).
            g_tokens, g_seqs = dist.all_reduce_sum([float(mb.loss_mask.sum()), float(mb.row_mask.sum())])
            micro = [mb.slice(s) for s in micro_slices(len(mb), micro_bs)]
            yield [(m, algos.agg_scale(mode, m.loss_mask, g_tokens, g_seqs) * world) for m in micro]


def grad_norm_and_clip(model, max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def make_optimizer(params, lr: float, optim: OptimConfig):
    """AdamW with a linear warm-up schedule (the critic uses it with its own learning rate)."""
    opt = torch.optim.AdamW(params, lr=lr, betas=optim.betas, weight_decay=optim.weight_decay)
    warm = optim.warmup_steps
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)


class PolicyUpdate:
    """The policy's optimizer, schedule and loss (the registered `algo.policy_loss`, + KL and entropy terms)."""

    def __init__(self, optim: OptimConfig, algo: AlgoConfig, model):
        self.optim, self.algo, self.model = optim, algo, model
        self.opt, self.sched = make_optimizer(trainable_parameters(model), optim.lr, optim)
        self.loss_fn = algos.get_policy_loss(algo.policy_loss)

    def __call__(self, batch: Batch) -> dict[str, float]:
        """Optimizer steps over this rank's share of the batch. Returns metrics averaged over micro-batches/ranks."""
        a, sums, grad_norms = self.algo, defaultdict(float), []
        for step in minibatches(batch, a, self.optim.micro_batch_size):
            for m, scale in step:
                for k, v in self.backward(m, scale).items():
                    sums[k] += v
                sums["n_micro"] += 1
            grad_norms.append(grad_norm_and_clip(self.model, self.optim.grad_clip))
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
        keys = sorted(k for k in sums if k != "n_micro")
        totals = dist.all_reduce_sum([sums[k] for k in keys] + [sums["n_micro"]])
        out = {k: v / max(totals[-1], 1.0) for k, v in zip(keys, totals[:-1])}
        return out | {"grad_norm": sum(grad_norms) / len(grad_norms), "lr": self.sched.get_last_lr()[0]}

    def backward(self, m: Batch, scale: float) -> dict[str, float]:
        """Loss of one micro-batch, scaled into the global mean, and its backward pass. Returns its metrics."""
        a, out = self.algo, {}
        ids, att, T = m.inputs()
        mask = m.loss_mask[:, :T]  # [b, T]
        lp, ent = token_logprobs(self.model, ids, att, with_entropy=True, entropy_grad=a.entropy_coef > 0)
        # On-policy single pass: the behaviour policy is the current one, so old = current (r = 1 exactly).
        old = m.old_logprobs[:, :T] if m.old_logprobs is not None else lp.detach()
        rollout_lp = m.rollout_logprobs[:, :T]
        weights = None
        if a.rollout_correction_level != "none":
            weights, rc = algos.rollout_correction(
                old,
                rollout_lp,
                mask,
                a.rollout_correction_level,
                a.rollout_correction_mode,
                a.rollout_correction_threshold,
            )
            out |= {"rc/" + k: float(v) for k, v in rc.items()}
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
        return out
