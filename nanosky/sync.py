"""The weight sync and its probe: the policy's full tensors (LoRA merged in) pushed to the colocated engine as a new
version, then a fixed sequence scored by both, so a stale or wrongly loaded engine stops the run at once.

    probe_ids = probe_sequence(tok, cfg.env, cfg.env_args())
    metrics = sync_weights(cfg, policy, engine, version, probe_ids)   # rollout/logprob_diff_mean, _max
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import envs
from nanosky.rollout.chat import encode_conversation
from nanosky.rollout.engine import StaleWeightsError, held_back
from nanosky.train.lora import iter_merged_params
from nanosky.train.policy import token_logprobs

if TYPE_CHECKING:
    from nanosky.config import TrainConfig


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
    """Push the policy's weights to the engine as `version`, then check with the probe that it serves them. An engine
    asleep (CUDA, after a rollout phase) wakes in two parts around the push; it ends fully awake."""
    engine.wake(
        "weights"
    )  # CUDA: the weights first; the KV cache is mapped after the push (TRL's, verl's order)
    if not cfg.debug.skip_sync:
        # LoRA merged in; gathered in the engine's dtype (bf16 on CUDA: half the bytes of an fp32 gather)
        engine.load_weights(iter_merged_params(policy, getattr(torch, engine.dtype)), version)
    else:
        engine.version = version  # testing only: pretend; the probe below must catch it
    engine.wake("kv_cache")
    m = probe(policy, engine, probe_ids, engine.info.device)
    tol = cfg.probe.max_mean_diff or (1e-3 if engine.dtype == "float32" else 0.05)
    warned = held_back()  # vLLM's "Failed to load weights" lines of this sync: the probe decides
    if m["rollout/logprob_diff_mean"] > tol:
        raise StaleWeightsError(
            f"engine is serving stale weights: mean |Δlogp| {m['rollout/logprob_diff_mean']:.4g} "
            f"> {tol} after sync to version {version}" + "".join(f"\n  vLLM: {w}" for w in warned)
        )
    return m
