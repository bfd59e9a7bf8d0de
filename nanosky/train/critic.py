"""PPO's critic: the policy's HF backbone with a scalar value head, sharded with FSDP2 like the policy.

Values are read on the same positions as the policy's logprobs: position t (predicting token t+1) holds V of the
state before token t+1 is generated, so `values`, `logprobs` and `loss_mask` are all [B, L-1] and line up.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

import algos
from algos import AlgoConfig
from nanosky import dist
from nanosky.precision import Precision
from nanosky.train import packing
from nanosky.train.batch import Batch
from nanosky.train.policy import accumulate, hf_loader, load_sharded
from nanosky.train.update import (
    OptimConfig,
    grad_norm_and_clip,
    make_optimizer,
    micro_batches,
    minibatches,
    pack_batch,
)


class Critic(nn.Module):
    def __init__(self, path: str, real: bool = True):
        """`real=False`: the structure only (`load_sharded`'s skeleton; rank 0 reads the weights)."""
        super().__init__()
        from transformers import AutoModel

        # the backbone: `.layers` like the LM, with the policy's attention implementation
        self.model = hf_loader(path, AutoModel)(real)
        self.value_head = nn.Linear(self.model.config.hidden_size, 1)
        # Start at V ≈ 0 so the first advantages are the raw returns, not noise from a random head.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Padded rows (2-D mask): values [B, L-1]. Packed rows (a 4-D mask, or one per attention kind:
        `nanosky.train.packing.attention_mask`): every position's value [R, Lp], for `Packed.gather`."""
        h = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state  # [B, L, H]
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
            h = h[:, :-1]
        return self.value_head(h).squeeze(-1).float()


def values(critic: Critic, m: Batch, optim: OptimConfig) -> tuple[torch.Tensor, int]:
    """A micro-batch's values [b, T] (packed as `optim.packing` says), and T."""
    ids, att, T = m.inputs()
    if optim.packing == "none":
        return critic(ids, att), T
    p = pack_batch(m, T, optim, critic.model)
    return p.gather(critic(p.input_ids, packing.attention_mask(critic.model, p), p.position_ids)), T


def critic_forward(critic: Critic):
    """The critic's per-token values, the output `packing.verify` compares (through the FSDP root, which gathers
    the shards): [R, Lp] packed, [1, L-1] for one padded row."""
    return lambda ids, mask, pos: critic(ids, mask, pos)


def load_critic(path: str, info: dist.DistInfo, *, precision: Precision) -> Critic:
    return load_sharded(lambda real: Critic(path, real), info, precision=precision)  # read once, sharded as the policy


@torch.no_grad()
def forward_values(critic: Critic, batch: Batch, optim: OptimConfig) -> torch.Tensor:
    out = torch.zeros_like(batch.loss_mask)  # [B, L-1]
    for ix, m in micro_batches(batch, optim):
        v, T = values(critic, m, optim)
        if ix:
            out[ix, :T] = v
    return out


class CriticUpdate:
    """The critic's optimizer (lr = `algo.critic_lr`) and its clipped value regression onto the GAE returns, with
    the same mini-batches and global normalisation as the policy loss."""

    def __init__(self, optim: OptimConfig, algo: AlgoConfig, critic: Critic):
        self.optim, self.algo, self.critic = optim, algo, critic
        self.opt, _ = make_optimizer(critic.parameters(), algo.critic_lr, dataclasses.replace(optim, warmup_steps=0))

    def __call__(self, batch: Batch) -> dict[str, float]:
        a, losses, clip_fracs, norms = self.algo, [], [], []
        for step in minibatches(batch, a, self.optim):
            for i, (m, scale) in enumerate(step):
                accumulate(self.critic, last=i == len(step) - 1)
                v, T = values(self.critic, m, self.optim)  # [b, T]
                mask = m.loss_mask[:, :T]
                loss, met = algos.value_loss(
                    v,
                    m.values[:, :T],
                    m.returns[:, :T],
                    mask,
                    clip=a.value_clip,
                    mode=a.loss_agg_mode,
                    norm_const=a.norm_const,
                )
                (a.vf_coef * loss * scale).backward()
                if not m.row_mask.any():  # a blank pass: nothing to report
                    continue
                losses.append(float(loss.detach()))
                clip_fracs.append(met["value_clip_frac"])
            norms.append(grad_norm_and_clip(self.critic, self.optim.grad_clip))
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        s = dist.all_reduce_sum([sum(losses), sum(clip_fracs), float(len(losses))])
        return {
            "value_loss": s[0] / s[2],
            "value_clip_frac": s[1] / s[2],
            "critic_grad_norm": sum(norms) / len(norms),
            "explained_var": algos.explained_variance(batch.values, batch.returns, batch.loss_mask),
        }
