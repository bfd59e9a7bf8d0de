"""The one-node shared-memory collectives (`nanosky.train.shared_gather`): the sync's gather and FSDP2's all-gather
and reduce-scatter give what gloo gives, on 2 real CPU ranks; ranks that share no memory, or a full /dev/shm, fall
back to gloo on every rank alike."""

import json
import os

import pytest
from spawn import ROOT, torchrun

from nanosky.train.shared_gather import DIR


@pytest.mark.skipif(not os.access(DIR, os.W_OK), reason=f"no writable {DIR} on this machine: the gathers stay on gloo")
def test_shared_collectives_match_gloo(tmp_path):
    out = tmp_path / "out.json"
    r = torchrun([str(out)], timeout=300, script=os.path.join(ROOT, "tests", "scripts", "shared_gather.py"))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    print(res)
    # the sync's gather: every tensor (fp32, bf16, uneven rows, a rank with none) exact, through the arena
    assert res["arena"] and res["segments"] >= 2, res  # 256-byte buckets: several segments
    assert res["gather_diffs"] == [] and res["gather_diffs_after_update"] == [], res
    assert res["segments_after"] == res["segments"], res  # the second gather reuses the first's segments
    # FSDP2 through shared memory: the same two SGD steps as gloo, and the shared path did carry them
    assert res["fsdp_moved"] > 1e-3 and res["fsdp_max_diff"] <= 1e-6, res
    calls = res["fsdp_calls"]
    assert calls["SharedAllGather"] >= 4 and calls["SharedReduceScatter"] >= 4, calls
    assert calls["staged"] == calls["SharedAllGather"] + calls["SharedReduceScatter"], calls
    assert res["small_staged"] == 0, res  # below SMALL_BYTES: gloo
    # no shared memory between the ranks, or no room: gloo on every rank, the same tensors
    assert res["unshared_diffs"] == [] and res["unshared_broken"] == [True, True], res
    assert res["full_diffs"] == [] and res["full_broken"] == [True, True], res
    assert res["left_in_shm"] == [], res  # each segment's file unlinked once every rank mapped it
