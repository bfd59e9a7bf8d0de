"""Launching the real thing from tests: `torchrun` over run.py or a test script, in a clean launcher env, and the
TensorBoard scalars a run wrote. Imported by name (`from spawn import torchrun`): tests/conftest.py puts tests/ on
sys.path for every test folder."""

import os
import re
import subprocess
import sys
import time
import warnings

from nanosky.process import LAUNCHER_VARS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def child_env() -> dict:
    """This process's environment minus the launcher variables a 1-rank test process group left behind (a child
    run must start its own group, not join ours)."""
    # a rank that aborts (SIGABRT / SIGSEGV) prints its Python stack, so a rare crash says where it happened
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {"PYTHONFAULTHANDLER": "1"}


# A rare abort of one gloo rank (about 1 run in 50–100 of the 2-rank scripts on this box, twice over two sessions'
# full suites; 0 in 31 reruns of the failing script) ends in C++ with this line; the test then runs once more.
GLOO_ABORT = "terminate called without an active exception"


def torchrun(
    args: list[str],
    nproc: int = 2,
    timeout: int = 600,
    script: str = "run.py",
    retry_abort: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node N script args...` from the repo root, in a clean launcher env (plus
    `env`). A run that ends in GLOO_ABORT runs once more unless `retry_abort` is False (tests of failing runs)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        script,
    ]
    for attempt in (1, 2):
        r = subprocess.run(
            [*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=child_env() | (env or {})
        )
        if r.returncode == 0 or GLOO_ABORT not in r.stderr or attempt == 2 or not retry_abort:
            return r
        msg = f"a rank aborted ({GLOO_ABORT!r}); running once more. stderr:\n{r.stderr[-3000:]}"
        warnings.warn(msg, stacklevel=2)


def scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def launch(args: list[str]) -> subprocess.Popen:
    """run.py at 2 ranks in the background, through the venv's torchrun by path (as after `make demo` without an
    activated venv), in a process group of its own like a job in a terminal."""
    torchrun_path = os.path.relpath(os.path.join(os.path.dirname(sys.executable), "torchrun"), ROOT)
    cmd = [torchrun_path, "--standalone", "--nproc_per_node", "2", "run.py"]
    return subprocess.Popen(
        [*cmd, *args],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_beat(path: str, offset: int, pattern: str, proc: subprocess.Popen) -> re.Match:
    """Poll a heartbeat file (`rank R pid P step S phase` lines, from byte `offset`) until a line matches."""
    deadline = time.time() + 400
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                f.seek(offset)
                m = re.search(pattern, f.read())
            if m:
                return m
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    raise TimeoutError(pattern)
