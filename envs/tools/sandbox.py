"""Run an untrusted command in a throwaway sandbox: `run_sandboxed(argv, ...) -> SandboxResult`.

Every call is a fresh process tree started through `sandbox_init.py`, which (where Linux allows unprivileged
user namespaces) gives it an empty network namespace, a read-only view of the host filesystem with private
tmpfs on /tmp, /var/tmp, /dev/shm and /run, and its own pid namespace. The writable dirs you pass are the only
host paths it can change. Rlimits (CPU, address space, processes, file size) apply in every case; where
namespaces are unavailable a warning is logged once and `isolation == "none"` in the result.

    from envs.tools.sandbox import run_sandboxed
    r = run_sandboxed(["python3", "-c", "print(6 * 7)"], timeout_s=5)   # r.stdout == "42\\n"
    r = run_sandboxed([sys.executable, "-m", "pytest", "-q"], cwd=repo, writable_dirs=[repo], mem_mb=4096)

Output is read incrementally and capped per stream: at `max_output_bytes` we stop reading and kill the tree
(`killed_reason == "output_limit"`), so a program printing forever costs neither memory nor the full timeout.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

_INIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_init.py")
_isolation_error: str | None = None  # set once namespaces failed on this host; later calls skip trying
_lock = threading.Lock()


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None  # negative: killed by that signal (as in subprocess)
    timed_out: bool
    killed_reason: str | None  # "timeout" | "output_limit" | "cpu_limit" | "file_size_limit" | "process_limit"
    # | "killed" | None
    isolation: str  # "namespaces" (user+mount+net+pid) or "none" (rlimits only)
    wall_s: float = 0.0
    truncated: bool = False  # stdout or stderr hit max_output_bytes


def repo_env(python: str = sys.executable) -> dict[str, str]:
    """The environment for a repository's code and tests in the sandbox (the SWE harness and the bash tool):
    `python` and its bin dir first on PATH, no bytecode written into the tree, no pytest plugin autoload, git never
    prompts, one OpenMP thread."""
    return {
        "PATH": f"{os.path.dirname(python)}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "OMP_NUM_THREADS": "1",
    }


def run_sandboxed(
    argv: list[str],
    cwd: str | None = None,
    stdin: str | None = None,
    timeout_s: float = 10.0,
    cpu_s: float | None = None,
    mem_mb: int = 1024,
    max_procs: int = 64,
    max_file_mb: int = 64,
    max_output_bytes: int = 1_000_000,
    network: bool = False,
    extra_ro_paths: Sequence[str] = (),
    writable_dirs: Sequence[str] = (),
    env: dict[str, str] | None = None,
    tmpfs_mb: int = 256,
    isolate: bool = True,
) -> SandboxResult:
    """Run `argv` (PATH lookup as in execvp) sandboxed; never raises for anything the program does.

    cwd defaults to a fresh scratch dir (also $HOME), which is always writable and discarded afterwards.
    cpu_s defaults to timeout_s. `max_procs` counts threads too (RLIMIT_NPROC). `env` is added to a minimal
    environment (PATH, HOME, LANG); the caller's own environment is not passed on, so secrets stay out.
    extra_ro_paths: host paths under /tmp & co. that must stay visible (everything else already is, read-only).
    isolate=False skips the namespaces (rlimits, timeout and output cap only), for trusted code.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    # Check the caller's paths here: a bad one must not look like "namespaces unavailable" in sandbox_init.
    for d in [*writable_dirs, *([cwd] if cwd else [])]:
        if not os.path.isdir(d):
            raise ValueError(f"not a directory: {d!r}")
    scratch = tempfile.mkdtemp(prefix="nanosky-sbx-")
    try:
        cfg = {
            "argv": [str(a) for a in argv],
            "cwd": os.path.abspath(cwd) if cwd else scratch,
            "scratch": scratch,
            "writable_dirs": [os.path.abspath(d) for d in writable_dirs],
            "ro_paths": [os.path.abspath(p) for p in extra_ro_paths]
            + ([os.path.abspath(cwd)] if cwd else [])
            # The interpreter and its packages stay visible even when they live under /tmp (e.g. a CI checkout's
            # virtualenv), which the sandbox otherwise replaces with a private tmpfs.
            + sorted({sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}),
            "cpu_s": max(1, int(cpu_s if cpu_s is not None else timeout_s + 0.999)),
            "mem_mb": mem_mb,
            "max_procs": max_procs,
            "max_file_mb": max_file_mb,
            "tmpfs_mb": tmpfs_mb,
            "network": network,
            "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": scratch, "LANG": "C.UTF-8"},
        }
        cfg["env"].update(env or {})
        isolate = isolate and sys.platform == "linux" and _isolation_error is None
        result, error = _launch(cfg, isolate, stdin, timeout_s, max_output_bytes)
        if error is not None:  # namespaces refused: remember, warn once, run again with rlimits only
            _disable_isolation(error)
            result, error = _launch(cfg, False, stdin, timeout_s, max_output_bytes)
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _disable_isolation(error: str) -> None:
    global _isolation_error
    with _lock:
        if _isolation_error is None:
            _isolation_error = error
            log.warning("sandbox: namespaces unavailable (%s); running with rlimits only, no isolation", error)


