"""`bash(command)`: a shell command in the sandbox, with one work tree writable, for coding agents.

    sh = BashTool(root="/tmp/repo")
    sh(command="python -m pytest -q tests/ 2>&1 | tail -3")    # "3 passed in 0.02s"
    sh(command="echo x > /etc/y")                               # "... Read-only file system\n[exit code 1]"

Every call is a fresh `bash -c command` under `run_sandboxed`: no network, the host read-only except `root`
(private /tmp), rlimits on CPU, memory, processes and file size, a wall-clock timeout that kills the whole process
tree, and an output cap. State lives in the files only (no `cd` or variables carry over between calls, as in
SWE-agent's and OpenHands' stateless executors). The observation is stdout then stderr, cut to its head and tail
(a test run's verdict is at the end), with a last line saying how the command ended when it did not exit 0.
The registered instance (`get_tool("bash")`) works in the current directory; an env makes its own with `root=` its
work tree.
"""

from __future__ import annotations

import os
import sys

from envs.tools.base import Tool
from envs.tools.sandbox import repo_env, run_sandboxed

MAX_COMMAND_CHARS = 20_000


def clip(text: str, limit: int) -> str:
    """The head and tail of a long output (a test run's failure summary is at the end)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + " ...[cut]... " + text[len(text) - (limit - head) :]


class BashTool(Tool):
    name = "bash"
    description = "Run a bash command in the repository (no network; only the repository is writable)."
    parameters = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "a bash command line"}},
        "required": ["command"],
    }
    manages_timeout = True  # the sandbox kills the process tree at the deadline

    def __init__(
        self,
        root: str | None = None,
        timeout_s: float = 30.0,
        mem_mb: int = 4096,
        max_procs: int = 128,
        max_output_chars: int = 2_000,
        python: str = sys.executable,
    ):
        self.root, self.timeout_s, self.mem_mb, self.max_procs = root, timeout_s, mem_mb, max_procs
        self.max_output_chars, self.python = max_output_chars, python

    def __call__(self, command: str) -> str:
        return self.run({"command": command}, self.timeout_s)

    def run(self, arguments: dict, timeout_s: float) -> str:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return "Error: command must be a non-empty string"
        if len(command) > MAX_COMMAND_CHARS or "\x00" in command:
            return f"Error: command must be under {MAX_COMMAND_CHARS} characters, without NUL bytes"
        root = os.path.realpath(self.root or os.getcwd())
        limit = min(timeout_s, self.timeout_s)
        r = run_sandboxed(
            ["bash", "-c", command],
            cwd=root,
            writable_dirs=[root],
            timeout_s=limit,
            mem_mb=self.mem_mb,
            max_procs=self.max_procs,
            env=repo_env(self.python),
            max_output_bytes=8 * self.max_output_chars,
        )
        out = (r.stdout + r.stderr).strip("\n")
        if r.killed_reason in ("timeout", "cpu_limit"):
            end = f"[killed: timed out after {limit:g}s]"
        elif r.killed_reason == "output_limit":
            end = "[killed: too much output]"
        elif r.killed_reason:
            end = f"[killed: {r.killed_reason}]"
        elif r.returncode:
            end = f"[exit code {r.returncode}]"
        else:
            end = ""
        out = clip(out, self.max_output_chars)
        return (out + ("\n" + end if end and out else end)) or "(no output)"
