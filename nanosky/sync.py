"""The weight sync and its probe: the policy's full tensors (LoRA merged in) pushed to the colocated engine as a new
version, then a fixed sequence scored by both, so a stale or wrongly loaded engine stops the run at once.

    probe = build_probe(cfg, tok, model.config)   # a longer sequence at the build sync where the model slides
    metrics = sync_weights(policy, engine, version, probe)   # rollout/logprob_diff_mean, _max; raises if stale
"""

from __future__ import annotations

import time

import torch

from nanosky import dist
from nanosky.rollout.chat import encode_conversation
from nanosky.rollout.engine import StaleWeightsError, held_back
from nanosky.train.lora import base_model, iter_merged_params
from nanosky.train.packing import attention_kinds
from nanosky.train.policy import token_logprobs

PROBE_QUESTION, PROBE_REPLY = "What is 12 + 30?", "Let me think. 12 + 30 = 42\n"


def probe_sequence(tok, cross: int = 0, max_len: int | None = None) -> list[int]:
    """A fixed token sequence to score with both the trainer and the engine after every sync: a short question and
    its answer in the model's chat template, whatever the env (its system prompt and tool schemas made an agent
    env's probe ~450 tokens, and its two forwards most of the sync). `cross` > 0 (the build probe of a model with
    a sliding window): the answer alone is longer than `cross` tokens, so tokens late in it attend across the
    window's edge and an engine whose window is one position off shows there; at most `max_len` tokens (the
    engine's context: a window past it never binds)."""
    reps = 1
    while True:
        reply = PROBE_REPLY * reps + "<answer>42</answer>"
        ids, mask = encode_conversation(
            tok, [{"role": "user", "content": PROBE_QUESTION}, {"role": "assistant", "content": reply}]
        )
        turn = int(sum(mask))  # the assistant's tokens
        if turn > cross or (max_len is not None and len(ids) >= max_len):
            return ids[:max_len] if max_len is not None else ids
        reps *= 2


def build_probe(cfg, tok, model_config) -> Probe:
    """The run's probe: the short sequence after every sync; at the build sync, where the model slides, one whose
    assistant turn crosses the window (up to the engine's context)."""
    short = probe_sequence(tok)
    _, window = attention_kinds(model_config)
    long = None
    if window and window < cfg.engine.max_model_len:
        long = probe_sequence(tok, cross=window, max_len=cfg.engine.max_model_len)
    return Probe(short, cfg.probe.max_mean_diff, build_ids=long)


