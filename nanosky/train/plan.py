"""The build's decisions, returned as a value: what the trainer's models can do, checked once, on the models
themselves, before step 1. The update, the critic and the checkpoints take the plan; the config stays as parsed.

    plan = decide(cfg.optim, precision, policy, (ref, teacher), critic, say=log.print)   # Plan(packing="prefix")
    update = PolicyUpdate(plan.optim(cfg.optim), cfg.algorithm, policy)
    plan = plan.calibrated(probe.tol)          # after the build sync; recorded as plan.json beside config.json

Checked: the chunked LM head equals the model's own logits (else the plain head, installed per model); packed rows
equal unpacked ones on a probe longer than any sliding window, under grouped attention where the device runs it
(else under the dense mask, else unpacked: exact, slower). Both within the run's precision's tolerance (fp32: 1e-4,
bf16: its rounding). Each fallback is one line, through `say`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from nanosky.config.model import OptimConfig
from nanosky.precision import Precision
from nanosky.train import grouped_attention, head, packing
from nanosky.train.critic import critic_forward


@dataclass(frozen=True)
class Plan:
    """What the run does, as decided at build (recorded in the run dir's plan.json)."""

    precision: str  # "fp32" | "bf16": the engine's dtype and the trainer's compute (`nanosky.precision`)
    packing: str  # "prefix" | "none": packed rows (each prompt once), or one padded row per sequence
    attention: str | None  # packed rows' attention: "grouped" (by segment) | "mask" (the dense ancestor mask)
    chunked_head: bool  # the policy scores target tokens through the chunked LM head
    probe_tol: float | None = None  # the weight-sync probe's tolerance, calibrated at the build sync
    notes: tuple[str, ...] = ()  # the fallbacks taken, as printed

    def optim(self, optim: OptimConfig) -> OptimConfig:
        """`optim` as this plan runs it (its packing and packed attention): a copy; the run's config is not touched."""
        return dataclasses.replace(optim, packing=self.packing, packed_attention=self.attention or "mask")

    def calibrated(self, tol: float | None) -> Plan:
        return dataclasses.replace(self, probe_tol=tol)


def _kind(model) -> str:
    return getattr(getattr(model, "config", None), "model_type", type(model).__name__)


def decide(
    optim: OptimConfig, precision: Precision, policy, frozen=(), critic=None, say: Callable[[str], None] = print
) -> Plan:
    """Check the head and packing on every model that uses them (the policy; the `frozen` language models the
    trainer scores with, a separate KL reference and a distillation teacher, None or the policy itself skipped; the
    critic) and return what the run can do. Models are changed only as the plan says (the head uninstalled, grouped
    attention on or off); `optim` is read, never written."""
    lms = (policy, *(m for m in frozen if m is not None and m is not policy))
    try:
        return _decide(optim, precision, lms, critic, _Notes(say))
    finally:  # a check's forward leaves FSDP2's root unsharded: what is built next (the optimizer) needs the shards
        for model in (*lms, critic):
            _reshard(model)


def _reshard(model) -> None:
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules() if hasattr(model, "modules") else ():
        if isinstance(m, FSDPModule):
            m.reshard()


class _Notes(list):
    """The fallbacks a plan takes, each said as it is taken (`note(line)`) and kept (the list)."""

    def __init__(self, say: Callable[[str], None]):
        super().__init__()
        self.say = say

    def __call__(self, line: str) -> None:
        self.append(line)
        self.say(line)


def _decide(optim: OptimConfig, precision: Precision, lms: tuple, critic, note: _Notes) -> Plan:
    """`decide`'s checks on the language models `lms` (the policy first) and the critic; `note(line)` says a
    fallback and keeps it for the plan."""
    tol, p, policy = precision.build_tol, precision.name, lms[0]
    for model in lms if optim.head_chunk_tokens else ():
        try:
            if head.installed(model):
                head.verify(model, tol)
        except head.HeadUnsupported as e:
            note(f"nanosky: {e}; this run uses the plain LM head")
            head.uninstall(model)
    chunked = bool(optim.head_chunk_tokens) and head.installed(policy)
    if optim.packing == "none":
        return Plan(p, "none", None, chunked, notes=tuple(note))
    models = (*((m, packing.lm_forward) for m in lms), (critic, critic_forward))
    grouped = optim.grouped()  # prefix-grouped attention, else the dense mask
    eager = [m for m in lms if not grouped_attention.enable(m)] if grouped else []
    if eager:  # eager attention (soft-capped): grouped attention does not cover it
        kind = _kind(eager[0])
        note(
            f"nanosky: {kind} runs eager attention (soft-capped), which grouped attention does not cover; "
            "packed rows use the dense mask"
        )
        _dense(lms)
        grouped = False
    for attempt in ("grouped", "mask") if grouped else ("mask",):
        try:
            for model, forward in models:
                if model is not None:
                    packing.verify(model, forward(model), tol)
            return Plan(p, optim.packing, attempt, chunked, notes=tuple(note))
        except packing.PackingUnsupported as e:
            if attempt == "grouped":  # the dense mask next: the reference the grouped path is tested against
                note(f"nanosky: {e} with grouped attention; this run uses the dense mask")
                _dense(lms)
                continue
            note(f"nanosky: {e}; this run uses --optim.packing none (exact, slower)")
    return Plan(p, "none", None, chunked, notes=tuple(note))


def _dense(lms: tuple) -> None:
    """Grouped attention off on every language model (packed rows then use the dense mask)."""
    for model in lms:
        grouped_attention.disable(model)
