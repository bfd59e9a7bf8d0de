"""The training loop: rollout → gather → advantages → update → sync → log → eval → checkpoint.

Every rank runs this same function (SPMD). `train(cfg)` is the whole job; `run.py` only parses flags and calls it.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

import algos
from algos.registry import ADV_ESTIMATORS
from nanosky import dist
from nanosky.agent import EngineBackend, Trajectory
from nanosky.agent.trajectory import env_step_stats
from nanosky.bundled import resolve_model_path
from nanosky.config import TrainConfig
from nanosky.evaluate import evaluate, probe, probe_sequence
from nanosky.logger import RunLogger
from nanosky.rollout.collect import Rollout
from nanosky.rollout.constrain import ChoiceMasker
from nanosky.rollout.engine import Engine, StaleWeightsError
from nanosky.rollout.envpool import EnvPool, InProcessPool, make_pool
from nanosky.rollout.stepwise import assign_advantages, split_rows
from nanosky.rollout.stepwise import samples as stepwise_samples
from nanosky.seeds import derive_seed
from nanosky.stop import GracefulStop, resume_command
from nanosky.train.batch import (
    Batch,
    compute_advantages,
    gather_trajectories,
    split_groups,
    to_batch,
    token_rewards,
)
from nanosky.train.checkpoint import (
    check_compatible,
    load_checkpoint,
    read_state,
    resolve_checkpoint,
    save_checkpoint,
)
from nanosky.train.critic import Critic, CriticUpdate, forward_values, load_critic
from nanosky.train.lora import check_platform, iter_merged_params, load_lora_model, save_adapter, save_merged
from nanosky.train.policy import load_model, save_hf
from nanosky.train.step_credit import action_spans, anchor_metrics, step_info
from nanosky.train.update import PolicyUpdate, forward_logprobs, train_perf

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def collect(cfg: TrainConfig, rollout: Rollout, step: int, version: int) -> tuple[list[Trajectory], dict]:
    """Generate this step's global batch (every rank's rollouts, gathered). With DAPO's dynamic sampling, more
    rounds are generated until `filter_groups` keeps a full batch or `max_gen_rounds` is reached."""
    info, a, P, n = dist.get_info(), cfg.algorithm, cfg.rollout.prompts_per_step, cfg.rollout.group_size
    kept: list[Trajectory] = []
    dropped: list[Trajectory] = []
    rounds = a.max_gen_rounds if a.dynamic_sampling else 1
    for rnd in range(rounds):
        js = list(range(info.rank, P, info.world))
        seeds = [derive_seed(cfg.seed, step, rnd, j) for j in js for _ in range(n)]
        groups = [rnd * P + j for j in js for _ in range(n)]
        sample_seed = derive_seed(cfg.seed, step, rnd, "sample", info.rank)
        new = gather_trajectories(
            rollout.run(cfg.env, cfg.env_args(), "train", seeds, version, groups, sample_seed)
        )
        if a.overlong_cache_len:
            overlong_penalty(new, cfg.rollout.max_new_tokens, a.overlong_cache_len)
        if not a.dynamic_sampling:
            kept = new
            break
        k, d = filter_groups(new)
        kept, dropped = kept + k, dropped + d
        if len(kept) >= P * n:
            rounds = rnd + 1
            break
    # Fixed batch size: truncate to P groups, or top up with dropped groups (zero advantage: no gradient signal).
    batch = (kept + dropped)[: P * n]
    return batch, {"train/dropped_groups": len(dropped) / n, "train/gen_rounds": rounds} | rollout.metrics


def overlong_penalty(trajs: list[Trajectory], max_len: int, cache_len: int) -> None:
    """DAPO's soft overlong punishment, added to each reward, on the policy's own tokens (not tool outputs): a turn
    that nears `max_len` (rollout.max_new_tokens, a per-turn cap) costs its episode; the longest turn counts."""
    longest = [max((b - a for a, b in action_spans(t.loss_mask)), default=0) for t in trajs]
    pen = algos.overlong_penalty(torch.tensor(longest), max_len, cache_len)
    for t, p in zip(trajs, pen.tolist()):
        t.reward += p


def filter_groups(trajs: list[Trajectory]) -> tuple[list[Trajectory], list[Trajectory]]:
    """DAPO's dynamic sampling: a group whose rewards are all equal has zero advantage everywhere (no signal).
    Returns (kept, dropped), whole groups each."""
    by_group: dict[int, list[Trajectory]] = {}
    for t in trajs:
        by_group.setdefault(t.group, []).append(t)
    kept, dropped = [], []
    for g in by_group.values():
        (kept if len({round(t.reward, 6) for t in g}) > 1 else dropped).extend(g)
    return kept, dropped


def prepare(run: Run, trajs: list[Trajectory]) -> tuple[Batch, dict[str, float]]:
    """This rank's whole groups (step-wise: its share of the turns) as a padded batch, with the logprobs and values
    the update needs, and advantages. Returns it and a step-level estimator's metrics (GiGPO's anchors)."""
    info, a, optim = run.info, run.cfg.algorithm, run.cfg.optim
    meta = ADV_ESTIMATORS.meta(a.adv_estimator)
    stepwise = run.cfg.rollout.mode == "stepwise"
    if stepwise:  # one row per turn; advantages come from the episodes, so rows may go to any rank
        rows = stepwise_samples(trajs)
        mine = split_rows(rows, info.world)[info.rank]
        local = [None if j is None else rows[j] for j in mine]
    else:
        local = [trajs[i] for i in split_groups(trajs, info.world)[info.rank]]
    batch = to_batch(local, run.tok.pad_token_id, info.device, run.masker)
    if run.ref is not None:
        batch.ref_logprobs = forward_logprobs(run.ref, batch, optim)
    if run.critic is not None:
        batch.values = forward_values(run.critic, batch, optim)
    rewards = outcome = token_rewards(batch)  # [B, L-1]
    if a.kl_in_reward and run.ref is not None:
        rewards = kl_in_reward(rewards, batch, a.kl_coef)
    if (
        stepwise and not meta["needs_values"]
    ):  # the estimator runs on the episodes (nanosky/rollout/stepwise.py)
        penalty = (outcome - rewards).sum(-1) if rewards is not outcome else None  # [B] what the KL took
        metrics = assign_advantages(batch, trajs, rows, mine, a, penalty, run.cfg.rollout.step_weight)
    else:
        steps, metrics = None, {}
        if meta["needs_steps"]:
            steps = step_info(local)
            m = anchor_metrics(steps, [t.group for t in local], a.gamma, a.step_adv_mode)
            metrics = dict(zip(m, (v / info.world for v in dist.all_reduce_sum(list(m.values())))))
        compute_advantages(batch, a, rewards, steps)
    # --algorithm.neg-adv-scale; the critic's returns keep the estimator's values
    batch.advantages = algos.scale_negative(batch.advantages, a.neg_adv_scale)
    if a.ppo_epochs > 1 or a.mini_batches > 1:  # otherwise the update's first forward is the behaviour policy
        batch.old_logprobs = forward_logprobs(run.policy, batch, optim, signal_only=run.update.skip)
    return batch, metrics


def kl_in_reward(rewards: torch.Tensor, batch: Batch, coef: float) -> torch.Tensor:
    """Token rewards minus β·k1 KL (engine logprobs vs the reference), as REINFORCE++ and PPO-RLHF shape them."""
    return (
        rewards - coef * algos.kl_penalty(batch.rollout_logprobs, batch.ref_logprobs, "k1") * batch.loss_mask
    )


def sync_weights(cfg: TrainConfig, policy, engine, version: int, probe_ids: list[int]) -> dict[str, float]:
    if not cfg.probe.skip_sync:
        engine.load_weights(iter_merged_params(policy), version)  # LoRA merged in; plain models as they are
    else:
        engine.version = version  # testing only: pretend; the probe below must catch it
    m = probe(policy, engine, probe_ids, dist.get_info().device)
    tol = cfg.probe.max_mean_diff or (1e-3 if engine.dtype == "float32" else 0.05)
    if m["rollout/logprob_diff_mean"] > tol:
        raise StaleWeightsError(
            f"engine is serving stale weights: mean |Δlogp| {m['rollout/logprob_diff_mean']:.4g} "
            f"> {tol} after sync to version {version}"
        )
    return m


@dataclass
class Run:
    """Everything `train` builds, on every rank."""

    cfg: TrainConfig
    info: dist.DistInfo
    tok: PreTrainedTokenizerBase
    policy: torch.nn.Module
    update: PolicyUpdate  # the policy's optimizer, schedule and loss
    engine: Engine
    pool: EnvPool | InProcessPool
    rollout: Rollout
    log: RunLogger
    probe_ids: list[int]
    ref: torch.nn.Module | None = None
    critic: Critic | None = None
    critic_update: CriticUpdate | None = None
    version: int = 0
    step: int = 0  # last completed step (non-zero after a resume)
    acc0: float | None = None  # held-out accuracy before training
    n_params: int = 0  # the policy's parameters (all of them, LoRA's base too)
    masker: ChoiceMasker | None = None  # --rollout.constrain-actions: the constrained turns' masks


def build(cfg: TrainConfig) -> Run:
    info = dist.init_distributed(
        cfg.dist.timeout_s
    )  # run.py may have joined already; train(cfg) alone must too
    cfg.validate_for_world(info.world)
    dist.seed_everything(cfg.seed + info.rank)
    from transformers import AutoTokenizer

    if info.is_main:  # build the bundled model once, before other ranks look for it
        resolve_model_path(cfg.model.path)
    dist.barrier()
    path = resolve_model_path(cfg.model.path)
    tok = AutoTokenizer.from_pretrained(path)
    check_platform(cfg.lora, info.device.type)  # e.g. QLoRA on CPU fails here, not at step 1
    policy = load_lora_model(path, cfg.lora, info) if cfg.lora.enabled else load_model(path, info)
    run = Run(
        cfg=cfg,
        info=info,
        tok=tok,
        policy=policy,
        update=PolicyUpdate(cfg.optim, cfg.algorithm, policy),
        engine=(engine := Engine(cfg.engine, path, info, log_path=os.path.join(cfg.run_dir, "engine.log"))),
        pool=(pool := make_pool(cfg.envpool.workers, cfg.envpool.step_timeout_s)),
        rollout=Rollout(cfg.rollout, EngineBackend(engine, tok), pool, tok),
        log=RunLogger(cfg.run_dir, info.is_main, cfg.steps, cfg.log.tqdm),
        probe_ids=probe_sequence(tok, cfg.env, cfg.env_args()),
        masker=ChoiceMasker(tok, policy.config.vocab_size) if cfg.rollout.constrain_actions else None,
    )
    if cfg.algorithm.needs_ref:  # frozen copy of the starting policy (the base model when training LoRA)
        run.ref = load_model(path, info, trainable=False)
    if cfg.algorithm.needs_critic:
        run.critic = load_critic(path, info)
        run.critic_update = CriticUpdate(cfg.optim, cfg.algorithm, run.critic)
    run.log.write_json("config.json", dataclasses.asdict(cfg))
    P, n, r = cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout
    run.n_params = sum(p.numel() for p in policy.parameters())
    run.log.print(  # the derived values, once
        f"nanosky: {cfg.algorithm.name} on {cfg.env} | world {info.world} ({info.backend}, {info.device.type}) | model {path} "
        f"({run.n_params / 1e6:.1f}M params) | {P} prompts x {n} = {P * n} trajectories/step ({P * n // info.world}/rank) | "
        f"micro-batch {cfg.optim.describe()} | tokens/turn {r.max_new_tokens}, total {r.max_total_tokens} | "
        f"engine {run.engine.dtype} | env pool {cfg.envpool.workers} workers/rank | run dir {cfg.run_dir}"
    )
    if cfg.resume:
        resume(run)
    # The engine loaded the checkpoint from disk; push the trainer's weights anyway so the probe checks a real sync.
    run.log.scalars(run.step, sync_weights(cfg, policy, run.engine, run.version, run.probe_ids))
    return run


RESUME_FIELDS = [
    "model.path",
    "world_size",
    "lora.rank",
    "lora.alpha",
    "lora.target_modules",
    "algorithm.name",
    "algorithm.adv_estimator",
    "algorithm.policy_loss",
    "env",
    "seed",
    "rollout.prompts_per_step",
    "rollout.group_size",
]


def resume_checkpoint(cfg: TrainConfig, world: int) -> str:
    """The checkpoint `--resume` names; raises FileNotFoundError if there is none, ValueError if its config differs
    in a field that breaks resume (also run by `nanosky.preflight` before anything is built)."""
    path = resolve_checkpoint(os.path.join(cfg.run_dir, "checkpoints"), cfg.resume)
    saved = read_state(path)
    check_compatible(
        saved["config"] | {"world_size": saved["world_size"]},
        dataclasses.asdict(cfg) | {"world_size": world},
        RESUME_FIELDS,
    )
    return path


def resume(run: Run) -> None:
    """Restore model, optimizer, schedule, step, weight version and every RNG state; refuse incompatible configs."""
    path = resume_checkpoint(run.cfg, run.info.world)
    state = load_checkpoint(
        path, model=run.policy, optimizer=run.update.opt, scheduler=run.update.sched, **_extras(run)
    )
    run.step, run.version, run.acc0 = state["step"], state["version"], state["acc0"]
    run.log.resumed_at(run.step)
    run.log.print(f"resumed from {path} at step {run.step}")


def _extras(run: Run) -> dict:
    if run.critic is None:
        return {}
    return {"extra_models": {"critic": run.critic}, "extra_optimizers": {"critic": run.critic_update.opt}}


def checkpoint(run: Run, step: int) -> str:
    """Atomic training checkpoint + HF export in step_N/export (what the evals take via --ckpt)."""
    cfg, info = run.cfg, run.info

    def export(d: str) -> None:
        if cfg.lora.enabled:
            save_adapter(run.policy, os.path.join(d, "adapter"))
            save_merged(run.policy, run.tok, d)
        else:
            save_hf(run.policy, run.tok, d, info)

    state = {
        "step": step,
        "version": run.version,
        "acc0": run.acc0,
        "config": dataclasses.asdict(cfg),
        "world_size": info.world,
    }
    path = save_checkpoint(
        os.path.join(cfg.run_dir, "checkpoints"),
        step,
        model=run.policy,
        optimizer=run.update.opt,
        scheduler=run.update.sched,
        state=state,
        keep=cfg.log.keep_ckpts,
        export=export,
        **_extras(run),
    )
    return os.path.join(path, "export")


def run_eval(run: Run, step: int) -> float:
    cfg = run.cfg
    # Same sampling seeds at every eval (common random numbers): accuracy changes come from the weights.
    sample_seed = derive_seed(cfg.seed, "eval", run.info.rank)
    m, trajs = evaluate(
        lambda seeds: run.rollout.run(
            cfg.env,
            cfg.env_args(),
            "test",
            seeds,
            run.version,
            sample_seed=sample_seed,
            temperature=cfg.eval.temperature,
        ),  # fmt: skip
        cfg.eval.limit,
        cfg.eval.n_samples,
    )
    run.log.scalars(step, m)
    run.log.rollouts(step, trajs, run.tok, cfg.log.eval_samples, tag="eval")
    run.log.print(f"step {step}: eval accuracy {m['eval/accuracy']:.3f}")
    return m["eval/accuracy"]


def update(run: Run, batch: Batch, step: int) -> dict[str, float]:
    """The critic's steps, then the policy's (PPO: the policy waits `critic_warmup_steps` for the critic)."""
    out = run.critic_update(batch) if run.critic_update is not None else {}
    if run.critic_update is None or step > run.cfg.algorithm.critic_warmup_steps:
        out |= run.update(batch)
    return out


def step_metrics(
    run: Run, trajs: list[Trajectory], batch: Batch, times: dict[str, float], upd: dict[str, float]
) -> dict[str, float]:
    n = len(trajs)
    n_tok = sum(t.n_policy_tokens for t in trajs)
    calls = sum(t.tool_calls for t in trajs)
    adv = batch.advantages[batch.loss_mask > 0]
    return (
        {
            "train/reward_mean": sum(t.reward for t in trajs) / n,
            "train/success_rate": sum(t.success for t in trajs) / n,
            "train/response_len": n_tok / n,
            "train/adv_mean": float(adv.mean()) if adv.numel() else 0.0,
            "train/adv_std": float(adv.std()) if adv.numel() > 1 else 0.0,
            "train/adv_min": float(adv.min()) if adv.numel() else 0.0,
            "rollout/turns_mean": sum(t.turns for t in trajs) / n,
            "envs/failed": dist.all_reduce_sum([float(run.pool.stats["failed"])])[0],
            "tools/calls_per_traj": calls / n,
            "tools/invalid_rate": sum(t.invalid_tool_calls for t in trajs) / max(1, calls),
            "perf/tokens_per_s": n_tok / times["step"],
            "perf/rollout_tokens_per_s": n_tok / times["generate"],
            "version": run.version,
        }
        | {f"timing/{k}_s": v for k, v in times.items()}
        | env_step_stats(trajs)
        | train_perf(upd, run.n_params, times["train"])
    )


class Phases:
    """Per-phase wall time and peak memory, and a heartbeat line per rank (`run_dir/heartbeat.rank{r}`: where a hung
    or killed job last was)."""

    def __init__(self, run_dir: str, rank: int):
        os.makedirs(run_dir, exist_ok=True)
        self.beat = open(os.path.join(run_dir, f"heartbeat.rank{rank}"), "a", buffering=1)
        self.rank, self.times, self.mem = rank, {}, {}

    @contextmanager
    def __call__(self, step: int, name: str):
        self.beat.write(
            f"{time.strftime('%H:%M:%S')} rank {self.rank} pid {os.getpid()} step {step} {name}\n"
        )
        t0 = time.perf_counter()
        yield
        self.times[name] = time.perf_counter() - t0
        self.mem[name] = dist.memory_gib()

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}_s": v for k, v in self.times.items()} | {
            f"memory/{k}_gib": v for k, v in self.mem.items()
        }


def train(cfg: TrainConfig) -> dict:
    cfg.finalize()
    with GracefulStop(
        announce=dist.launch_rank() == 0
    ) as stop:  # SIGINT / SIGTERM: finish the step, then stop
        run = build(cfg)
        ph = Phases(cfg.run_dir, run.info.rank)
        if run.acc0 is None:
            with ph(0, "eval"):
                run.acc0 = run_eval(run, 0) if cfg.eval.every or not cfg.dry_run else 0.0
        acc, start = run.acc0, run.step
        step_times: list[float] = []
        for step in range(run.step + 1, cfg.steps + 1):
            if stop.requested():  # on any rank: every rank stops here, after the same step
                return stopped(run, ph, step - 1, step - 1 > start, stop.name)
            if step == cfg.dist.fail_step and run.info.rank == cfg.dist.fail_rank:
                raise RuntimeError(
                    f"injected failure on rank {run.info.rank} at step {step} (--dist.fail-rank)"
                )
            t0 = time.perf_counter()
            with ph(step, "generate"):  # rollouts on every rank, then the global gather (+ DAPO rounds)
                run.engine.wake()
                trajs, gen_m = collect(cfg, run.rollout, step, run.version)
                run.engine.sleep()
            # this rank's whole groups, old/ref logprobs, values, KL-in-reward, advantages
            with ph(step, "logprob"):
                batch, adv_m = prepare(run, trajs)
            with ph(step, "train"):  # critic + policy optimizer steps
                upd = update(run, batch, step)
            with ph(step, "sync"):  # full tensors → vLLM, version += 1, probe
                run.engine.wake()
                run.version += 1
                sync_m = sync_weights(cfg, run.policy, run.engine, run.version, run.probe_ids)
            run.step = step
            step_times.append(time.perf_counter() - t0)
            times = {"step": step_times[-1]} | {
                k: ph.times[k] for k in ("generate", "logprob", "train", "sync")
            }
            upd_m = {"train/" + k: v for k, v in upd.items() if not k.startswith("tokens_")}
            run.log.scalars(
                step,
                step_metrics(run, trajs, batch, times, upd) | ph.metrics() | gen_m | sync_m | upd_m | adv_m,
            )
            run.log.rollouts(step, trajs, run.tok, cfg.log.samples_per_step)
            run.log.progress(
                {"reward": sum(x.reward for x in trajs) / len(trajs), "acc": acc, "s/step": times["step"]}
            )
            if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.steps:
                with ph(step, "eval"):
                    acc = run_eval(run, step)
            if cfg.log.ckpt_every and step % cfg.log.ckpt_every == 0 and step != cfg.steps:
                with ph(step, "checkpoint"):
                    checkpoint(run, step)
        if cfg.dry_run:
            run.log.print(f"dry run ok: {ph.metrics()}")
            return close(run, run.acc0, run.acc0, step_times)
        return close(run, run.acc0, run_eval(run, cfg.steps) if cfg.steps else run.acc0, step_times)


def stopped(run: Run, ph: Phases, step: int, new_work: bool, signal_name: str) -> dict:
    """The graceful stop after `step`: its checkpoint (unless the schedule wrote it, or no step ran since the start)
    and the resume command."""
    cfg = run.cfg
    if new_work and not (cfg.log.ckpt_every and step % cfg.log.ckpt_every == 0):
        with ph(step, "checkpoint"):
            checkpoint(run, step)
    run.log.print(
        f"stopped by {signal_name} after step {step} of {cfg.steps}; checkpoint in {cfg.run_dir}/checkpoints. "
        f"Resume with:\n  {resume_command()}"
    )
    run.log.close()
    run.pool.shutdown()
    return {"stopped_at_step": step, "signal": signal_name}


def close(run: Run, acc0: float, acc: float, step_times: list[float]) -> dict:
    cfg = run.cfg
    final = checkpoint(run, cfg.steps)
    summary = {
        "config": dataclasses.asdict(cfg),
        "steps": cfg.steps,
        "world_size": run.info.world,
        "eval_accuracy_initial": acc0,
        "eval_accuracy_final": acc,
        "median_step_s": statistics.median(step_times) if step_times else None,
        "final_checkpoint": final,
    }
    run.log.write_json("summary.json", summary)
    run.log.print(
        f"eval accuracy {acc0:.3f} -> {acc:.3f}; median step {summary['median_step_s']}s; "
        f"run dir {cfg.run_dir}"
    )
    run.log.close()
    run.pool.shutdown()
    return summary
