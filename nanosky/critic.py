"""PPO's critic: the policy's HF backbone with a scalar value head, sharded with FSDP2 like the policy.

Values are read on the same positions as the policy's logprobs: position t (predicting token t+1) holds V of the
state before token t+1 is generated, so `values`, `logprobs` and `loss_mask` are all [B, L-1] and line up.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import algos
from nanosky import dist
from nanosky.batch import Batch
from nanosky.policy import shard_model
from nanosky.update import _trim, grad_norm_and_clip, micro_slices


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
    critic = Critic(path)
    # The backbone's decoder layers are sharded like the policy's; `shard_model` expects `.model.layers`.
    return shard_model(critic, info)


@torch.no_grad()
def forward_values(critic: Critic, batch: Batch, micro_bs: int) -> torch.Tensor:
    out = torch.zeros_like(batch.loss_mask)  # [B, L-1]
    for s in micro_slices(len(batch), micro_bs):
        ids, att, T = _trim(batch.slice(s))
        out[s, :T] = critic(ids, att)
    return out


def critic_update(
    critic, opt, batch: Batch, cfg: algos.AlgoConfig, micro_bs: int, grad_clip: float, norm_const: int
) -> dict[str, float]:
    """Clipped value regression onto the GAE returns, with the same global normalisation as the policy loss."""
    info = dist.get_info()
    mode = cfg.loss_agg_mode
    losses, clip_fracs, norms = [], [], []
    mini = micro_slices(len(batch), math.ceil(len(batch) / cfg.mini_batches))
    for _epoch in range(cfg.ppo_epochs):
        for ms in mini:
            mb = batch.slice(ms)
            g_tokens, g_seqs = dist.all_reduce_sum([float(mb.loss_mask.sum()), float(len(mb))])
            for s in micro_slices(len(mb), micro_bs):
                m = mb.slice(s)
                ids, att, T = _trim(m)
                mask = m.loss_mask[:, :T]
                v = critic(ids, att)  # [b, T]
                loss, met = algos.value_loss(
                    v,
                    m.values[:, :T],
                    m.returns[:, :T],
                    mask,
                    clip=cfg.value_clip,
                    mode=mode,
                    norm_const=norm_const,
                )
                (cfg.vf_coef * loss * algos.agg_scale(mode, mask, g_tokens, g_seqs) * info.world).backward()
                losses.append(float(loss.detach()))
                clip_fracs.append(met["value_clip_frac"])
            norms.append(grad_norm_and_clip(critic, grad_clip))
            opt.step()
            opt.zero_grad(set_to_none=True)
    s = dist.all_reduce_sum([sum(losses), sum(clip_fracs), float(len(losses))])
    ev = algos.explained_variance(batch.values, batch.returns, batch.loss_mask)
    return {
        "value_loss": s[0] / s[2],
        "value_clip_frac": s[1] / s[2],
        "critic_grad_norm": sum(norms) / len(norms),
        "explained_var": ev,
    }
