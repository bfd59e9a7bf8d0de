"""Held-out evaluation during training (`eval/*` tags) and the weight-sync probe."""

from __future__ import annotations

import torch

import envs
from nanosky import dist
from nanosky.rollout.chat import encode_conversation
from nanosky.train.policy import token_logprobs


def evaluate(rollout_fn, limit: int, n_samples: int) -> tuple[dict[str, float], list]:
    """Mean@n success on the first `limit` test episodes, split across ranks. `rollout_fn(seeds)` rolls out the
    test episodes with those seeds. Returns (metrics, this rank's trajectories)."""
    info = dist.get_info()
    idx = list(range(info.rank, limit, info.world))
    trajs = rollout_fn([i for i in idx for _ in range(n_samples)])
    s = dist.all_reduce_sum(
        [
            float(sum(t.success for t in trajs)),
            float(len(trajs)),
            float(sum(t.reward for t in trajs)),
            float(sum(t.n_policy_tokens for t in trajs)),
            float(sum(t.tool_calls for t in trajs)),
            float(sum(t.turns for t in trajs)),
        ]
    )
    n = max(s[1], 1.0)
    return {
        "eval/accuracy": s[0] / n,
        "eval/reward_mean": s[2] / n,
        "eval/response_len": s[3] / n,
        "eval/tool_calls_per_traj": s[4] / n,
        "eval/turns_mean": s[5] / n,
    }, trajs


def probe_sequence(tok, env_name: str, env_kwargs: dict) -> list[int]:
    """A fixed token sequence to score with both the trainer and the engine after every sync."""
    env = envs.make(env_name, split="test", seed=0, **env_kwargs)
    msgs = env.reset() + [{"role": "assistant", "content": "Let me think. 12 + 30 = 42\n<answer>42</answer>"}]
    ids, _ = encode_conversation(tok, msgs, [t.schema for t in env.tools] or None)
    return ids


@torch.no_grad()
def probe(model, engine, ids: list[int], device) -> dict[str, float]:
    """|trainer − engine| logprob over a fixed sequence. Collective (every rank runs the trainer forward)."""
    x = torch.tensor([ids], device=device)
    lp_train, _ = token_logprobs(model, x, torch.ones_like(x))
    lp_engine = engine.prompt_logprobs(ids).to(lp_train.device)
    d = (lp_train[0].double() - lp_engine).abs()
    return {"rollout/logprob_diff_mean": float(d.mean()), "rollout/logprob_diff_max": float(d.max())}
