"""GiGPO (arXiv 2505.10978, verl-agent): group-in-group credit for multi-step agents, as pure functions.

One prompt group g holds n episodes of the same task; episode i has steps t with step reward r_{i,t} and a state key
s_{i,t} (the env state before the action; equal keys = the same state, however it was reached).

    A^E_i     = (R_i − mean_g R) / F_g                  R_i = Σ_t r_{i,t}            (episode level)
    Q_{i,t}   = Σ_{k≥t} γ^{k−t} r_{i,k}                                              (discounted return)
    A^S_{i,t} = (Q_{i,t} − mean_anchor Q) / F_anchor     anchor = steps of g with equal state keys
    A_{i,t}   = A^E_i + ω·A^S_{i,t}

F = the unbiased (n−1) std + eps (`mean_std_norm`) or 1 (`mean_norm`). A singleton group, episode or anchor, has
mean 0 and std 1, the convention of `algos.advantages` (GRPO). Defaults ω = 1, γ = 0.95, `mean_norm`.

    algos.discounted_returns([0, 0, 1], 0.5)                                 # [0.25, 0.5, 1.0]
    algos.step_group_advantages(torch.tensor([1., 3., 5.]), ["a", "a", "b"], "mean_norm")   # [-1, 1, 5]
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from algos.registry import register_adv_estimator

GIGPO_MODES = ("mean_norm", "mean_std_norm")


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """Q_t = Σ_{k≥t} γ^{k−t} r_k for one episode's step rewards, computed backwards."""
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def step_group_advantages(returns: Tensor, keys: Sequence[Hashable], mode: str, eps: float = 1e-6) -> Tensor:
    """Normalise `returns` [N] within the groups of equal `keys` (N hashables): (x − mean) / F, F = std + eps
    (`mean_std_norm`, unbiased n−1 std) or 1 (`mean_norm`); a singleton key has mean 0 and std 1. Returns [N]."""
    if mode not in GIGPO_MODES:
        raise ValueError(f"unknown GiGPO mode {mode!r}; valid modes: {', '.join(GIGPO_MODES)}")
    returns = torch.as_tensor(returns)
    if returns.ndim != 1 or returns.shape[0] != len(keys):
        raise ValueError(f"returns must be [N] with one key each; got {tuple(returns.shape)} and {len(keys)} keys")
    dtype = returns.dtype if returns.is_floating_point() else torch.float32
    ids: dict[Hashable, int] = {}
    inv = torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long, device=returns.device)  # [N]
    x = returns.double()  # float64: an all-equal group gives x − mean = 0 exactly
    G = len(ids)
    count = x.new_zeros(G).index_add_(0, inv, torch.ones_like(x))  # [G]
    mean = x.new_zeros(G).index_add_(0, inv, x) / count.clamp(min=1)  # [G]
    sq = x.new_zeros(G).index_add_(0, inv, (x - mean[inv]) ** 2)  # [G]
    std = (sq / (count - 1).clamp(min=1)).sqrt()  # [G]
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    out = x - mean[inv]
    if mode == "mean_std_norm":
        out = out / (std[inv] + eps)
    return out.to(dtype)


def gigpo_advantages(
    step_rewards: Tensor,
    episode: Tensor,
    step: Tensor,
    group: Tensor,
    state_keys: Sequence[Hashable],
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: str = "mean_norm",
    eps: float = 1e-6,
) -> Tensor:
    """Per-step advantages A_{i,t} = A^E_i + ω·A^S_{i,t}, one row per step sample. Returns [N].

    step_rewards [N] r_{i,t}; episode [N] episode id (unique across groups); step [N] index t within the episode;
    group [N] prompt group of the episode; state_keys: N hashables, the state before step t."""
    N = len(state_keys)
    if not (step_rewards.shape[0] == episode.shape[0] == step.shape[0] == group.shape[0] == N):
        raise ValueError("step_rewards, episode, step, group and state_keys must all have N rows")
    r, ep, st, gr = step_rewards.double().tolist(), episode.tolist(), step.tolist(), group.tolist()
    rows: dict[int, list[int]] = {}  # episode -> its rows in step order
    for k in sorted(range(N), key=lambda k: (ep[k], st[k])):
        rows.setdefault(ep[k], []).append(k)
    q = [0.0] * N
    R: dict[int, float] = {}
    ep_group: dict[int, int] = {}
    for e, ks in rows.items():
        for k, v in zip(ks, discounted_returns([r[k] for k in ks], gamma)):
            q[k] = v
        R[e], ep_group[e] = sum(r[k] for k in ks), gr[ks[0]]
    eps_ids = list(rows)
    a_ep = step_group_advantages(
        torch.tensor([R[e] for e in eps_ids], dtype=torch.float64), [ep_group[e] for e in eps_ids], mode, eps
    )  # [E]
    a_ep_of = dict(zip(eps_ids, a_ep.tolist()))
    a_step = step_group_advantages(torch.tensor(q, dtype=torch.float64), list(zip(gr, state_keys)), mode, eps)
    out = torch.tensor([a_ep_of[ep[k]] for k in range(N)], dtype=torch.float64) + omega * a_step  # [N]
    return out.to(step_rewards.dtype if step_rewards.is_floating_point() else torch.float32)


