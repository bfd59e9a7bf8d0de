"""What a training step logs: per-phase wall time and peak memory (`Phases`, with a heartbeat file per rank) and the
step's scalars (`step_metrics`: rewards, advantages, turns, tools, env failures, throughput)."""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager

from nanosky import dist
from nanosky.agent import Trajectory
from nanosky.agent.trajectory import env_step_stats, success_rate
from nanosky.train.batch import Batch
from nanosky.train.update import train_perf


class Phases:
    """Per-phase wall time and peak memory, and a heartbeat line per rank (`run_dir/heartbeat.rank{r}`: where a hung
    or killed job last was)."""

    PROFILED = ("logprob", "train", "sync")

    def __init__(self, run_dir: str, rank: int, profile_step: int = 0):
        os.makedirs(run_dir, exist_ok=True)
        self.beat = open(os.path.join(run_dir, f"heartbeat.rank{rank}"), "a", buffering=1)
        self.rank, self.times, self.mem = rank, {}, {}
        self.run_dir, self.profile_step = run_dir, profile_step

    @contextmanager
    def __call__(self, step: int, name: str):
        self.beat.write(f"{time.strftime('%H:%M:%S')} rank {self.rank} pid {os.getpid()} step {step} {name}\n")
        with self._profiled(step, name):
            t0 = time.perf_counter()
            yield
            self.times[name] = time.perf_counter() - t0
        self.mem[name] = dist.memory_gib()

    @contextmanager
    def _profiled(self, step: int, name: str):
        """`--log.profile-step`: torch.profiler around this phase, its trace written to `profile/` (rank-local)."""
        if step != self.profile_step or name not in self.PROFILED:
            yield
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=acts) as prof:
            yield
        out = os.path.join(self.run_dir, "profile")
        os.makedirs(out, exist_ok=True)
        stem = os.path.join(out, f"step{step}.rank{self.rank}.{name}")
        prof.export_chrome_trace(stem + ".trace.json")
        with open(stem + ".txt", "w") as f:
            f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}_s": v for k, v in self.times.items()} | {f"memory/{k}_gib": v for k, v in self.mem.items()}


def step_metrics(
    trajs: list[Trajectory],
    batch: Batch,
    times: dict[str, float],
    upd: dict[str, float],
    *,
    envs_failed: int,
    version: int,
    n_params: int,
) -> dict[str, float]:
    """One step's scalars from its global batch `trajs`, this rank's `batch`, the phase `times` and the update's
    metrics `upd`; `envs_failed` is this rank's env pool count (summed over ranks here)."""
    n = len(trajs)
    n_tok = sum(t.n_policy_tokens for t in trajs)
    calls = sum(t.tool_calls for t in trajs)
    adv = batch.advantages[batch.loss_mask > 0]  # [N] the trained tokens' advantages
    return (
        {
            "train/reward_mean": sum(t.reward for t in trajs) / n,
            "train/success_rate": success_rate(trajs),
            "train/response_len": n_tok / n,
            # over no trained token (every episode of this rank masked out): NaN, not a reassuring 0
            "train/adv_mean": float(adv.mean()) if adv.numel() else math.nan,
            "train/adv_std": float(adv.std()) if adv.numel() > 1 else math.nan,
            "train/adv_min": float(adv.min()) if adv.numel() else math.nan,
            "rollout/turns_mean": sum(t.turns for t in trajs) / n,
            # episodes whose opening left no room for a reply (--rollout.max-total-tokens): skipped, not scored
            "rollout/prompt_too_long": float(sum(t.stop_reason == "prompt_too_long" for t in trajs)),
            "envs/failed": dist.all_reduce_sum([float(envs_failed)])[0],
            "tools/calls_per_traj": calls / n,
            "tools/invalid_rate": sum(t.invalid_tool_calls for t in trajs) / calls if calls else math.nan,
            "perf/tokens_per_s": n_tok / times["step"],
            "perf/rollout_tokens_per_s": n_tok / times["generate"],
            "version": version,
        }
        | {f"timing/{k}_s": v for k, v in times.items()}
        | env_step_stats(trajs)
        | train_perf(upd, n_params, times["train"])
    )


class NoSignalWatch:
    """Says so, once, when `patience` steps in a row trained on nothing: every group's rewards were equal, so every
    advantage was 0 (`train/skipped_rows_frac` 1.0). A run in that state logs normal-looking curves and learns
    nothing, and the usual cause is the env or the budget, not the algorithm."""

    def __init__(self, patience: int = 3):
        self.patience, self.streak, self.warned = patience, 0, False

    def __call__(self, skipped_rows_frac: float | None, reward_mean: float) -> str | None:
        self.streak = self.streak + 1 if skipped_rows_frac is not None and skipped_rows_frac >= 1.0 else 0
        if self.streak < self.patience or self.warned:
            return None
        self.warned = True
        return (
            f"nanosky: warning: for {self.streak} steps in a row every group's rewards were equal "
            f"(train/skipped_rows_frac 1.0, reward mean {reward_mean:.3f}), so no step has learned anything. Check "
            "that the env's reward can differ between samples of one prompt (rollouts.jsonl holds each sample's "
            "reward and stop reason), that --rollout.max-new-tokens leaves room to finish an answer, and that the "
            "task is neither always solved nor never solved by this model (--rollout.group-size, the temperature)."
        )
