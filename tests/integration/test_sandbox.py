"""run_sandboxed: every hostile program from issue 4 is contained, reported, and the call returns promptly."""

import logging
import os
import socket
import sys
import time
import uuid

import pytest

from envs.tools import sandbox
from envs.tools.sandbox import run_sandboxed

PY = sys.executable
SLACK_S = 5.0  # generous wall-clock margin over the timeout: the box is shared and small
BOTH_MODES = pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "rlimits-only"])


def _py(code: str, **kw) -> sandbox.SandboxResult:
    return run_sandboxed([PY, "-c", code], **kw)


def _require_isolation(res: sandbox.SandboxResult) -> None:
    if res.isolation == "none":
        pytest.skip("user namespaces unavailable on this host: only rlimits apply")


def test_runs_a_program_and_reports_isolation():
    res = _py("import os; print(6 * 7); print(os.getcwd())", timeout_s=10)
    assert res.returncode == 0 and not res.timed_out and res.killed_reason is None
    out = res.stdout.splitlines()
    assert out[0] == "42"
    assert os.path.basename(out[1]).startswith("nanosky-sbx-")  # a fresh scratch dir is the default cwd
    assert res.isolation in ("namespaces", "none")


@BOTH_MODES
def test_infinite_loop_times_out(isolate):
    start = time.monotonic()
    res = _py("while True: pass", timeout_s=1.5, cpu_s=30, isolate=isolate)
    assert res.timed_out and res.killed_reason == "timeout" and res.returncode != 0
    assert time.monotonic() - start < 1.5 + SLACK_S


def test_cpu_limit_kills_before_the_wall_clock():
    start = time.monotonic()
    res = _py("while True: pass", timeout_s=20, cpu_s=1)
    assert res.killed_reason in ("cpu_limit", "killed") and not res.timed_out
    assert time.monotonic() - start < 1 + SLACK_S


@BOTH_MODES
def test_4gb_allocation_fails_inside(isolate):
    res = _py("x = bytearray(4 * 1024**3); print('allocated')", timeout_s=10, mem_mb=512, isolate=isolate)
    assert res.returncode != 0 and "allocated" not in res.stdout
    assert "MemoryError" in res.stderr


def test_fork_bomb_is_contained():
    token = uuid.uuid4().hex  # in every bomb process's command line, so survivors can be found
    bomb = f"import os  # {token}\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    res = _py(bomb, timeout_s=4, max_procs=16)
    if res.isolation == "none" and os.geteuid() == 0:
        pytest.skip("as root without namespaces RLIMIT_NPROC does not apply; only the timeout did")
    assert time.monotonic() - start < 4 + SLACK_S
    assert res.killed_reason in ("process_limit", "timeout") or res.returncode != 0
    # run_sandboxed returns only when the whole tree is dead: no grace period (zombies have an empty cmdline)
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    survivors.append(pid)
        except OSError:
            pass
    assert survivors == []


@BOTH_MODES
def test_100mb_of_output_is_capped(isolate):
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1024 * 1024)\n"
    start = time.monotonic()
    res = _py(code, timeout_s=20, max_output_bytes=64 * 1024, isolate=isolate)
    assert res.truncated and res.killed_reason == "output_limit"
    assert 64 * 1024 <= len(res.stdout) < 64 * 1024 + 200  # the cap plus a short truncation note
    assert time.monotonic() - start < 20  # stopped at the cap, not at the timeout


def test_no_network_not_even_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.3)
    port = server.getsockname()[1]
    code = (
        "import socket\ns = socket.socket(); s.settimeout(3)\n"
        f"try:\n    s.connect(('127.0.0.1', {port})); print('connected')\n"
        "except OSError as e:\n    print('refused', e)\n"
    )
    try:
        res = _py(code, timeout_s=10)
        _require_isolation(res)
        assert res.stdout.startswith("refused") and "connected" not in res.stdout
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever reached the listener
    finally:
        server.close()


