"""`cfg` after `build()` equals `cfg` before it (a deep compare), on a run whose packed rows fall back to the dense
mask (Gemma 2's soft-capped eager attention, grouped attention asked for) and on one whose packing is turned off (its
check made to fail): the plan says what runs, and plan.json records it beside config.json."""

import json
import os

import pytest
from families import build
from spawn import python


def _build(tmp_path, mode: str, *flags: str) -> dict:
    run_dir = str(tmp_path / mode)
    r = python([run_dir, mode, "--", "--preset", "smoke", *flags], script="tests/scripts/build_plan.py")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    assert json.load(open(os.path.join(run_dir, "plan.json")))["packing"] == out["plan"]["packing"]
    return out


@pytest.mark.slow
def test_a_dense_mask_fallback_leaves_cfg_as_parsed(tmp_path):
    model = build("gemma2", str(tmp_path))
    out = _build(tmp_path, "mask", "--model.path", model, "--optim.packed-attention", "grouped")
    assert out["same"] and (out["plan"]["packing"], out["plan"]["attention"]) == ("prefix", "mask")
    assert any("grouped attention does not cover" in n for n in out["plan"]["notes"])


@pytest.mark.slow
def test_packing_turned_off_leaves_cfg_as_parsed(tmp_path):
    out = _build(tmp_path, "unpacked")
    assert out["same"] and out["plan"]["packing"] == "none" and out["plan"]["attention"] is None
    assert any("--optim.packing none" in n for n in out["plan"]["notes"])
