"""The bash tool (envs/tools/bash.py): commands run in the work tree, and nothing gets out of it: no writes
elsewhere, no network, no process that outlives its call."""

import os
import socket
import time
import uuid

import pytest

from envs.tools import BashTool, ToolCall, get_tool, run_tool_call


def _isolated(sh: BashTool) -> None:
    from envs.tools.sandbox import run_sandboxed

    if run_sandboxed(["true"], cwd=sh.root, timeout_s=5).isolation == "none":
        pytest.skip("user namespaces unavailable on this host: only rlimits apply")


def test_runs_in_the_work_tree_with_the_projects_python(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "test_pkg.py").write_text("from pkg import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    sh = BashTool(root=str(tmp_path))
    assert sh(command="pwd") == os.path.realpath(tmp_path)
    assert sh(command="ls") == "pkg\ntest_pkg.py"
    out = sh(command="python -m pytest -q -p no:cacheprovider test_pkg.py 2>&1 | tail -1")
    assert "1 passed" in out
    assert sh(command="sed -i 's/a + b/a - b/' pkg/__init__.py && cat pkg/__init__.py").endswith("return a - b")
    assert (tmp_path / "pkg" / "__init__.py").read_text().endswith("return a - b\n")  # files persist
    failed = sh(command="python -m pytest -q -p no:cacheprovider test_pkg.py")
    assert "1 failed" in failed and failed.endswith("[exit code 1]")  # the verdict survives the cut
    assert sh(command="cd pkg; export X=1") == "(no output)" and sh(command="pwd; echo ${X:-unset}") == (
        f"{os.path.realpath(tmp_path)}\nunset"
    )  # every call is a fresh shell: only files carry over
    assert not list(tmp_path.rglob("__pycache__"))  # no bytecode written into the tree


def test_writes_outside_the_work_tree_do_not_reach_the_host(tmp_path):
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("host file")
    sh = BashTool(root=str(tree))
    _isolated(sh)
    name = f"nanosky-probe-{uuid.uuid4().hex}"
    out = sh(
        command=f"echo x > {outside}/keep.txt; echo y > ../outside/new.txt; touch $HOME/{name} /etc/{name}; "
        f"echo z > /tmp/{name} && cat /tmp/{name}; ln -s {outside} link && echo w > link/via-link.txt; "
        "echo ok > inside.txt"
    )
    assert "Read-only file system" in out or "Permission denied" in out
    assert (outside / "keep.txt").read_text() == "host file" and sorted(os.listdir(outside)) == ["keep.txt"]
    assert not os.path.exists(f"/etc/{name}") and not os.path.exists(f"/tmp/{name}")  # /tmp is private
    assert (tree / "inside.txt").read_text() == "ok\n"


def test_no_network(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.3)
    port = server.getsockname()[1]
    sh = BashTool(root=str(tmp_path), timeout_s=10)
    _isolated(sh)
    try:
        out = sh(command=f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\"")
        assert "ConnectionRefusedError" in out or "OSError" in out or "unreachable" in out
        assert out.endswith("[exit code 1]")
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the listener
    finally:
        server.close()


def test_runaway_processes_die_with_the_call(tmp_path):
    token = uuid.uuid4().hex
    sh = BashTool(root=str(tmp_path), timeout_s=3)
    start = time.monotonic()
    out = sh(command=f"(sleep 600; echo {token}) & sleep 900 # {token}")
    assert out.endswith("[killed: timed out after 3s]") and time.monotonic() - start < 3 + 5
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                survivors += [pid] if token.encode() in f.read() else []
        except OSError:
            pass
    assert survivors == []  # the background child died with the call
    flood = sh(command="yes nanosky")
    assert flood.endswith("[killed: too much output]") and len(flood) < sh.max_output_chars + 100


def test_registered_and_errors_are_observations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sh = get_tool("bash")
    assert isinstance(sh, BashTool) and sh.schema["function"]["parameters"]["required"] == ["command"]
    res = run_tool_call(ToolCall(name="bash", arguments={"command": "echo hi > f.txt; cat f.txt"}), [sh])
    assert res.ok and res.output == "hi" and (tmp_path / "f.txt").read_text() == "hi\n"
    for args in ({"command": ""}, {"command": "echo \x00"}, {"cmd": "ls"}):
        res = run_tool_call(ToolCall(name="bash", arguments=args), [sh])
        assert not res.ok and res.output.startswith("Error:")
    res = run_tool_call(ToolCall(name="bash", arguments={"command": "exit 3"}), [sh])
    assert res.ok and res.output == "[exit code 3]"  # a failing command is an observation, not a tool error
