"""Launching the real thing from tests: `torchrun` over run.py or a test script, in a clean launcher env, and the
TensorBoard scalars a run wrote. Imported by name (`from spawn import torchrun`): tests/conftest.py puts tests/ on
sys.path for every test folder."""

import contextlib
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from multiprocessing import connection, forkserver

from nanosky.agent.serve import free_port
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
    launcher: str | None = None,
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node N script args...` from the repo root, in a clean launcher env (plus
    `env`). A run that ends in GLOO_ABORT runs once more unless `retry_abort` is False (tests of failing runs).

    `launcher`: "torchrun" runs the real one; "fork" (the default, unless NANOSKY_TEST_LAUNCHER=torchrun) forks the
    ranks from a server that imported torch, transformers and vLLM once (`forked`): the same script in N real
    processes over gloo, without ~10 s of imports a launch. A test of the launcher itself (its report, how it ends
    a failed job, the resume command it prints) names "torchrun"."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), script]
    for attempt in (1, 2):
        if (launcher or _launcher()) == "torchrun":
            r = _fresh([*cmd, *args], timeout, env)
        else:
            r = forked(script, args, nproc, timeout=timeout, env=env)
        if r.returncode == 0 or GLOO_ABORT not in r.stderr or attempt == 2 or not retry_abort:
            return r
        msg = f"a rank aborted ({GLOO_ABORT!r}); running once more. stderr:\n{r.stderr[-3000:]}"
        warnings.warn(msg, stacklevel=2)


def python(
    args: list[str], script: str = "run.py", timeout: int = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python script args...` from the repo root in a clean launcher env (plus `env`): one process, no launcher
    variables; forked from the fork server unless NANOSKY_TEST_LAUNCHER=torchrun (then a fresh interpreter)."""
    if _launcher() == "torchrun":
        return _fresh([sys.executable, script, *args], timeout, env)
    return forked(script, args, 1, timeout=timeout, env=env, ranked=False)


def _launcher() -> str:
    return os.environ.get("NANOSKY_TEST_LAUNCHER", "fork")


def _fresh(cmd: list[str], timeout: int, env: dict[str, str] | None) -> subprocess.CompletedProcess:
    """`cmd` in a fresh interpreter from the repo root, in a clean launcher env plus `env`."""
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=child_env() | (env or {}))


# What a rank imports before it trains (~10 s of CPU a launch on the 2-core box): the fork server imports it once.
PRELOAD = ["torch", "transformers", "peft", "vllm", "nanosky.startup", "nanosky.trainer", "nanosky.rollout.engine"]
PRELOAD += ["transformers.models.auto.tokenization_auto", "torch._dynamo", "vllm.entrypoints.llm"]
PRELOAD += ["vllm.v1.engine.llm_engine", "vllm.v1.worker.cpu_model_runner", "vllm.model_executor.models.llama"]
_SERVER: multiprocessing.context.BaseContext | None = None


def _server() -> multiprocessing.context.BaseContext:
    """The fork server, started once per test session with the environment torchrun gives its ranks
    (OMP_NUM_THREADS=1 is read when torch loads), and its imports done. It runs no torch op, so no thread pool
    exists when it forks."""
    global _SERVER
    if _SERVER is None:
        ctx = multiprocessing.get_context("forkserver")
        forkserver.set_forkserver_preload(PRELOAD)
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(child_env() | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _SERVER = ctx
    return _SERVER


def _rank(script: str, args: list[str], environ: dict[str, str], out: str, err: str) -> None:
    """One rank, in a child of the fork server: as `python -u script args` would start it in `environ`."""
    import atexit
    import faulthandler
    import io
    import runpy

    os.setpgid(0, 0)  # its env workers with it, so a failed job's cleanup reaches them
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    faulthandler.enable()
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(ROOT)
    path = os.path.join(ROOT, script)
    # as the interpreter builds it: the script's folder, then PYTHONPATH's entries
    sys.path[0:0] = [os.path.dirname(path), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    sys.argv = [script, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:  # a run that raises or calls sys.exit: the interpreter would run these on its way out
        atexit._run_exitfuncs()


def forked(
    script: str, args: list[str], nproc: int, timeout: int = 600, env: dict[str, str] | None = None, ranked=True
) -> subprocess.CompletedProcess:
    """`script args` in `nproc` ranks forked from the fork server, with torchrun's variables for a standalone job
    (`ranked=False`, one process: plain `python script`). Like torchrun, a rank that fails ends the others (SIGTERM,
    then SIGKILL), and the status is 1 if any rank failed (`ranked=False`: the process's own); stdout and stderr
    are the ranks' in rank order."""
    import tempfile

    ctx = _server()
    port = free_port()
    base = child_env() | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"} | (env or {})
    with tempfile.TemporaryDirectory(prefix="nanosky-ranks-") as tmp:
        procs, files = [], []
        for rank in range(nproc):
            environ = dict(base)
            if ranked:
                environ |= {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc)}
                environ |= {"LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            out, err = os.path.join(tmp, f"{rank}.out"), os.path.join(tmp, f"{rank}.err")
            p = ctx.Process(target=_rank, args=(script, args, environ, out, err), name=f"rank{rank}")
            p.start()
            procs.append(p)
            files.append((out, err))
        deadline, failed = time.monotonic() + timeout, False
        while not failed and any(p.exitcode is None for p in procs):
            left = deadline - time.monotonic()
            if left <= 0:
                _end(procs)
                raise subprocess.TimeoutExpired([script, *args], timeout, _read(files, 0), _read(files, 1))
            connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=min(left, 1.0))
            failed = any(p.exitcode not in (None, 0) for p in procs)
        if failed:
            _end(procs)
        code = procs[0].exitcode if not ranked else 0 if all(p.exitcode == 0 for p in procs) else 1
        return subprocess.CompletedProcess([script, *args], code, _read(files, 0), _read(files, 1))


def _end(procs: list, grace_s: float = 5.0) -> None:
    """Stop the ranks still running, and their process groups: SIGTERM, then SIGKILL after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            if p.exitcode is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:  # not yet its own group leader (or already gone)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, sig)
        t = time.monotonic() + grace_s
        while any(p.exitcode is None for p in procs) and time.monotonic() < t:
            connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=0.2)
    for p in procs:
        p.join(timeout=5)


def _read(files: list[tuple[str, str]], which: int) -> str:
    text = []
    for pair in files:
        try:
            with open(pair[which], errors="replace") as f:
                text.append(f.read())
        except OSError:
            pass
    return "".join(text)


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
