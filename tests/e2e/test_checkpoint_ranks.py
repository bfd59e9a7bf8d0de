"""2 CPU ranks (gloo) through torchrun: a sharded checkpoint round trip (tests/scripts/ckpt_worker.py)."""

import json
import os
import sys

import pytest
from spawn import ROOT, torchrun

SCRIPT = os.path.join(ROOT, "tests", "scripts", "ckpt_worker.py")
sys.path.insert(0, os.path.dirname(SCRIPT))


def test_two_ranks_roundtrip(tmp_path):
    """2 CPU ranks (gloo): sharded save, load into a differently initialised model, identical next steps."""
    out = tmp_path / "out.json"
    r = torchrun(["roundtrip", str(out), str(tmp_path / "ckpt")], timeout=300, script=SCRIPT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["max_diff"] <= 1e-7
    for ref_losses, losses in res["losses"]:  # per rank
        assert losses == pytest.approx(ref_losses, rel=1e-7, abs=0)
    assert res["losses"][0] != res["losses"][1]  # the ranks really drew different data
    assert res["state"] == {"step": 2}
    print(f"2-rank tiny save {res['save_s']:.3f}s load {res['load_s']:.3f}s")
