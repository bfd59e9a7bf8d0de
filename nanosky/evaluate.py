"""Held-out evaluation during training (`eval/*` tags, `Evaluator` decides when) and the weight sync with its probe.

evaluator = Evaluator(cfg, rollout, log, rank)
if evaluator.due(step): acc = evaluator(step, version)     # --eval.every k; the run's close evaluates the end
sync_weights(cfg, policy, engine, version, probe_ids)      # full tensors -> vLLM, then |trainer - engine| logprob
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import envs
from nanosky import dist
from nanosky.rollout.chat import encode_conversation
from nanosky.rollout.engine import StaleWeightsError, held_back
from nanosky.seeds import derive_seed
from nanosky.train.lora import iter_merged_params
from nanosky.train.policy import token_logprobs

if TYPE_CHECKING:
    from nanosky.config import TrainConfig
    from nanosky.logger import RunLogger
    from nanosky.rollout.collect import Rollout


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


def sync_weights(cfg: TrainConfig, policy, engine, version: int, probe_ids: list[int]) -> dict[str, float]:
    """Push the policy's weights to the engine as `version`, then check with the probe that it serves them."""
    if not cfg.debug.skip_sync:
        engine.load_weights(iter_merged_params(policy), version)  # LoRA merged in; plain models as they are
    else:
        engine.version = version  # testing only: pretend; the probe below must catch it
    m = probe(policy, engine, probe_ids, dist.get_info().device)
    tol = cfg.probe.max_mean_diff or (1e-3 if engine.dtype == "float32" else 0.05)
    warned = held_back()  # vLLM's "Failed to load weights" lines of this sync: the probe decides
    if m["rollout/logprob_diff_mean"] > tol:
        raise StaleWeightsError(
            f"engine is serving stale weights: mean |Δlogp| {m['rollout/logprob_diff_mean']:.4g} "
            f"> {tol} after sync to version {version}" + "".join(f"\n  vLLM: {w}" for w in warned)
        )
    return m


class Evaluator:
    """The held-out eval of a training run: `limit` test episodes × `n_samples`, split across ranks."""

    def __init__(self, cfg: TrainConfig, rollout: Rollout, log: RunLogger, rank: int):
        self.cfg, self.rollout, self.log = cfg, rollout, log
        # Same sampling seeds at every eval (common random numbers): accuracy changes come from the weights.
        self.sample_seed = derive_seed(cfg.seed, "eval", rank)

    def due(self, step: int) -> bool:
        """`--eval.every k`: every k steps; step 0 and the last step are evaluated by the run's start and close."""
        every = self.cfg.eval.every
        return bool(every) and step % every == 0 and step != self.cfg.steps

    def __call__(self, step: int, version: int) -> float:
        """Evaluate, log `eval/*` and the eval rollouts at `step`; returns the accuracy (mean@n success)."""
        cfg = self.cfg

        def rollout_fn(seeds: list[int]) -> list:
            return self.rollout.run(
                cfg.env, cfg.env_args(), "test", seeds, version,
                sample_seed=self.sample_seed, temperature=cfg.eval.temperature,
            )  # fmt: skip

        m, trajs = evaluate(rollout_fn, cfg.eval.limit, cfg.eval.n_samples)
        self.log.scalars(step, m)
        self.log.rollouts(step, trajs, self.rollout.tok, cfg.log.eval_samples, tag="eval")
        self.log.print(f"step {step}: eval accuracy {m['eval/accuracy']:.3f}")
        return m["eval/accuracy"]