def _launch(
    cfg: dict, isolate: bool, stdin: str | None, timeout_s: float, max_output_bytes: int
) -> tuple[SandboxResult, str | None]:
    """One attempt. Returns (result, isolation_error); the error is set only if namespaces were refused."""
    start = time.monotonic()
    # Without a private /tmp, at least well-behaved temp files (tempfile, pytest's tmp_path) go to scratch.
    env = cfg["env"] if isolate else {"TMPDIR": cfg["scratch"], **cfg["env"]}
    cfg = {**cfg, "env": env, "isolate": isolate}
    status_r, status_w = os.pipe()
    cmd = [sys.executable, "-I", "-S", _INIT_SCRIPT, json.dumps(cfg), str(status_w)]
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
            start_new_session=True,  # its own process group: one killpg reaches the whole tree
            env=env,
        )
    finally:
        os.close(status_w)
    if stdin is not None:  # a writer thread, so a program that ignores stdin cannot deadlock us
        threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()

    outs, status, killed_reason, truncated = _read_capped(proc, status_r, start + timeout_s, max_output_bytes)
    report = _parse_status(status)
    killed_reason = killed_reason or report.get("killed_reason")
    if killed_reason is None and proc.returncode is not None and proc.returncode < 0:
        killed_reason = {
            signal.SIGXCPU: "cpu_limit",
            signal.SIGXFSZ: "file_size_limit",
            signal.SIGKILL: "killed",  # CPU hard limit or the kernel's OOM killer
        }.get(-proc.returncode)
    # Only an explicit report counts as "no namespaces here": a run killed early (timeout) reports nothing.
    error = report.get("error") if isolate else None
    result = SandboxResult(
        stdout=_decode(outs[0], truncated[0], max_output_bytes),
        stderr=_decode(outs[1], truncated[1], max_output_bytes),
        returncode=proc.returncode,
        timed_out=killed_reason == "timeout",
        killed_reason=killed_reason,
        isolation=report.get("isolation", "namespaces" if isolate else "none"),
        wall_s=time.monotonic() - start,
        truncated=any(truncated),
    )
    return result, error


def _read_capped(
    proc: subprocess.Popen, status_r: int, deadline: float, cap: int
) -> tuple[list[bytearray], bytes, str | None, list[bool]]:
    """Read stdout/stderr/status until EOF, the deadline or the cap; always leaves the process tree dead."""
    outs, truncated = [bytearray(), bytearray()], [False, False]
    status, killed_reason, exited_at = b"", None, None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, 0)
    sel.register(proc.stderr, selectors.EVENT_READ, 1)
    sel.register(status_r, selectors.EVENT_READ, 2)
    try:
        while sel.get_map() and killed_reason is None:
            now = time.monotonic()
            if now >= deadline:
                killed_reason = "timeout"
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 1.0:
                break  # main process gone but a stray child holds the pipes open (no pid namespace)
            for key, _ in sel.select(timeout=min(deadline - now, 0.1)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data == 2:
                    status += chunk
                else:
                    buf = outs[key.data]
                    room = cap - len(buf)
                    buf += chunk[:room]
                    if len(chunk) > room:
                        truncated[key.data], killed_reason = True, "output_limit"
                        break
    finally:
        sel.close()
        _kill_tree(proc)
        for f in (proc.stdout, proc.stderr):
            f.close()
        os.close(status_r)
    return outs, status, killed_reason, truncated


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the program's process group and return only when every process in it is gone. SIGKILL is delivered
    asynchronously: right after killpg a fork bomb's processes can still be running (and forking) for a moment on
    a loaded box, so the group is polled and killed again until none is left. Zombies count as gone (only their
    parent, or init, can reap them)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the pid-namespace init dies with its parent (PDEATHSIG)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # unkillable (D state): do not hang the caller forever
        log.error("sandbox: process %d did not die after SIGKILL", proc.pid)
        return
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid):
        if time.monotonic() > deadline:
            log.error("sandbox: processes of group %d still alive 10 s after SIGKILL", proc.pid)
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        time.sleep(0.005)


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False  # the usual case: nothing left at all, no /proc scan needed
    except PermissionError:
        pass
    if not os.path.isdir("/proc"):
        return False
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # state, ppid, pgrp, ... (comm may hold spaces)
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _parse_status(raw: bytes) -> dict:
    """Merge the JSON lines sandbox_init wrote ({"isolation"}, {"error"}, {"killed_reason"})."""
    report = {}
    for line in raw.decode(errors="replace").splitlines():
        try:
            report.update(json.loads(line))
        except (ValueError, TypeError):
            pass
    return report


def _decode(buf: bytearray, truncated: bool, cap: int) -> str:
    text = buf.decode("utf-8", errors="replace")
    return text + f"\n[output truncated at {cap} bytes]" if truncated else text
