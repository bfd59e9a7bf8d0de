"""Exact resume (issue 7): N steps straight vs N/2 steps + resume + N/2 steps, 2 ranks, the bundled model."""

import json
import math
import os
import shutil

import pytest
from test_e2e import scalars, torchrun

ARGS = ["--preset", "smoke", "--steps", "4", "--log.ckpt-every", "2", "--eval.limit", "8"]


def _samples(run_dir: str, step: int) -> list:
    rows = [json.loads(x) for x in open(os.path.join(run_dir, "rollouts.jsonl"))]
    return [r["messages"] for r in rows if r["split"] == "train" and r["step"] == step]


@pytest.mark.slow
def test_resume_is_exact(tmp_path):
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    r = torchrun([*ARGS, "--log.run-dir", straight])
    assert r.returncode == 0, r.stderr[-3000:]
    # the "crashed" run: keep only what existed after step 2 (its checkpoint), then resume it
    os.makedirs(resumed)
    shutil.copytree(
        os.path.join(straight, "checkpoints", "step_000002"),
        os.path.join(resumed, "checkpoints", "step_000002"),
    )
    with open(os.path.join(resumed, "checkpoints", "latest"), "w") as f:
        f.write("step_000002")
    r = torchrun([*ARGS, "--log.run-dir", resumed, "--resume", "latest"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr
    a, b = scalars(straight), scalars(resumed)
    assert [s for s, _ in b["train/pg_loss"]] == [3, 4]  # only the steps after the resume ran
    for tag in ("train/pg_loss", "train/reward_mean", "train/response_len", "train/grad_norm"):
        for (sa, va), (sb, vb) in zip(a[tag][2:], b[tag]):
            assert sa == sb and math.isclose(va, vb, rel_tol=1e-5, abs_tol=1e-7), (tag, sa, va, vb)
    for step in (3, 4):  # the same sampled tokens after the resume
        assert _samples(straight, step) == _samples(resumed, step) and _samples(resumed, step)
    # a config change that breaks resume is refused with the field named
    r = torchrun([*ARGS, "--log.run-dir", resumed, "--resume", "latest"], nproc=1)
    assert r.returncode != 0 and "world_size differs" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_resume_without_checkpoint_fails_loudly(tmp_path):
    r = torchrun([*ARGS, "--log.run-dir", str(tmp_path / "empty"), "--resume", "latest"], nproc=1)
    assert r.returncode != 0
    assert "no complete checkpoint" in r.stderr or "No complete checkpoint" in r.stderr, r.stderr[-2000:]
