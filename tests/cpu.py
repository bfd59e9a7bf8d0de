"""What this CPU does in bf16, for the tests that pin `--precision bf16` (imported by name, like spawn).

Where the CPU has bf16 units (AMX, or AVX-512-BF16), the bf16 e2e tests run at full size. Where it has none, bf16
is emulated, ~100x slower than fp32 (issue 60: 1 GFLOP/s against 130 on an AVX2 EPYC), and a full-size bf16 e2e
takes minutes per step: there, bf16's numerics are checked at the smallest size that still checks them (`SCALED`:
a few tokens a step), the rest of the bf16 e2e matrix (`SKIPPED`) is left to the unit-level checks of the same
numerics (the mixed-precision policy, the once-rounded merge, the probe's calibration: tests/unit/test_precision.py,
test_lora.py, test_probe.py), and pytest's header says so (tests/conftest.py). `NANOSKY_TEST_NO_BF16=1` takes the
emulated CPU's path on any machine (to check the scaled tests themselves). A whole AVX2-only box, runs included:
`NANOSKY_CPU_FLAGS=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 make test` (bf16 matmuls then emulated)."""

import os

from nanosky.precision import BF16_UNITS, cpu_flags, decide, has_bf16_units

FP32 = decide("fp32", "cpu")  # what a component built in a test computes in, unless the test is about bf16
BF16 = has_bf16_units() and os.environ.get("NANOSKY_TEST_NO_BF16") != "1"

SCALED = (
    "tests/e2e/test_precision_e2e.py::test_bf16_lora_tool_use_two_ranks_resumes_exactly",
    "tests/e2e/test_precision_e2e.py::test_bf16_probe_catches_a_skipped_sync",
    "tests/e2e/test_precision_e2e.py::test_a_standalone_eval_of_a_checkpoint_scores_it_as_the_runs_own_eval[bf16]",
)
SKIPPED = (
    "tests/e2e/test_precision_e2e.py::test_bf16_qlora_two_ranks_resumes_exactly",
    "tests/e2e/test_precision_e2e.py::test_bf16_family_two_ranks_resumes_exactly",
)
NO_UNITS = "this CPU has no bf16 units (bf16 is emulated, ~100x slower than fp32)"


def header() -> list[str]:
    """pytest's header lines: the CPU's bf16 features, and which bf16 tests were scaled or skipped."""
    found = sorted(f for f in cpu_flags() if f in BF16_UNITS or f in ("avx2", "avx512f"))
    lines = [f"cpu: {_model()}; features: {', '.join(found) or 'none read'}"]
    if BF16:
        return [*lines, "bf16: hardware units found; the bf16 e2e tests run at full size"]
    why = "NANOSKY_TEST_NO_BF16=1" if has_bf16_units() else NO_UNITS
    return [
        *lines,
        f"bf16: {why}: scaled to a few tokens a step: {', '.join(t.split('::')[1] for t in SCALED)}",
        f"bf16: skipped (their numerics checked by unit tests): {', '.join(t.split('::')[1] for t in SKIPPED)}",
    ]


def _model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), "unknown")
    except OSError:
        return "unknown"
