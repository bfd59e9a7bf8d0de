"""The SWE agent env: a fresh sandboxed checkout of `base_commit`, tools to look around and edit, and `submit`.

    env = SWEEnv(instance)            # a normalised instance with local_repo
    msgs = env.reset()                # [system, user(issue)]; the work tree is created here
    env.step('<tool_call>{"name": "view", "arguments": {"path": "textkit/wrap.py"}}</tool_call>')
    patch = env.finish()              # `git diff` against base (new files included); removes the work tree

Tools: shell(command) runs `bash -c` in the sandbox (network off, only the work tree writable); view(path, start)
shows numbered lines or a directory listing; edit(path, old, new) replaces one unique occurrence (an empty `old`
creates a new file); submit() ends the episode. Outputs are cut to `obs_chars` so a small context survives.
The env's reward is 0: grading (tests) happens after the episode, in the harness, like the official benchmark.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any

from envs.base import Env, Message, StepResult
from envs.tools import Tool, parse_tool_calls, run_tool_call
from evals.swebench import harness

SYSTEM_PROMPT = "Fix the issue in this repo with the tools, then call submit."
NUDGE = "Call a tool: <tool_call>{...}</tool_call>; submit when done."


def clip(text: str, limit: int) -> str:
    """Head and tail of a long output (the tail of a test run is where the failure is)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + " ...[cut]... " + text[len(text) - (limit - head) :]


class _RepoTool(Tool):
    def __init__(self, env: SWEEnv):
        self.env = env

    def path(self, rel: str) -> str:
        """`rel` inside the work tree (symlinks resolved), or ValueError."""
        root = os.path.realpath(self.env.workdir)
        full = os.path.realpath(os.path.join(root, str(rel).strip() or "."))
        outside = full != root and not full.startswith(root + os.sep)
        if outside or "/.git/" in full[len(root) :] + "/":  # .git too: hooks and config are not the agent's
            raise ValueError(f"path {rel!r} is outside the repository")
        return full


class ShellTool(_RepoTool):
    name = "shell"
    description = "Run a bash command."
    parameters = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
    manages_timeout = True  # the sandbox enforces it

    def run(self, arguments: dict, timeout_s: float) -> str:
        r = harness.sandboxed(["bash", "-c", arguments["command"]], self.env.workdir,
                              timeout_s=min(timeout_s, self.env.cmd_timeout_s), python=self.env.python)  # fmt: skip
        out = (r.stdout + r.stderr).strip()
        if r.killed_reason:
            out += f"\n[killed: {r.killed_reason}]"
        elif r.returncode:
            out += f"\n[exit code {r.returncode}]"
        return clip(out or "(no output)", self.env.obs_chars)

    def __call__(self, command: str) -> str:
        return self.run({"command": command}, self.env.cmd_timeout_s)


class ViewTool(_RepoTool):
    name = "view"
    description = "Show a file from line start, or list a directory."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer"}},
                  "required": ["path"]}  # fmt: skip

    def __call__(self, path: str, start: int = 1) -> str:
        full = self.path(path)
        if os.path.isdir(full):
            names = sorted(
                n + ("/" if os.path.isdir(os.path.join(full, n)) else "") for n in os.listdir(full)
            )
            return clip(" ".join(n for n in names if n != ".git/"), self.env.obs_chars)
        with open(full, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        start = max(1, int(start))
        out, used = [], 0
        for i in range(start - 1, len(lines)):
            line = f"{i + 1}: {lines[i]}"
            if used + len(line) > self.env.obs_chars and out:
                out.append(f"[{len(lines) - i} more lines; view with start={i + 1}]")
                break
            out.append(line)
            used += len(line) + 1
        return "\n".join(out) or f"(file has {len(lines)} lines)"


class EditTool(_RepoTool):
    name = "edit"
    description = "Replace the unique text old with new in a file."
    parameters = {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                  "new": {"type": "string"}}, "required": ["path", "old", "new"]}  # fmt: skip

    def __call__(self, path: str, old: str, new: str) -> str:
        full = self.path(path)
        if not os.path.exists(full):
            if old:
                return f"Error: no file {path}"
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(new)
            return f"created {path}"
        with open(full, encoding="utf-8") as f:
            text = f.read()
        n = text.count(old) if old else 0
        if n != 1:
            return f"Error: old text found {n} times in {path}; it must occur exactly once"
        with open(full, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new, 1))
        return f"edited {path}"


