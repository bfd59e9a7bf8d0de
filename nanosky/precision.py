"""One precision for the run (`--precision auto|fp32|bf16`): the engine's dtype and the trainer's compute, decided
once, here, from the device and what it supports. Everything that differs between fp32 and bf16 reads it from the
`Precision` this returns, on the CPU as on CUDA, so a bf16 run on an AMX CPU runs the CUDA path's numerics through
the same code:

    prec = decide("auto", "cpu")    # Precision("bf16", "cpu", why="auto: this CPU has AMX (amx_bf16)")
    prec.engine_dtype               # "bfloat16": vLLM's dtype
    prec.mixed_policy()             # FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), or None
    prec.build_tol                  # the packing / chunked-head checks' tolerance (bf16 rounding: 0.1)

What bf16 changes, and only that (fp32 master weights and optimizer state always):
- the trainer computes in bf16 through FSDP2's mixed precision (params gathered in bf16, gradients reduced in fp32);
- the engine runs in bf16, and the sync gathers bf16 shards for it (LoRA merged in fp32, rounded once);
- a QLoRA base dequantizes to bf16 and its 4-bit matmuls compute in bf16;
- the build checks (packing, chunked head) allow bf16 rounding, and the sync probe's tolerance is calibrated from
  the bf16 build gap (`nanosky/sync.py`, floor and ceiling by engine dtype);
- log-probabilities, the losses, importance ratios and the trainer-vs-engine metrics are computed in fp32 from the
  bf16 logits, as on CUDA.

`auto` is bf16 on CUDA and on a CPU with bf16 units (AMX: torch runs bf16 matmuls 5-10x faster than fp32; AVX-512-BF16,
a Zen 4 EPYC: 4.5x, and a step of the 135M model 0.59x fp32's, the tiny model's 0.76x), fp32 on any other CPU, where
bf16 is emulated and ~100x slower than fp32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from nanosky import process

NAMES = ("auto", "fp32", "bf16")
BF16_UNITS = ("amx_bf16", "avx512_bf16")
"""The CPU flags that mean bf16 in hardware, where `auto` takes bf16 (AMX tiles: Sapphire Rapids and later; AVX-512's
bf16 dot products: Zen 4, Cooper Lake). On a 2-core Zen 4 EPYC, 1024² matmuls: 940 GFLOP/s in bf16, 200 in fp32.
Without either, torch and vLLM emulate bf16: on an AVX2 EPYC its 512² matmuls ran at 1 GFLOP/s against fp32's 130
(issue 60), and the engine decoded a 135M model at 30 tokens/s against 119."""

BUILD_TOL = {"fp32": 1e-4, "bf16": 0.1}
"""The build checks' tolerance (packed vs unpacked, chunked head vs the model's logits: max |Δ log p(target)|).
fp32: the CPU's exact forward; bf16: a missed window or soft-cap costs far more than 0.1 (bench/gpu_check.py measures
both sides on a 7B-shaped model), and a deep model's own rounding above it is allowed for by `packing.verify`."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (/proc/cpuinfo; empty where there is none). `NANOSKY_CPU_FLAGS` (space-separated)
    replaces them: another CPU's path on this one, e.g. "avx2" with `ONEDNN_MAX_CPU_ISA=AVX2` for an AVX2-only box."""
    if (forced := process.launch().cpu_flags) is not None:
        return forced
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@dataclass(frozen=True)
class Precision:
    """The run's precision: `name` "fp32" | "bf16" on `device_type` "cpu" | "cuda", and why it was chosen."""

    name: str
    device_type: str
    why: str = ""

    def __post_init__(self):
        if self.name not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, got {self.name!r}")

    @property
    def bf16(self) -> bool:
        return self.name == "bf16"

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the trainer's matmuls run in (the master weights stay fp32)."""
        return torch.bfloat16 if self.bf16 else torch.float32

    @property
    def engine_dtype(self) -> str:
        """vLLM's `dtype` for the engine."""
        return "bfloat16" if self.bf16 else "float32"

    @property
    def build_tol(self) -> float:
        return BUILD_TOL[self.name]

    def mixed_policy(self):
        """FSDP2's mixed-precision policy: parameters gathered and computed in bf16, gradients reduced in fp32 (the
        optimizer steps fp32 masters); None in fp32 (no casts at all)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16 else None

    def line(self) -> str:
        return f"precision {self.name}" + (f" ({self.why})" if self.why else "")


def decide(flag: str, device_type: str, flags: frozenset[str] | None = None) -> Precision:
    """`--precision` on this device: `auto` is bf16 on CUDA and on a CPU with bf16 units, fp32 elsewhere; `flags`:
    the CPU's (default: this machine's)."""
    if flag not in NAMES:
        raise ValueError(f"--precision must be one of {', '.join(NAMES)}, got {flag!r}")
    if flag != "auto":
        return Precision(flag, device_type, "asked for")
    if device_type == "cuda":
        return Precision("bf16", device_type, "auto: CUDA")
    have = cpu_flags() if flags is None else flags
    if units := [f for f in BF16_UNITS if f in have]:
        return Precision("bf16", device_type, f"auto: this CPU has bf16 units ({units[0]})")
    return Precision(
        "fp32", device_type, "auto: this CPU has no bf16 units (no AMX, no AVX-512-BF16): bf16 is emulated"
    )


def has_bf16_units(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU (or one with `flags`) computes bf16 in hardware."""
    have = cpu_flags() if flags is None else flags
    return any(f in have for f in BF16_UNITS)


@functools.cache
def bf16_slowdown() -> float:
    """How many times slower a bf16 matmul runs than an fp32 one on this CPU, measured now (256² matmuls, best of
    3 after a warm-up: ~0.2 s where bf16 is emulated)."""
    import time

    def best(dtype: torch.dtype) -> float:
        a = torch.randn(256, 256).to(dtype)
        a @ a
        times = []
        for _ in range(3):
            t = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - t)
        return min(times)

    return best(torch.bfloat16) / max(best(torch.float32), 1e-9)


def emulation_warning(
    prec: Precision, engine_dtype: str, flags: frozenset[str] | None = None, slowdown=bf16_slowdown
) -> str | None:
    """The one line a run starts with when it asked for bf16 (`--precision bf16`, `--engine.dtype bfloat16`) on a
    CPU with no bf16 units, where bf16 is emulated and far slower than fp32; None where that is not so."""
    asked = "--precision bf16" if prec.bf16 else "--engine.dtype bfloat16" if engine_dtype == "bfloat16" else None
    if asked is None or prec.device_type != "cpu" or has_bf16_units(flags):
        return None
    return (
        f"warning: {asked} on a CPU with no bf16 units (no AMX, no AVX-512-BF16): bf16 is emulated here, its matmuls "
        f"{slowdown():.0f}x slower than fp32 (measured now); --precision auto (or fp32) and --engine.dtype auto run fp32"
    )


def engine_dtype(flag: str, prec: Precision) -> str:
    """vLLM's dtype, the one rule: `--engine.dtype` where it names one, else the run's precision's."""
    return flag if flag != "auto" else prec.engine_dtype
