"""The training loop: rollout → gather → advantages → update → sync → log → eval → checkpoint.

Every rank runs this same function (SPMD). `train(cfg)` is the whole job; `run.py` only parses flags and calls it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import statistics
import time

import torch

import algos
import envs
from nanosky import dist
from nanosky.batch import Batch, balanced_split, compute_advantages, gather_trajectories, to_batch
from nanosky.config import TrainConfig
from nanosky.critic import critic_update, forward_values, load_critic
from nanosky.engine import Engine, StaleWeightsError
from nanosky.evaluate import evaluate, probe, probe_sequence
from nanosky.logger import RunLogger
from nanosky.policy import iter_full_params, load_model, resolve_model_path, save_hf
from nanosky.rollout import Trajectory, run_episodes
from nanosky.update import forward_logprobs, policy_update


def _env_seed(seed: int, step: int, rnd: int, j: int) -> int:
    """Deterministic prompt choice: the data position is (step, round, index), so a resumed run sees the same data."""
    h = hashlib.blake2b(f"{seed}/{step}/{rnd}/{j}".encode(), digest_size=6).digest()
    return int.from_bytes(h, "little")


def collect(cfg: TrainConfig, engine, tok, step: int, version: int) -> tuple[list[Trajectory], dict[str, float]]:
    """Generate this step's global batch. With dynamic sampling (DAPO), groups whose rewards are all equal carry no
    signal and are dropped; more rounds are generated until the batch is full or `max_gen_rounds` is reached."""
    info, P, n = dist.get_info(), cfg.rollout.prompts_per_step, cfg.rollout.group_size
    env_kw = cfg.env_args()
    kept: list[Trajectory] = []
    dropped: list[Trajectory] = []
    rounds = 0
    for rnd in range(cfg.algorithm.max_gen_rounds if cfg.algorithm.dynamic_sampling else 1):
        rounds += 1
        js = list(range(info.rank, P, info.world))
        seeds = [_env_seed(cfg.seed, step, rnd, j) for j in js for _ in range(n)]
        groups = [rnd * P + j for j in js for _ in range(n)]
        es = [envs.make(cfg.env, split="train", seed=s, **env_kw) for s in seeds]
        local = run_episodes(engine, tok, es, cfg.rollout, groups=groups, seeds=seeds, version=version)
        new = gather_trajectories(local)
        if cfg.algorithm.overlong_cache_len:  # DAPO soft overlong punishment, on the policy's own tokens
            pen = algos.overlong_penalty(torch.tensor([t.n_policy_tokens for t in new]), cfg.rollout.max_new_tokens,
                                         cfg.algorithm.overlong_cache_len)
            for t, p in zip(new, pen.tolist()):
                t.reward += p
        if not cfg.algorithm.dynamic_sampling:
            kept = new
            break
        by_group: dict[int, list[Trajectory]] = {}
        for t in new:
            by_group.setdefault(t.group, []).append(t)
        for g in by_group.values():
            (kept if len({round(t.reward, 6) for t in g}) > 1 else dropped).extend(g)
        if len(kept) >= P * n:
            break
    # Fixed batch size: truncate to P groups, or top up with dropped groups (zero advantage: no gradient signal).
    batch = (kept + dropped)[: P * n]
    return batch, {"train/dropped_groups": len(dropped) / n, "train/gen_rounds": rounds}


def _to_global(local: torch.Tensor, local_idx: list[int], like: torch.Tensor) -> torch.Tensor:
    """Place this rank's rows at their global positions; the sum over ranks is the global tensor."""
    out = torch.zeros_like(like)
    out[local_idx, : local.shape[1]] = local
    torch.distributed.all_reduce(out)
    return out