class SubmitTool(Tool):
    name = "submit"
    description = "Finish."
    parameters = {"type": "object", "properties": {}, "required": []}

    def __call__(self) -> str:
        return "submitted"


class SWEEnv(Env):
    name = "swebench"

    def __init__(self, instance: dict, max_turns: int = 8, obs_chars: int = 300, issue_chars: int = 700,
                 cmd_timeout_s: float = 30.0, python: str = sys.executable, max_calls_per_turn: int = 4):  # fmt: skip
        self.instance, self.max_turns, self.obs_chars, self.issue_chars = (
            instance,
            max_turns,
            obs_chars,
            issue_chars,
        )
        self.cmd_timeout_s, self.python, self.max_calls_per_turn = cmd_timeout_s, python, max_calls_per_turn
        self.tools = [ShellTool(self), ViewTool(self), EditTool(self), SubmitTool()]
        self.workdir: str | None = None
        self.patch: str | None = None
        self.error: str | None = None
        self.turn, self.submitted, self.n_calls, self.n_invalid = 0, False, 0, 0

    def reset(self) -> list[Message]:
        self._cleanup()
        self.patch, self.error, self.turn, self.submitted, self.n_calls, self.n_invalid = (
            None,
            None,
            0,
            False,
            0,
            0,
        )
        self.workdir = tempfile.mkdtemp(prefix="nanosky-swe-")
        try:
            repo = harness.resolve_repo(self.instance["local_repo"], self.instance["base_commit"])
            harness.checkout(repo, self.instance["base_commit"], self.workdir)
        except Exception as e:  # noqa: BLE001 - reported at the first step, never raised
            self.error = f"checkout failed: {type(e).__name__}: {e}"[:300]
        issue = clip(self.instance["problem_statement"].strip(), self.issue_chars)
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": issue}]

    def step(self, action: str) -> StepResult:
        try:
            return self._step(action if isinstance(action, str) else "")
        except Exception as e:  # noqa: BLE001 - step never raises
            self.finish()
            return StepResult([], 0.0, True, self._info([], error=repr(e)[:300]))

    def _step(self, action: str) -> StepResult:
        if self.error or self.patch is not None:
            return StepResult([], 0.0, True, self._info([], error=self.error or "episode is over"))
        self.turn += 1
        calls = parse_tool_calls(action)[: self.max_calls_per_turn]
        table = {t.name: t for t in self.tools}
        results = []
        for call in calls:
            if call.name == "submit" and not call.error:
                self.submitted = True
                break
            results.append(run_tool_call(call, table, self.cmd_timeout_s))
        self.n_calls += len(results) + self.submitted
        self.n_invalid += sum(not r.ok for r in results)
        if self.submitted or self.turn >= self.max_turns:
            self.finish()
            return StepResult([], 0.0, True, self._info(results))
        obs = [r.to_message() for r in results] or [{"role": "user", "content": NUDGE}]
        return StepResult(obs, 0.0, False, self._info(results))

    def _info(self, results: list, **extra: Any) -> dict:
        # tool_calls / invalid_calls are cumulative over the episode (as the agent loop expects); calls: this turn's.
        return {"success": False, "tool_calls": self.n_calls, "invalid_calls": self.n_invalid,
                "calls": [r.record() for r in results], "submitted": self.submitted, "turn": self.turn, **extra}  # fmt: skip

    def finish(self) -> str:
        """The episode's patch (computed once), then the work tree is removed. Safe to call any time."""
        if self.patch is None:
            ok = self.workdir and not self.error and os.path.isdir(os.path.join(self.workdir, ".git"))
            self.patch = harness.diff_against(self.workdir, self.instance["base_commit"]) if ok else ""
        self._cleanup()
        return self.patch

    def _cleanup(self) -> None:
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