@torch.no_grad()
def probe_logprobs(model, engine, ids: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's and the engine's log p of each token of a fixed sequence, [len − 1] each, float64 on the host
    (the trainer's computed in fp32 from its logits, whatever its compute dtype). Collective (the trainer's forward)."""
    x = torch.tensor([ids], device=device)
    lp_train, _ = token_logprobs(model, x, torch.ones_like(x))
    return lp_train[0].double().cpu(), engine.prompt_logprobs(ids).double().cpu()


def probe_diffs(model, engine, ids: list[int], device) -> torch.Tensor:
    """|trainer − engine| log p of each token of a fixed sequence [len − 1]. Collective (the trainer's forward)."""
    lp_train, lp_engine = probe_logprobs(model, engine, ids, device)
    return (lp_train - lp_engine).abs()


def probe_metrics(d: torch.Tensor) -> dict[str, float]:
    """The probe's per-token differences as logged: their mean and max."""
    return {"rollout/logprob_diff_mean": float(d.mean()), "rollout/logprob_diff_max": float(d.max())}


def probe(model, engine, ids: list[int], device) -> dict[str, float]:
    """The probe's mean and max |trainer − engine| logprob (`probe_diffs`), as logged."""
    return probe_metrics(probe_diffs(model, engine, ids, device))


PROBE_FLOOR = {"float32": 1e-4, "bfloat16": 0.02, "float16": 0.02}
"""The calibrated tolerance's lower bound, by engine dtype: ~100× the fp32 gap seen on CPU (1e-6), ~4× a small bf16
model's."""
PROBE_CEILING = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.25}
"""The most the build probe may show. Both sides then hold the same weights, so the gap is numerics only: on a 7B in
bf16, 0.02-0.04 mean nats are published (ServiceNow/Fast-LLM #525); an engine that missed the push (dummy or old
weights) is off by nats."""
PROBE_CEILING_MAX = {"float32": 2e-4}
"""The most any one token of the build probe may show, where the engine computes in fp32: a correct engine agrees to
~1e-5 (every family in tests/integration/test_families.py), so a real disagreement (a window one position off, an
attention the engine implements differently) is refused, not averaged away. bf16 has no per-token ceiling: single
tokens there differ by rounding alone."""
MOVED = 1e-6
"""The trainer's probe log-probs moved (mean |Δ| since the last sync) by more than float noise: an engine whose own
did not move at all missed the push. (A push that changes no weight of the engine's dtype moves the trainer by far
less.)"""
CALIBRATION = 4.0
"""A later sync may show this many times the build probe's gap before it counts as stale."""


class BuildRefused(StaleWeightsError):
    """The build sync's probe shows that the engine does not compute the trainer's model: the run stops before step 1,
    in one line (run.py)."""


class Probe:
    """The sync check's state: a fixed sequence, and the tolerance on its mean |Δlogp|, calibrated at the build sync
    (`max(floor, 4 × the build gap)` by engine dtype) unless `--probe.max-mean-diff` fixes it. The build gap itself
    must stay under a ceiling: the calibration never absorbs an engine that did not load the weights."""

    def __init__(self, ids: list[int], max_mean_diff: float | None = None, build_ids: list[int] | None = None):
        """`build_ids`: the build sync's sequence, when it must be longer (`probe_sequence(cross=window)`)."""
        self.ids, self.fixed, self.build_ids = ids, max_mean_diff, build_ids or ids
        self.tol: float | None = max_mean_diff  # None until the build sync
        self.build_gap: float | None = None
        self.built = False  # the build sync passed: later syncs score `ids`
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # the last sync's (trainer, engine) log-probs

    def shifts(self, ids: list[int], lp_train: torch.Tensor, lp_engine: torch.Tensor) -> dict[str, float]:
        """How far each side's log-probs on the probe moved since the last sync (mean |Δ|), when it scored the same
        sequence: `rollout/probe_policy_shift` and `rollout/probe_engine_shift`, near each other when the sync
        lands. Keeps this sync's for the next."""
        last, self.last = self.last, (lp_train, lp_engine)
        if last is None or last[0].shape != lp_train.shape or ids != self.ids:
            return {}
        return {
            "rollout/probe_policy_shift": float((lp_train - last[0]).abs().mean()),
            "rollout/probe_engine_shift": float((lp_engine - last[1]).abs().mean()),
        }

    @property
    def current(self) -> list[int]:
        """The sequence the next sync scores."""
        return self.ids if self.built else self.build_ids

    def check(
        self,
        m: dict[str, float],
        dtype: str,
        version: int,
        warned: list[str],
        diffs: torch.Tensor | None = None,
        arch: str = "the model",
    ) -> None:
        """Raise StaleWeightsError when the engine does not serve the trainer's weights: its gap is over the
        tolerance, or its log-probs are exactly the last sync's while the trainer's moved (a missed push, however
        small the update: in bf16 one step's change can sit inside the calibrated tolerance). At the build sync
        (nothing calibrated yet) also when any token of the probe is over the per-token ceiling, naming the
        architecture and the first position where they part."""
        gap = m["rollout/logprob_diff_mean"]
        if m.get("rollout/probe_engine_shift") == 0.0 and m["rollout/probe_policy_shift"] > MOVED:
            raise StaleWeightsError(
                f"engine is serving stale weights: its probe log-probs are exactly the last sync's while the "
                f"trainer's moved by {m['rollout/probe_policy_shift']:.3g} (mean |Δ|), after sync to version {version}"
                + "".join(f"\n  vLLM: {w}" for w in warned)
            )
        limit = self.tol
        if limit is None:  # the build sync: calibrate, unless the gap already shows a broken push
            limit = PROBE_CEILING.get(dtype, PROBE_CEILING["bfloat16"])
            worst = PROBE_CEILING_MAX.get(dtype)
            if self.fixed is None and worst is not None and diffs is not None and float(diffs.max()) > worst:
                first = int((diffs > worst).nonzero()[0])
                raise BuildRefused(
                    f"{arch}: the trainer and the engine disagree from position {first + 1} of the build probe "
                    f"(|Δlogp| {float(diffs[first]):.3g} there, max {float(diffs.max()):.3g} > {worst:g}, mean "
                    f"{gap:.3g}): the engine computes another model than transformers (its attention or a layer "
                    "differs), so training would be off-policy. Refused; --probe.max-mean-diff overrides"
                    + "".join(f"\n  vLLM: {w}" for w in warned)
                )
        if gap > limit:
            raise (StaleWeightsError if self.tol is not None else BuildRefused)(
                f"engine is serving stale weights: mean |Δlogp| {gap:.4g} > {limit:.4g} after sync to version "
                f"{version}"
                + ("" if self.tol is not None else " (the build sync: the engine did not load them)")
                + "".join(f"\n  vLLM: {w}" for w in warned)
            )
        if self.tol is None:
            self.build_gap = gap
            self.tol = max(PROBE_FLOOR.get(dtype, PROBE_FLOOR["bfloat16"]), CALIBRATION * gap)
        self.built = True


def build_sync(policy, engine, version: int, probe_: Probe) -> dict[str, float]:
    """The build's first push (the engine held placeholder weights): calibrates the probe on identical weights, or
    refuses an engine that computes another model. A refusal on any rank is raised on every rank, alike."""
    try:
        m, refused = sync_weights(policy, engine, version, probe_), None
    except BuildRefused as e:
        m, refused = {}, str(e)
    if refused := next((v for v in dist.all_gather_objects(refused) if v), None):
        raise BuildRefused(refused)
    return m


def _counted(tensors, pushed: list[int]):
    """`tensors` as they stream past, their elements and bytes added to `pushed`: what the sync moved (2 bytes per
    weight in bf16, 4 in fp32)."""
    for name, t in tensors:
        pushed[0] += t.numel()
        pushed[1] += t.numel() * t.element_size()
        yield name, t


def sync_weights(policy, engine, version: int, probe_: Probe, push: bool = True) -> dict[str, float]:
    """Push the policy's weights to the engine as `version`, then check with the probe that it serves them. An engine
    asleep (CUDA, after a rollout phase) wakes in two parts around the push; it ends fully awake. `push=False`
    (testing only, `--debug.skip-sync`) leaves the engine stale: the probe must catch it."""
    # CUDA: the weights first; the KV cache is mapped after the push (TRL's, verl's order)
    engine.wake("weights")
    pushed, t0 = [0, 0], time.perf_counter()  # elements, bytes
    if push:
        # LoRA merged in; gathered in the engine's dtype (bf16: half the bytes of an fp32 gather)
        # through node-shared memory on one CPU node (the engine copies each tensor before the next gather)
        merged = iter_merged_params(policy, getattr(torch, engine.dtype), shared=True)
        engine.load_weights(_counted(merged, pushed), version)
    else:
        engine.skip_load(version)  # testing only: the probe below must catch it
    t1 = time.perf_counter()
    engine.wake("kv_cache")
    ids = probe_.current
    lp_train, lp_engine = probe_logprobs(policy, engine, ids, engine.info.device)
    d = (lp_train - lp_engine).abs()
    m = probe_metrics(d) | probe_.shifts(ids, lp_train, lp_engine)
    m |= {"sync/bytes_per_weight": pushed[1] / pushed[0], "sync/mbytes": pushed[1] / 1e6} if pushed[0] else {}
    # the push (gather, merge, cast, the engine's reload) and the probe's two forwards
    m |= {"sync/push_s": t1 - t0, "sync/probe_s": time.perf_counter() - t1}
    arch = type(base_model(policy)).__name__.removeprefix("FSDP")  # FSDP2 subclasses the model's class
    # held_back: vLLM's "Failed to load weights" lines of this sync, named in the error
    probe_.check(m, engine.dtype, version, held_back(), d, arch)
    return m