def prepare(cfg: TrainConfig, trajs: list[Trajectory], policy, ref, critic, tok) -> Batch:
    """This rank's token-balanced share, with old/ref logprobs and advantages over the global batch."""
    info = dist.get_info()
    parts = balanced_split([len(t.ids) for t in trajs], info.world)
    local_idx = parts[info.rank]
    batch = to_batch([trajs[i] for i in local_idx], tok.pad_token_id, info.device)
    a, mbs = cfg.algorithm, cfg.optim.micro_batch_size
    if a.ppo_epochs > 1 or a.mini_batches > 1:  # otherwise the update's first forward is the behaviour policy
        batch.old_logprobs = forward_logprobs(policy, batch, mbs)
    if ref is not None:
        batch.ref_logprobs = forward_logprobs(ref, batch, mbs)
    full = to_batch(trajs, tok.pad_token_id, info.device)  # global, for group statistics and whitening
    token_rewards = algos.scalar_to_token_rewards(full.rewards, full.loss_mask)
    if a.kl_in_reward and ref is not None:  # k1 KL (engine logprobs vs reference) subtracted from token rewards
        kl = algos.kl_penalty(batch.rollout_logprobs, batch.ref_logprobs, "k1") * batch.loss_mask
        token_rewards = token_rewards - a.kl_coef * _to_global(kl, local_idx, full.loss_mask)
    rows = {"token_rewards": token_rewards, "response_mask": full.loss_mask, "group_index": full.group_index,
            "local_index": torch.tensor(local_idx, device=info.device)}
    if critic is not None:
        batch.values = forward_values(critic, batch, mbs)
        rows["values"] = _to_global(batch.values, local_idx, full.loss_mask)
    compute_advantages(batch, a, rows)
    T = batch.loss_mask.shape[1]
    batch.advantages, batch.returns = batch.advantages[:, :T], batch.returns[:, :T]
    return batch


def sync_weights(cfg: TrainConfig, policy, engine, version: int, probe_ids: list[int]) -> dict[str, float]:
    if not cfg.probe.skip_sync:
        engine.load_weights(iter_full_params(policy), version)
    else:
        engine.version = version  # testing only: pretend; the probe below must catch it
    m = probe(policy, engine, probe_ids, dist.get_info().device)
    tol = cfg.probe.max_mean_diff or (1e-3 if engine.dtype == "float32" else 0.05)
    if m["rollout/logprob_diff_mean"] > tol:
        raise StaleWeightsError(f"engine is serving stale weights: mean |Δlogp| {m['rollout/logprob_diff_mean']:.4g} "
                                f"> {tol} after sync to version {version}")
    return m


