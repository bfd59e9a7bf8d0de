"""`python_exec(code)`: run a Python snippet in the sandbox and return what it printed, truncated.

Each call is a fresh `python -I -c code` under `run_sandboxed` (no network, read-only host, rlimits). The
output the model sees is stdout, then the last lines of stderr when the program failed, cut at `max_chars`.

    get_tool("python_exec")(code="print(sum(range(10)))")   # "45"
"""

from __future__ import annotations

import sys

from envs.tools.base import Tool
from envs.tools.sandbox import run_sandboxed

MAX_CODE_CHARS = 20_000  # a single argv string is capped by the kernel at 128 KiB anyway


class PythonExecTool(Tool):
    name = "python_exec"
    description = "Run Python code and return what it prints (use print)."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a Python program"}},
        "required": ["code"],
    }
    manages_timeout = True  # the sandbox kills the program at the deadline

    def __init__(
        self,
        timeout_s: float = 5.0,
        mem_mb: int = 512,
        max_procs: int = 16,
        max_chars: int = 400,
        python: str = sys.executable,
    ):
        self.timeout_s, self.mem_mb, self.max_procs = timeout_s, mem_mb, max_procs
        self.max_chars, self.python = max_chars, python

    def __call__(self, code: str) -> str:
        return self.run({"code": code}, self.timeout_s)

    def run(self, arguments: dict, timeout_s: float) -> str:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return "Error: code must be a non-empty string"
        if len(code) > MAX_CODE_CHARS:
            return f"Error: code longer than {MAX_CODE_CHARS} characters"
        if "\x00" in code:
            return "Error: code contains a NUL byte"
        limit = min(timeout_s, self.timeout_s)
        res = run_sandboxed(
            [self.python, "-I", "-c", code],
            timeout_s=limit,
            mem_mb=self.mem_mb,
            max_procs=self.max_procs,
            max_file_mb=16,
            max_output_bytes=4 * self.max_chars,  # more than we show: the cut below still marks truncation
            env={"PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
        )
        stdout = res.stdout.strip("\n")
        if res.killed_reason in ("timeout", "cpu_limit"):
            error = f"timed out after {limit:g}s"
        elif res.killed_reason not in (None, "output_limit"):
            error = f"killed ({res.killed_reason})"
        elif res.returncode != 0 and res.killed_reason is None:
            tail = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()][-1:]  # "ValueError: ..."
            error = f"exit code {res.returncode}" + (f": {tail[0]}" if tail else "")
        else:
            error = None
        # Errors first: run_tool_call counts an output starting with "Error:" as a failed call.
        out = f"Error: {error}" + (f"\nOutput: {stdout}" if stdout else "") if error else stdout
        if len(out) > self.max_chars or res.truncated:
            out = out[: self.max_chars] + " ...[truncated]"
        return out or "(no output)"
