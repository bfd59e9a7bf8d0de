"""The training loop: rollout → gather → advantages → update → sync → log → eval → checkpoint.

Every rank runs this same function (SPMD). `train(cfg)` is the whole job; `run.py` only parses flags and calls it.
The loop is `train`; each phase is a named call, and each component decides its own schedule
(`evaluator.due(step)`, `ckpt.due(step)`), as in torchtitan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers.utils import logging as hf_logging

import algos
from algos.registry import ADV_ESTIMATORS
from nanosky import dist, precision, process, trace
from nanosky.agent import EngineBackend
from nanosky.agent.player import Rollouts
from nanosky.bundled import Folders, resolve_folders
from nanosky.collect import Rollout, collect, players
from nanosky.config import TrainConfig
from nanosky.distill import Distillation
from nanosky.evaluate import Evaluator
from nanosky.logger import RunLogger
from nanosky.metrics import NoSignalWatch, Phases, step_metrics
from nanosky.rollout.chat import load_tokenizer
from nanosky.rollout.engine import Engine
from nanosky.rollout.envpool import EnvPool, InProcessPool, make_pool
from nanosky.stop import GracefulStop, resume_command
from nanosky.sync import Probe, build_probe, build_sync, sync_weights
from nanosky.train.batch import Batch, compute_advantages, signal_groups, split_groups, to_batch, token_rewards
from nanosky.train.checkpointer import Checkpointer
from nanosky.train.constrain import ChoiceMasker
from nanosky.train.critic import Critic, CriticUpdate, forward_values, load_critic
from nanosky.train.lora import adapters_off, check_platform, load_policy, load_reference
from nanosky.train.plan import Plan, decide
from nanosky.train.policy import checkpoint_dtype
from nanosky.train.step_credit import anchor_metrics, step_info
from nanosky.train.stepwise import assign_advantages, split_rows
from nanosky.train.stepwise import samples as stepwise_samples
from nanosky.train.tracer import Tracer
from nanosky.train.update import PolicyUpdate, forward_logprobs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


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
    evaluator: Evaluator
    probe: Probe  # the sync check: a fixed sequence, its tolerance calibrated at the build sync
    ckpt: Checkpointer | None = None
    ref: torch.nn.Module | None = None
    distill: Distillation | None = None  # --distill.teacher: the teacher's log-ratio is the advantage source
    critic: Critic | None = None
    critic_update: CriticUpdate | None = None
    version: int = 0
    step: int = 0  # last completed step (non-zero after a resume)
    acc0: float | None = None  # held-out accuracy before training
    n_params: int = 0  # the policy's parameters (all of them, LoRA's base too)
    masker: ChoiceMasker | None = None  # --rollout.constrain-actions: the constrained turns' masks
    plan: Plan | None = None  # what the build decided the models can do (packing, attention, head, probe)
    no_signal: NoSignalWatch = dataclasses.field(default_factory=NoSignalWatch)  # every advantage 0, 3 steps on


def build(cfg: TrainConfig, resources: contextlib.ExitStack, folders: Folders | None = None) -> Run:
    """Every component of the run; what holds processes, threads, sockets or files is closed by `resources` when the
    run ends, however it ends (torchtitan's one close in a finally). `folders`: the models start-up resolved."""
    info = dist.init_distributed(cfg.dist.timeout_s)  # run.py may have joined already; train(cfg) alone must too
    cfg.validate_for_world(info.world)
    hf_logging.disable_progress_bar()  # transformers' load / save bars, per model and checkpoint, broke into ours
    dist.seed_everything(cfg.seed + info.rank)
    # train(cfg) alone resolves them here, the main rank first (a GGUF file converts once)
    folders = folders or resolve_folders(cfg.model.path, cfg.distill.teacher, is_main=info.is_main)
    path = folders.model
    tok = load_tokenizer(path, cfg.model.chat_template)  # --model.chat-template replaces the model's own
    check_platform(cfg.lora, info.device.type)  # e.g. QLoRA on CPU fails here, not at step 1
    prec = precision.decide(cfg.precision, info.device.type)  # engine dtype and trainer compute, decided once
    policy = load_policy(path, cfg.lora, info, cfg.optim.activation_checkpointing, precision=prec)
    # Every trainer model is built before the engine: vLLM's Transformers backend rewrites transformers classes in
    # place when it starts, and the trainer's models hold private copies of theirs (`private_classes`).
    ref = load_reference(path, cfg.lora, info, policy, precision=prec) if cfg.algorithm.needs_ref else None
    critic = load_critic(path, info, precision=prec) if cfg.algorithm.needs_critic else None
    distill = Distillation.load(cfg.distill, folders.teacher, info, precision=prec) if cfg.distill.on else None
    # the engine starts with placeholder weights: the build sync below pushes the trainer's (one read of the checkpoint)
    engine = Engine(
        cfg.engine, path, info, log_path=os.path.join(cfg.run_dir, "engine.log"), weights="pushed", precision=prec
    )
    pool = make_pool(cfg.envpool.workers, cfg.envpool.step_timeout_s)
    resources.callback(pool.shutdown)
    backend = EngineBackend(engine, tok)
    player, heldout = players(cfg, backend, tok)  # SFT: the expert plays the training episodes, the policy the evals
    rollout = Rollout.from_config(cfg, backend, pool, tok, player)
    resources.callback(rollout.close, heldout)  # the players (the endpoint), then the rank's event loop
    log = RunLogger(cfg.run_dir, info.is_main, cfg.steps, cfg.log.tqdm)
    resources.callback(log.close)
    # what the models can do (the chunked head, packing and its attention), checked on them: a value, cfg untouched
    plan = decide(cfg.optim, prec, policy, (ref, distill and distill.teacher), critic, log.print)
    optim = plan.optim(cfg.optim)
    tracer = Tracer(cfg.log.samples_per_step, on=info.is_main)  # the update's traced rows, for the viewer
    run = Run(
        cfg=cfg,
        info=info,
        tok=tok,
        policy=policy,
        update=PolicyUpdate(optim, cfg.algorithm, policy, tracer, off_policy=cfg.rollout.partial),
        engine=engine,
        pool=pool,
        rollout=rollout,
        log=log,
        evaluator=Evaluator(cfg, rollout, log, info.rank, player=heldout),
        probe=build_probe(cfg, tok, policy.config),
        ref=ref,
        distill=distill,
        critic=critic,
        critic_update=CriticUpdate(optim, cfg.algorithm, critic) if critic is not None else None,
        masker=ChoiceMasker(tok, policy.config.vocab_size) if cfg.rollout.constrain_actions else None,
        plan=plan,
    )
    run.ckpt = Checkpointer(
        cfg,
        info,
        tok=tok,
        policy=policy,
        update=run.update,
        critic=run.critic,
        critic_update=run.critic_update,
        export_dtype=checkpoint_dtype(path),  # exports in the checkpoint's dtype (a bf16 base: bf16)
    )
    run.log.write_json("config.json", dataclasses.asdict(cfg))
    P, n, r = cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout
    run.n_params = sum(p.numel() for p in policy.parameters())
    run.log.print(  # the derived values, once
        f"nanosky: {cfg.algorithm.name} on {cfg.env} | world {info.world} ({info.backend}, {info.device.type}) | model {path} "
        f"({run.n_params / 1e6:.1f}M params) | {P} prompts x {n} = {P * n} trajectories/step ({P * n // info.world}/rank) | "
        f"micro-batch {optim.describe()} | tokens/turn {r.max_new_tokens}, total {r.max_total_tokens} | "
        f"{prec.line()}, engine {run.engine.dtype} | env pool {cfg.envpool.workers} workers/rank | run dir {cfg.run_dir}"
    )
    if cfg.resume:  # model, optimizer, schedule, RNG states, step, weight version; bad configs refused
        state = run.ckpt.resume()
        run.step, run.version, run.acc0 = state["step"], state["version"], state["acc0"]
        run.log.resumed_at(run.step)
        run.log.print(f"resumed from {state['path']} at step {run.step}")
    # The engine holds placeholder weights until this first push; the probe then calibrates on identical weights.
    m = build_sync(policy, run.engine, run.version, run.probe)  # or BuildRefused, on every rank alike
    run.plan = plan.calibrated(run.probe.tol)
    run.log.write_json("plan.json", dataclasses.asdict(run.plan))  # beside config.json: what ran, as decided
    run.log.scalars(run.step, m | {"rollout/probe_tol": run.probe.tol})
    return run


def prepare(run: Run, rollouts: Rollouts) -> tuple[Batch, dict[str, float], list | None]:
    """This rank's whole groups (step-wise: its share of the turns) as a padded batch, with the logprobs, values and
    advantages the update needs. Returns it, the advantage source's metrics (GiGPO's anchors, distillation's KL) and
    its rows' trajectories (None when step-wise: rows are turns, as the player said: `Rollouts.layout`)."""
    info, a, optim = run.info, run.cfg.algorithm, run.update.optim  # cfg.optim as the plan runs it
    meta = ADV_ESTIMATORS.meta(a.adv_estimator)
    trajs, stepwise = rollouts.trajs, rollouts.layout == "stepwise"
    if stepwise:  # one row per turn; advantages come from the episodes, so rows may go to any rank
        rows = stepwise_samples(trajs)
        mine = split_rows(rows, info.world)[info.rank]
        local = [None if j is None else rows[j] for j in mine]
    else:
        signal = signal_groups(trajs, a) if run.update.skip and run.distill is None else None  # the rows trained
        local = [trajs[i] for i in split_groups(trajs, info.world, signal)[info.rank]]
    batch = to_batch(local, run.tok.pad_token_id, info.device, run.masker)
    batch.layout = rollouts.layout  # what a row is: the tracer traces episodes' rows only
    if run.ref is not None:
        with adapters_off(run.ref):  # under LoRA the reference is the policy, adapters off
            batch.ref_logprobs = forward_logprobs(run.ref, batch, optim)
    if run.critic is not None:
        batch.values = forward_values(run.critic, batch, optim)
    rewards = outcome = token_rewards(batch)  # [B, L-1]
    if a.kl_in_reward and run.ref is not None:
        rewards = algos.kl_in_reward(
            rewards, batch.rollout_logprobs, batch.ref_logprobs, batch.loss_mask, a.kl_coef
        )  # [B, L-1]
    if stepwise and not meta["needs_values"]:  # the estimator runs on the episodes (train/stepwise.py)
        pen = (outcome - rewards).sum(-1) if rewards is not outcome else None  # [B] what the KL took
        metrics = assign_advantages(batch, trajs, rows, mine, cfg=a, penalty=pen, weight=run.cfg.rollout.step_weight)
    else:
        steps, metrics = None, {}
        if meta["needs_steps"]:
            steps = step_info(local)
            m = anchor_metrics(steps, [t.group for t in local], a.gamma, a.step_adv_mode)
            metrics = dict(zip(m, (v / info.world for v in dist.all_reduce_sum(list(m.values())))))
        compute_advantages(batch, a, rewards, steps)
    batch.advantages = algos.scale_negative(batch.advantages, a.neg_adv_scale)  # the returns keep the estimator's
    if run.distill is not None:  # the advantage source beside the estimator: the teacher's log-ratio (+ w × it)
        batch.advantages, batch.old_logprobs, m = run.distill.advantages(run.policy, batch, batch.advantages, optim)
        metrics |= m
    elif a.ppo_epochs > 1 or a.mini_batches > 1:  # else the update's first forward is the behaviour policy
        batch.old_logprobs = forward_logprobs(run.policy, batch, optim, signal_only=run.update.skip)
    return batch, metrics, None if stepwise else local


def update(run: Run, batch: Batch, step: int) -> dict[str, float]:
    """The critic's steps, then the policy's (PPO: the policy waits `critic_warmup_steps` for the critic)."""
    out = run.critic_update(batch) if run.critic_update is not None else {}
    if run.critic_update is None or step > run.cfg.algorithm.critic_warmup_steps:
        out |= run.update(batch, version=run.version)
    return out


def train(cfg: TrainConfig, folders: Folders | None = None) -> dict:
    process.record_launch()  # (run.py did already; train(cfg) called alone must too, before the engine starts)
    cfg.finalize()
    # SIGINT / SIGTERM: finish the step, then stop. `resources` closes the run's pools, endpoint, loop and logger
    # once, on success, stop and exception alike.
    with GracefulStop(announce=process.launch().rank == 0) as stop, contextlib.ExitStack() as resources:
        run = build(cfg, resources, folders)
        ph = Phases(cfg.run_dir, run.info.rank, cfg.log.profile_step)
        if run.acc0 is None:
            with ph(0, "eval"):  # distillation: the teacher's own held-out accuracy first, for reference
                if run.distill is not None:
                    run.distill.heldout(run)
                run.acc0 = run.evaluator.initial(run.version)
        acc, step_times = run.acc0, []
        for step in range(run.step + 1, cfg.steps + 1):
            if stop.requested():  # on any rank: every rank stops here, after the same step
                return stopped(run, ph, step - 1, stop.name)
            cfg.debug.fail_here(step, run.info.rank)
            t0 = time.perf_counter()
            with ph(step, "generate"):  # rollouts on every rank, then the global gather (+ DAPO rounds)
                run.engine.wake()
                rollouts, gen_m = collect(cfg, run.rollout, step, version=run.version, drain=run.ckpt.drains(step))
                run.engine.sleep()
            trajs = rollouts.trajs
            with ph(step, "logprob"):  # this rank's rows, old/ref logprobs, values, KL-in-reward, advantages
                batch, adv_m, local = prepare(run, rollouts)
            with ph(step, "train"):  # critic + policy optimizer steps
                upd = update(run, batch, step)
            # wake the weights → full tensors → vLLM, version += 1 → wake the cache → probe (--debug.skip-sync,
            # testing only: a stale engine the probe must catch)
            with ph(step, "sync"):
                run.version += 1
                sync_m = sync_weights(run.policy, run.engine, run.version, run.probe, not cfg.debug.skip_sync)
            run.step = step
            step_times.append(time.perf_counter() - t0)
            times = {"step": step_times[-1]} | {k: ph.times[k] for k in ("generate", "logprob", "train", "sync")}
            upd_m = {"train/" + k: v for k, v in upd.items() if not k.startswith("tokens_")}
            failed = run.pool.stats["failed"]
            m = step_metrics(trajs, batch, times, upd, envs_failed=failed, version=run.version, n_params=run.n_params)
            if "timing/judge_s" in gen_m:  # --reward.judge: the judge's share of the step
                gen_m["judge/step_share"] = gen_m["timing/judge_s"] / times["step"]
            run.log.scalars(step, m | ph.metrics() | gen_m | sync_m | upd_m | adv_m)
            logged, fields = trace.sample(
                trajs, local, batch, run.update.tracer, n=cfg.log.samples_per_step, max_tokens=cfg.log.sample_tokens
            )
            run.log.rollouts(step, logged, run.tok, len(logged), tokens=fields)
            if run.evaluator.due(step):
                with ph(step, "eval"):
                    acc = run.evaluator(step, run.version)
            reward = sum(x.reward for x in trajs) / len(trajs)
            run.log.progress({"reward": reward, "acc": acc, "s/step": times["step"]})  # acc: the latest eval
            if warning := run.no_signal(upd.get("skipped_rows_frac"), reward):
                run.log.print(warning)
            if run.ckpt.due(step):
                with ph(step, "checkpoint"):
                    run.ckpt.save(step, run.version, run.acc0)
        if cfg.dry_run:
            run.log.print(f"dry run ok: {ph.metrics()}")
        return close(run, run.evaluator.final(run.version, run.acc0), step_times)


def stopped(run: Run, ph: Phases, step: int, signal_name: str) -> dict:
    """The graceful stop after `step`: its checkpoint (unless on disk already) and the resume command."""
    with ph(step, "checkpoint"):
        run.ckpt.save_once(step, run.version, run.acc0)
    run.log.print(
        f"stopped by {signal_name} after step {step} of {run.cfg.steps}; checkpoint in "
        f"{run.cfg.run_dir}/checkpoints. Resume with:\n  {resume_command()}" + run.rollout.on_stop()
    )
    return {"stopped_at_step": step, "signal": signal_name}


def close(run: Run, acc: float, step_times: list[float]) -> dict:
    """The final checkpoint (+ HF export), summary.json and the closing lines (the run's resources are closed by
    `train`'s exit, as on a stop or an exception)."""
    cfg = run.cfg
    final = run.ckpt.save_once(cfg.steps, run.version, run.acc0)  # None: no step ran (--steps 0)
    summary = {
        "config": dataclasses.asdict(cfg),
        "steps": cfg.steps,
        "world_size": run.info.world,
        **run.evaluator.summary_fields(run.acc0, acc),
        "median_step_s": statistics.median(step_times) if step_times else None,
        "final_checkpoint": final,
    }
    run.log.write_json("summary.json", summary)
    run.log.close()  # the bar ends above the final lines
    median = summary["median_step_s"]
    run.log.print(
        f"done: {run.evaluator.summary(run.acc0, acc)} in {cfg.steps} steps; "
        + (f"median step {median:.2f} s" if median is not None else "no step timed")
        + run.evaluator.by_task_line()
        + run.log.outputs(final, cfg.model.path)
    )
    return summary