def anchor_stats(group: Tensor, state_keys: Sequence[Hashable]) -> dict[str, float]:
    """Mean anchor-group size and the fraction of steps in non-singleton anchors (what GiGPO's step term sees)."""
    sizes: dict[tuple, int] = {}
    keys = list(zip(group.tolist(), state_keys))
    for k in keys:
        sizes[k] = sizes.get(k, 0) + 1
    n = max(len(keys), 1)
    return {
        "anchor_size_mean": sum(sizes.values()) / max(len(sizes), 1),
        "anchor_nonsingleton_frac": sum(sizes[k] > 1 for k in keys) / n,
    }


@dataclass
class StepInfo:
    """The steps of each row of a `(B, T)` batch, for step-level estimators. Per row i, one entry per step t:
    `spans[i][t]` = (start, end) response positions of that step's action tokens, `rewards[i][t]` = r_{i,t} (they
    sum to the row's outcome reward), `state_keys[i][t]` = the state before the action."""

    spans: list[list[tuple[int, int]]]
    rewards: list[list[float]]
    state_keys: list[list[Hashable]]


@register_adv_estimator("gigpo", per_group=True, needs_steps=True)
@torch.no_grad()
def gigpo(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_index: Tensor,
    values: Tensor | None = None,
    gamma: float = 0.95,
    lam: float = 1.0,
    steps: StepInfo | None = None,
    omega: float = 1.0,
    mode: str = "mean_norm",
) -> tuple[Tensor, Tensor]:
    """GiGPO on a batch of multi-step episodes, one row each: A_{i,t} = A^E_i + ω·A^S_{i,t} on the tokens of step t.

    `steps` carries each row's step spans, rewards and state keys (`nanosky.train.step_credit.step_info` builds it); returns are
    the discounted step returns Q_{i,t} on the same tokens."""
    if steps is None:
        raise ValueError("adv_estimator 'gigpo' needs steps= (step spans, rewards and state keys per row)")
    B = token_rewards.shape[0]
    if not len(steps.spans) == len(steps.rewards) == len(steps.state_keys) == B:
        raise ValueError(f"steps must describe all {B} rows")
    rows = [(i, t) for i in range(B) for t in range(len(steps.spans[i]))]
    if not rows:
        return torch.zeros_like(token_rewards), torch.zeros_like(token_rewards)
    groups = group_index.tolist()
    adv = gigpo_advantages(
        torch.tensor([steps.rewards[i][t] for i, t in rows], dtype=torch.float64),
        episode=torch.tensor([i for i, _ in rows]),
        step=torch.tensor([t for _, t in rows]),
        group=torch.tensor([groups[i] for i, _ in rows]),
        state_keys=[steps.state_keys[i][t] for i, t in rows],
        gamma=gamma,
        omega=omega,
        mode=mode,
    ).tolist()
    q = {i: discounted_returns(steps.rewards[i], gamma) for i in range(B)}
    out_adv, out_ret = torch.zeros_like(token_rewards), torch.zeros_like(token_rewards)  # [B, T]
    for (i, t), a in zip(rows, adv):
        start, end = steps.spans[i][t]
        out_adv[i, start:end], out_ret[i, start:end] = a, q[i][t]
    m = response_mask.to(out_adv.dtype)
    return out_adv * m, out_ret * m
