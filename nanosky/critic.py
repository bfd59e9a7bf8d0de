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
from nanosky.batch import Batch, micro_slices
from nanosky.policy import shard_model
from nanosky.update import OptimConfig, grad_norm_and_clip, make_optimizer, minibatches


class Critic(nn.Module):
    def __init__(self, path: str):
        super().__init__()
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(path, dtype=torch.float32)  # backbone: `.layers` like the LM
        self.value_head = nn.Linear(self.model.config.hidden_size, 1)
        # Start at V ≈ 0 so the first advantages are the raw returns, not noise from a random head.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, L, H]
        return self.value_head(h[:, :-1]).squeeze(-1).float()  # [B, L-1]


def load_critic(path: str, info: dist.DistInfo) -> Critic:
    return shard_model(Critic(path), info)  # sharded exactly like the policy


@torch.no_grad()
def forward_values(critic: Critic, batch: Batch, micro_bs: int) -> torch.Tensor:
    out = torch.zeros_like(batch.loss_mask)  # [B, L-1]
    for s in micro_slices(len(batch), micro_bs):
        ids, att, T = batch.slice(s).inputs()
        out[s, :T] = critic(ids, att)
    return out


class CriticUpdate:
    """The critic's optimizer (lr = `algo.critic_lr`) and its clipped value regression onto the GAE returns, with
    the same mini-batches and global normalisation as the policy loss."""

    def __init__(self, optim: OptimConfig, algo: AlgoConfig, critic: Critic):
        self.optim, self.algo, self.critic = optim, algo, critic
        self.opt, _ = make_optimizer(
            critic.parameters(), algo.critic_lr, dataclasses.replace(optim, warmup_steps=0)
        )

    def __call__(self, batch: Batch) -> dict[str, float]:
        a, losses, clip_fracs, norms = self.algo, [], [], []
        for step in minibatches(batch, a, self.optim.micro_batch_size):
            for m, scale in step:
                ids, att, T = m.inputs()
                mask = m.loss_mask[:, :T]
                v = self.critic(ids, att)  # [b, T]
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
