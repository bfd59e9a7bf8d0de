"""Crash → resume and graceful stop → resume (issues 7 and 16), 2 ranks, the bundled model.

One straight 4-step run is the reference. A second run has rank 1 killed -9 in the middle of step 3 (not during a
save): torchrun must end the job promptly, naming the dead rank; `--resume latest` continues from step 2; a Ctrl-C
(SIGINT to the whole process group, as a terminal sends it) during step 3 finishes that step, checkpoints it and
prints the resume command; resuming again runs step 4. Steps 3 and 4 must equal the straight run's.
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from spawn import ROOT, child_env, launch, scalars, torchrun, wait_for_beat

ARGS = ["--preset", "smoke", "--precision", "fp32", "--steps", "4", "--log.ckpt-every", "2", "--eval.limit", "8"]
TAGS = ("train/pg_loss", "train/reward_mean", "train/response_len", "train/grad_norm")


def _samples(run_dir: str, step: int) -> list:
    rows = [json.loads(x) for x in open(os.path.join(run_dir, "rollouts.jsonl"))]
    return [r["messages"] for r in rows if r["split"] == "train" and r["step"] == step]


def _launch(run_dir: str, *extra: str) -> subprocess.Popen:
    return launch([*ARGS, "--log.run-dir", run_dir, *extra])


@pytest.mark.slow
def test_kill_9_mid_step_then_resume_and_sigint_stop_then_resume_are_exact(tmp_path):
    straight, run = str(tmp_path / "straight"), str(tmp_path / "run")
    r = torchrun([*ARGS, "--log.run-dir", straight])
    assert r.returncode == 0, r.stderr[-3000:]
    # a quiet console: vLLM's lines (start-up, every step's weight reload) go to run_dir/engine.log
    vllm_line = re.compile(r"^\(\w+ pid=\d+\) (INFO|WARNING|DEBUG) ", re.M)
    assert not vllm_line.search(r.stdout + r.stderr), vllm_line.findall(r.stdout + r.stderr)[:3]
    engine_log = open(os.path.join(straight, "engine.log")).read()
    assert "Reloading and processing weights" in engine_log and "Failed to load weights" not in engine_log

    # kill -9 rank 1 once it is training step 3
    proc = _launch(run)
    m = wait_for_beat(os.path.join(run, "heartbeat.rank1"), 0, r"rank 1 pid (\d+) step 3 train", proc)
    os.kill(int(m.group(1)), signal.SIGKILL)
    t_kill = time.time()
    out, err = proc.communicate(timeout=120)
    print(f"chaos: the job exited {time.time() - t_kill:.1f} s after the kill")
    assert proc.returncode != 0 and time.time() - t_kill < 30
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", err) and "SIGKILL" in err, err[-3000:]
    with open(os.path.join(run, "checkpoints", "latest")) as f:
        assert f.read().strip() == "step_000002"

    # resume; Ctrl-C during step 3: the step finishes, is checkpointed, and the resume command is printed. Sent once
    # both ranks are past the step's generation, where a resumed rank may still compile with a subprocess (in the
    # process group, so the terminal's SIGINT kills it as it would any child)
    beat0 = os.path.join(run, "heartbeat.rank0")
    proc = _launch(run, "--resume", "latest")
    wait_for_beat(beat0, os.path.getsize(beat0), r"step 3 train", proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert "resumed from" in out + err and "step_000002" in out + err
    assert "stopped by SIGINT after step 3 of 4" in out, out[-3000:] + err[-8000:]
    resume = out.split("Resume with:")[1].strip().splitlines()[0]
    # the launcher as typed, with the launch geometry as started (vLLM's CPU platform had overwritten
    # LOCAL_WORLD_SIZE by then: it said 1)
    assert resume.startswith(
        f"{os.path.relpath(os.path.dirname(sys.executable), ROOT)}/torchrun --standalone "
        "--nproc_per_node 2 run.py --preset smoke"
    ) and resume.endswith("--resume latest"), resume
    with open(os.path.join(run, "checkpoints", "latest")) as f:
        assert f.read().strip() == "step_000003"
    print(f"graceful stop: torchrun exit status {proc.returncode}; resume with: {resume}")

    # the printed command, verbatim, in a shell without the venv activated
    r = subprocess.run(resume, shell=True, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = scalars(straight), scalars(run)
    assert [s for s, _ in b["train/pg_loss"]] == [1, 2, 3, 4]  # step 3 logged once, by the stopped run
    for tag in TAGS:
        for (sa, va), (sb, vb) in zip(a[tag][2:], b[tag][2:], strict=True):
            assert sa == sb and math.isclose(va, vb, rel_tol=1e-5, abs_tol=1e-7), (tag, sa, va, vb)
    for step in (3, 4):  # the same sampled tokens after each resume
        assert _samples(straight, step) == _samples(run, step) and _samples(run, step)

    # a config change that breaks resume is refused with the field named
    r = torchrun([*ARGS, "--log.run-dir", run, "--resume", "latest"], nproc=1)
    assert r.returncode != 0 and "world_size differs" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_resume_without_checkpoint_fails_loudly(tmp_path):
    r = torchrun([*ARGS, "--log.run-dir", str(tmp_path / "empty"), "--resume", "latest"], nproc=1)
    assert r.returncode != 0
    assert "no complete checkpoint" in r.stderr or "No complete checkpoint" in r.stderr, r.stderr[-2000:]