def train(cfg: TrainConfig) -> dict:
    # ---- build -------------------------------------------------------------------------------------------------
    info = dist.init_distributed()
    cfg.validate_for_world(info.world)
    dist.seed_everything(cfg.seed + info.rank)
    from transformers import AutoTokenizer

    if info.is_main:  # build the bundled model once, before other ranks look for it
        model_path = resolve_model_path(cfg.model.path)
    dist.barrier()
    model_path = resolve_model_path(cfg.model.path)
    tok = AutoTokenizer.from_pretrained(model_path)
    policy = load_model(model_path, info)
    ref = load_model(model_path, info, trainable=False) if cfg.algorithm.needs_ref else None
    critic = load_critic(model_path, info) if cfg.algorithm.needs_critic else None
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=cfg.algorithm.critic_lr) if critic else None
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas,
                            weight_decay=cfg.optim.weight_decay)
    warm = cfg.optim.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    engine = Engine(cfg.engine, model_path, info)
    run_dir = cfg.run_dir
    log = RunLogger(run_dir, info.is_main, cfg.steps, cfg.log.tqdm)
    log.write_json("config.json", dataclasses.asdict(cfg))
    env_kw = cfg.env_args()
    probe_ids = probe_sequence(tok, cfg.env, env_kw)
    norm_const = cfg.algorithm.norm_const or cfg.rollout.max_new_tokens * (cfg.rollout.max_turns or 1)
    version = 0
    log.scalars(0, sync_weights(cfg, policy, engine, version, probe_ids))  # the engine starts on the same weights

    def run_eval(step: int) -> float:
        m, trajs = evaluate(engine, tok, cfg.env, env_kw, cfg.rollout, cfg.eval.limit, cfg.eval.n_samples,
                            cfg.eval.temperature, version)
        log.scalars(step, m)
        log.rollouts(step, trajs, tok, 2, tag="eval")
        log.print(f"step {step}: eval accuracy {m['eval/accuracy']:.3f}")
        return m["eval/accuracy"]

    acc0 = acc = run_eval(0)
    step_times: list[float] = []
    # ---- train -------------------------------------------------------------------------------------------------
    for step in range(1, cfg.steps + 1):
        t0 = time.perf_counter()
        engine.wake()
        trajs, gen_m = collect(cfg, engine, tok, step, version)
        engine.sleep()
        t1 = time.perf_counter()
        batch = prepare(cfg, trajs, policy, ref, critic, tok)
        t2 = time.perf_counter()
        upd = {}
        if critic is not None:
            upd = critic_update(critic, critic_opt, batch, cfg.algorithm, cfg.optim.micro_batch_size,
                                cfg.optim.grad_clip, norm_const)
        if step > cfg.algorithm.critic_warmup_steps or critic is None:  # PPO: let the critic settle first
            upd |= policy_update(policy, opt, sched, batch, cfg.algorithm, cfg.optim.micro_batch_size,
                                 cfg.optim.grad_clip, norm_const)
        t3 = time.perf_counter()
        engine.wake()
        version += 1
        sync_m = sync_weights(cfg, policy, engine, version, probe_ids)
        t4 = time.perf_counter()
        step_times.append(t4 - t0)
        n_tok = sum(t.n_policy_tokens for t in trajs)
        rewards = torch.tensor([t.reward for t in trajs])
        metrics = {
            "train/reward_mean": float(rewards.mean()), "train/success_rate": sum(t.success for t in trajs) / len(trajs),
            "train/response_len": n_tok / len(trajs), "train/adv_mean": float(batch.advantages[batch.loss_mask > 0].mean()),
            "train/adv_std": float(batch.advantages[batch.loss_mask > 0].std()) if batch.loss_mask.sum() > 1 else 0.0,
            "rollout/turns_mean": sum(t.turns for t in trajs) / len(trajs),
            "tools/calls_per_traj": sum(t.tool_calls for t in trajs) / len(trajs),
            "tools/invalid_rate": sum(t.invalid_tool_calls for t in trajs) / max(1, sum(t.tool_calls for t in trajs)),
            "timing/generate_s": t1 - t0, "timing/logprob_s": t2 - t1, "timing/train_s": t3 - t2, "timing/sync_s": t4 - t3,
            "timing/step_s": t4 - t0, "perf/tokens_per_s": n_tok / (t4 - t0), "version": version,
        } | gen_m | sync_m | {"train/" + k: v for k, v in upd.items()}
        log.scalars(step, metrics)
        log.rollouts(step, trajs, tok, cfg.log.samples_per_step)
        log.progress({"reward": metrics["train/reward_mean"], "acc": acc, "s/step": t4 - t0})
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.steps:
            acc = run_eval(step)
        if cfg.log.ckpt_every and step % cfg.log.ckpt_every == 0 and step != cfg.steps:
            save_hf(policy, tok, os.path.join(run_dir, "checkpoints", f"step_{step:06d}"), info)
    # ---- close -------------------------------------------------------------------------------------------------
    acc = run_eval(cfg.steps) if cfg.steps else acc0
    save_hf(policy, tok, os.path.join(run_dir, "checkpoints", f"step_{cfg.steps:06d}"), info)
    summary = {
        "config": dataclasses.asdict(cfg), "steps": cfg.steps, "world_size": info.world,
        "eval_accuracy_initial": acc0, "eval_accuracy_final": acc,
        "median_step_s": statistics.median(step_times) if step_times else None,
        "final_checkpoint": os.path.join(run_dir, "checkpoints", f"step_{cfg.steps:06d}"),
    }
    log.write_json("summary.json", summary)
    log.print(f"eval accuracy {acc0:.3f} -> {acc:.3f}; median step {summary['median_step_s']}s; run dir {run_dir}")
    log.close()
    return summary
