"""Start-up errors under torchrun with 2 ranks (nanosky/startup.py): nanosky's one line, exactly once, first after
torchrun's launch banner, every rank exiting 2, on every try. Before, a rank that exited first could make torchrun
kill rank 0 before it printed (1 try in 4 of `--resume latest` lost the line), and some errors printed once per rank
or as a raw traceback. `NANOSKY_STARTUP_TRIES` (default 3) sets the tries per input: 15 tries over the 5 inputs
catch a 1-in-4 race like that one with probability 1 − 0.75^15 ≈ 0.99, in a third of the time 10 tries took."""

import os
import re

import pytest
from spawn import ROOT, torchrun

TRIES = int(os.environ.get("NANOSKY_STARTUP_TRIES", "3"))
# torchrun's launch banner (its OMP_NUM_THREADS notice), with or without its logger's prefix
BANNER = re.compile(r"^([WI]\d{4} \S+ \d+ \S*torch/distributed/run\.py:\d+\] ?)?(\*+|Setting OMP_NUM_THREADS.*)?$")


def _earlier_run(tmp_path):
    run = tmp_path / "old"
    run.mkdir(exist_ok=True)
    (run / "events.out.tfevents.1.host").write_text("x")
    return ["--log.run-dir", str(run)]


CASES = {
    "divisibility": (
        lambda t: ["--rollout.prompts-per-step", "3"],
        r"--rollout.prompts-per-step \(3\) must be divisible by the world size \(2\)",
    ),
    "unknown algo": (lambda t: ["--algo", "grpp"], r"--algo 'grpp': unknown; valid: .*gigpo"),
    "config check": (lambda t: ["--rollout.group-size", "1"], r"--rollout.group-size must be >= 2"),
    "resume, no checkpoint": (
        lambda t: ["--resume", "latest", "--log.run-dir", str(t / "fresh")],
        r"--resume latest requested but no complete checkpoint",
    ),
    "earlier run": (_earlier_run, r"holds an earlier run \(TensorBoard events\)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_input_under_torchrun_prints_one_line_once_first(case, tmp_path):
    make_flags, expected = CASES[case]
    for i in range(TRIES):
        r = torchrun(["--preset", "smoke", *make_flags(tmp_path)], timeout=120, retry_abort=False, launcher="torchrun")
        where = f"{case}, try {i + 1}:\n{r.stderr[-3000:]}"
        assert r.returncode != 0, where  # torchrun's own status: 1 whenever a rank fails
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        ours = [ln for ln in lines if ln.startswith("nanosky")]
        assert len(ours) == 1 and re.search(expected, ours[0]), where
        first = next(ln for ln in lines if not BANNER.match(ln))
        assert first == ours[0], where  # before anything of torchrun's report
        # the first rank to end exited 2 (after the meeting, torchrun may stop the other one before it exits)
        root = r.stderr.split("Root Cause")[1]
        assert "exitcode  : 2" in root, where
        ours_tb = re.search(rf'File "{re.escape(ROOT)}/(run\.py|nanosky/|algos/|envs/)', r.stderr)
        assert "ValueError" not in r.stderr and not ours_tb, where  # no traceback of ours


def test_the_resume_command_repeats_the_launcher_as_typed():
    """The launcher's own flags (here multi-node rendezvous ones) and its path as typed; plain python by path too.
    The full stop → run the printed command → resume cycle is in test_resume.py."""
    import socket
    import subprocess
    import sys

    from spawn import child_env

    venv_bin = os.path.relpath(os.path.dirname(sys.executable), ROOT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = [
        f"{venv_bin}/torchrun",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
    ]
    flags = [
        "tests/scripts/launch_echo.py",
        "--preset",
        "smoke",
        "--log.run-dir",
        "runs/a b",
        "--resume",
        "step_2",
    ]
    for cmd, expected in [
        (launch, " ".join(launch) + " tests/scripts/launch_echo.py --preset smoke --log.run-dir 'runs/a b'"),
        (
            [f"{venv_bin}/python"],
            f"{venv_bin}/python tests/scripts/launch_echo.py --preset smoke --log.run-dir 'runs/a b'",
        ),
    ]:
        r = subprocess.run([*cmd, *flags], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"RESUME: {expected} --resume latest" in r.stdout, r.stdout
