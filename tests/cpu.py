"""What this CPU does in bf16, for the tests that pin `--precision bf16` (imported by name, like spawn).

Where the CPU has bf16 units (AMX, or AVX-512-BF16), the bf16 e2e tests run at full size. Where it has none, bf16
is emulated, ~100x slower than fp32 (issue 60: 1 GFLOP/s against 130 on an AVX2 EPYC), and a full-size bf16 e2e
takes minutes per step: there, bf16's numerics are checked at the smallest size that still checks them (the tests
marked `bf16_scaled`: a few tokens a step), the rest of the bf16 e2e matrix (marked `bf16_full_size`) is skipped and
left to the unit-level checks of the same numerics (the mixed-precision policy, the once-rounded merge, the probe's
calibration: tests/unit/test_precision.py, test_lora.py, test_probe.py), and pytest's header says so
(tests/conftest.py). `NANOSKY_TEST_NO_BF16=1` takes the emulated CPU's path on any machine (to check the scaled
tests themselves). A whole AVX2-only box, runs included:
`NANOSKY_CPU_FLAGS=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 make test` (bf16 matmuls then emulated)."""

import os

import pytest

from nanosky.precision import BF16_UNITS, cpu_flags, decide, has_bf16_units

FP32 = decide("fp32", "cpu")  # what a component built in a test computes in, unless the test is about bf16
BF16 = has_bf16_units() and os.environ.get("NANOSKY_TEST_NO_BF16") != "1"

NO_UNITS = "this CPU has no bf16 units (bf16 is emulated, ~100x slower than fp32)"
SCALED, FULL_SIZE = "bf16_scaled", "bf16_full_size"  # the markers (pyproject.toml)


def header() -> list[str]:
    """pytest's header line: the CPU and the features that decide bf16."""
    found = sorted(f for f in cpu_flags() if f in BF16_UNITS or f in ("avx2", "avx512f"))
    return [f"cpu: {_model()}; features: {', '.join(found) or 'none read'}"]


def skip_full_size(items: list[pytest.Item]) -> None:
    """Where bf16 is emulated, skip the tests marked `bf16_full_size`."""
    if BF16:
        return
    skip = pytest.mark.skip(reason=f"{NO_UNITS}: its numerics are checked by unit tests (tests/cpu.py)")
    for item in items:
        if item.get_closest_marker(FULL_SIZE):
            item.add_marker(skip)


def bf16_lines(items: list[pytest.Item]) -> list[str]:
    """What the collected bf16 tests do on this CPU: at full size, or which were scaled and which skipped. None
    where no test marked for it was collected."""
    scaled, skipped = _names(items, SCALED), _names(items, FULL_SIZE)
    if not scaled and not skipped:
        return []
    if BF16:
        return ["bf16: hardware units found; the bf16 e2e tests run at full size"]
    why = "NANOSKY_TEST_NO_BF16=1" if has_bf16_units() else NO_UNITS
    return [
        f"bf16: {why}: scaled to a few tokens a step: {', '.join(scaled)}",
        f"bf16: skipped (their numerics checked by unit tests): {', '.join(skipped)}",
    ]


def _names(items: list[pytest.Item], marker: str) -> list[str]:
    """The tests carrying `marker`, once each: a test's name where it marks the whole function, with its parameters
    where it marks one case (`pytest.param(..., marks=...)`)."""
    names: list[str] = []
    for item in items:
        if item.get_closest_marker(marker) is None:
            continue
        one_case = any(m.name == marker for m in getattr(getattr(item, "callspec", None), "marks", ()))
        name = item.name if one_case else getattr(item, "originalname", item.name)
        if name not in names:
            names.append(name)
    return names


def _model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), "unknown")
    except OSError:
        return "unknown"
