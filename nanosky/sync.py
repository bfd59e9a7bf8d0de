"""The weight sync and its probe: the policy's full tensors (LoRA merged in) pushed to the colocated engine as a new
version, then a fixed sequence scored by both, so a stale or wrongly loaded engine stops the run at once.

    probe = Probe(probe_sequence(tok, cfg.env, cfg.env_args()), cfg.probe.max_mean_diff)
    metrics = sync_weights(policy, engine, version, probe)   # rollout/logprob_diff_mean, _max; raises if stale
"""

from __future__ import annotations

import torch

import envs
from nanosky.rollout.chat import encode_conversation
from nanosky.rollout.engine import StaleWeightsError, held_back
from nanosky.train.lora import iter_merged_params
from nanosky.train.policy import token_logprobs


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


PROBE_FLOOR = {"float32": 1e-4, "bfloat16": 0.02, "float16": 0.02}
"""The calibrated tolerance's lower bound, by engine dtype: ~100× the fp32 gap seen on CPU (1e-6), ~4× a small bf16
model's."""
PROBE_CEILING = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.25}
"""The most the build probe may show. Both sides then hold the same weights, so the gap is numerics only: on a 7B in
bf16, 0.02-0.04 mean nats are published (ServiceNow/Fast-LLM #525); an engine that missed the push (dummy or old
weights) is off by nats."""
CALIBRATION = 4.0
"""A later sync may show this many times the build probe's gap before it counts as stale."""


class Probe:
    """The sync check's state: a fixed sequence, and the tolerance on its mean |Δlogp|, calibrated at the build sync
    (`max(floor, 4 × the build gap)` by engine dtype) unless `--probe.max-mean-diff` fixes it. The build gap itself
    must stay under a ceiling: the calibration never absorbs an engine that did not load the weights."""

    def __init__(self, ids: list[int], max_mean_diff: float | None = None):
        self.ids, self.fixed = ids, max_mean_diff
        self.tol: float | None = max_mean_diff  # None until the build sync
        self.build_gap: float | None = None

    def check(self, m: dict[str, float], dtype: str, version: int, warned: list[str]) -> None:
        """Raise StaleWeightsError when the engine does not serve the trainer's weights."""
        gap = m["rollout/logprob_diff_mean"]
        limit = self.tol
        if limit is None:  # the build sync: calibrate, unless the gap already shows a broken push
            limit = PROBE_CEILING.get(dtype, PROBE_CEILING["bfloat16"])
        if gap > limit:
            raise StaleWeightsError(
                f"engine is serving stale weights: mean |Δlogp| {gap:.4g} > {limit:.4g} after sync to version "
                f"{version}"
                + ("" if self.tol is not None else " (the build sync: the engine did not load them)")
                + "".join(f"\n  vLLM: {w}" for w in warned)
            )
        if self.tol is None:
            self.build_gap = gap
            self.tol = max(PROBE_FLOOR.get(dtype, PROBE_FLOOR["bfloat16"]), CALIBRATION * gap)


def sync_weights(policy, engine, version: int, probe_: Probe, push: bool = True) -> dict[str, float]:
    """Push the policy's weights to the engine as `version`, then check with the probe that it serves them. An engine
    asleep (CUDA, after a rollout phase) wakes in two parts around the push; it ends fully awake. `push=False`
    (testing only, `--debug.skip-sync`) leaves the engine stale: the probe must catch it."""
    engine.wake(
        "weights"
    )  # CUDA: the weights first; the KV cache is mapped after the push (TRL's, verl's order)
    if push:
        # LoRA merged in; gathered in the engine's dtype (bf16 on CUDA: half the bytes of an fp32 gather)
        engine.load_weights(iter_merged_params(policy, getattr(torch, engine.dtype)), version)
    else:
        engine.version = version  # testing only: pretend; the probe below must catch it
    engine.wake("kv_cache")
    m = probe(policy, engine, probe_.ids, engine.info.device)
    probe_.check(m, engine.dtype, version, held_back())  # vLLM's "Failed to load weights" lines of this sync
    return m