def test_network_flag_allows_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        res = _py(f"import socket; socket.create_connection(('127.0.0.1', {port}), 3); print('ok')", network=True)
        assert res.stdout.strip() == "ok"
    finally:
        server.close()


def test_writes_outside_scratch_do_not_reach_host(tmp_path):
    name = f"nanosky-probe-{uuid.uuid4().hex}"
    (tmp_path / "keep.txt").write_text("host file")
    code = (
        "import os\n"
        f"open('/tmp/{name}', 'w').write('x'); print('tmp ok', open('/tmp/{name}').read())\n"
        "open('scratch.txt', 'w').write('s'); print('scratch ok')\n"
        f"try:\n    open({str(tmp_path / name)!r}, 'w').write('x'); print('wrote host dir')\n"
        "except OSError as e:\n    print('host dir refused', e.errno)\n"
    )
    res = _py(code, timeout_s=10)
    _require_isolation(res)
    assert "tmp ok x" in res.stdout and "scratch ok" in res.stdout  # a private /tmp and scratch still work
    assert "host dir refused" in res.stdout
    assert not os.path.exists(f"/tmp/{name}") and not (tmp_path / name).exists()
    assert (tmp_path / "keep.txt").read_text() == "host file"


def test_cannot_undo_the_mounts():
    res = run_sandboxed(["sh", "-c", "mount -o remount,rw / 2>&1; umount /tmp 2>&1; id -u"], timeout_s=10)
    _require_isolation(res)
    assert res.stdout.strip().splitlines()[-1] != "0"  # the program is not root in its namespace
    probe = run_sandboxed(["sh", "-c", "touch /nanosky-probe-root 2>&1 || echo refused"], timeout_s=10)
    assert "refused" in probe.stdout and not os.path.exists("/nanosky-probe-root")


def test_pytest_runs_in_a_writable_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "test_add.py").write_text(
        "from pkg import add\n\n"
        "def test_add(tmp_path):\n"
        "    (tmp_path / 'x').write_text('1')\n"
        "    open('artifact.txt', 'w').write('made in sandbox')\n"
        "    assert add(2, 3) == 5\n"
    )
    res = run_sandboxed(
        [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=str(repo),
        writable_dirs=[str(repo)],
        timeout_s=60,
        mem_mb=2048,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed" in res.stdout
    assert (repo / "artifact.txt").read_text() == "made in sandbox"  # writable dirs do reach the host


def test_stdin_env_and_no_leaked_environment(monkeypatch):
    monkeypatch.setenv("NANOSKY_TEST_SECRET", "hunter2")
    code = (
        "import os, sys; print(sys.stdin.read().upper(), os.environ.get('MY_VAR'), 'NANOSKY_TEST_SECRET' in os.environ)"
    )
    res = _py(code, stdin="hello", env={"MY_VAR": "v"}, timeout_s=10)
    assert res.stdout.split() == ["HELLO", "v", "False"]


def test_missing_program_and_bad_cwd():
    res = run_sandboxed(["nanosky-no-such-binary"], timeout_s=5)
    assert res.returncode == 127 and "cannot start" in res.stderr
    with pytest.raises(ValueError):
        run_sandboxed(["true"], cwd="/nonexistent/dir")


def test_unavailable_isolation_warns_once_and_keeps_limits(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_isolation_error", None)  # restored after the test
    with caplog.at_level(logging.WARNING, logger="envs.tools.sandbox"):
        sandbox._disable_isolation("simulated: unshare refused")
        sandbox._disable_isolation("simulated again")
    assert len([r for r in caplog.records if "namespaces unavailable" in r.getMessage()]) == 1
    res = _py("while True: pass", timeout_s=1)
    # whichever limit fires first (wall clock or the CPU-time rlimit), the loop is stopped
    assert res.isolation == "none" and (res.timed_out or res.killed_reason == "cpu_limit")
