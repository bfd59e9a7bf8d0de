"""The sync probe's tolerance: calibrated at the build sync, refusing a build that did not load the weights, and
catching a stale engine afterwards (`nanosky/sync.py: Probe`)."""

import pytest

from nanosky.rollout.engine import StaleWeightsError
from nanosky.sync import Probe


def _m(gap: float) -> dict[str, float]:
    return {"rollout/logprob_diff_mean": gap, "rollout/logprob_diff_max": 3 * gap}


def test_fp32_calibrates_to_the_floor_and_catches_a_later_stale_engine():
    p = Probe([1, 2, 3])
    p.check(_m(1e-6), "float32", 0, [])  # the build sync: both sides hold the same weights
    assert p.build_gap == 1e-6 and p.tol == 1e-4  # 4 × 1e-6 is under the fp32 floor
    p.check(_m(5e-6), "float32", 1, [])  # numerics of new weights: fine
    with pytest.raises(StaleWeightsError, match=r"0.0005 > 0.0001 after sync to version 2"):
        p.check(_m(5e-4), "float32", 2, ["Failed to load weights"])  # was within the old fixed 1e-3


def test_bf16_calibrates_above_a_large_models_build_gap():
    """A 7B's bf16 build gap (0.03 mean nats, published) would have failed a fixed 0.05 after a little drift."""
    p = Probe([1, 2, 3])
    p.check(_m(0.03), "bfloat16", 0, [])
    assert p.tol == pytest.approx(0.12)
    p.check(_m(0.06), "bfloat16", 1, [])
    with pytest.raises(StaleWeightsError, match="version 2"):
        p.check(_m(0.2), "bfloat16", 2, [])
    small = Probe([1])
    small.check(_m(1e-3), "bfloat16", 0, [])
    assert small.tol == 0.02  # the bf16 floor


@pytest.mark.parametrize("dtype, gap", [("float32", 0.01), ("bfloat16", 2.3)])
def test_a_build_sync_the_engine_missed_is_refused_not_calibrated(dtype, gap):
    """Dummy or old weights at build are nats off: refused under the ceiling, never absorbed into the tolerance."""
    p = Probe([1, 2, 3])
    with pytest.raises(StaleWeightsError, match="the build sync: the engine did not load them") as e:
        p.check(_m(gap), dtype, 0, ["vLLM said something"])
    assert "vLLM: vLLM said something" in str(e.value)
    assert p.tol is None  # nothing calibrated from it


def test_a_fixed_tolerance_is_never_calibrated():
    p = Probe([1], max_mean_diff=0.5)
    p.check(_m(0.4), "bfloat16", 0, [])  # above the build ceiling, but the user fixed the tolerance
    assert p.tol == 0.5
    with pytest.raises(StaleWeightsError):
        p.check(_m(0.6), "bfloat16", 1, [])
