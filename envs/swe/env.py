"""The SWE agent env: a fresh sandboxed checkout of `base_commit`, the shared `bash` and `str_replace_editor` tools
confined to it, and `submit`.

    env = SWEEnv(instance)            # a normalised SWE-bench instance with local_repo
    msgs = env.reset()                # [system, user(issue)]; the work tree is created here
    env.step('<tool_call>{"name": "str_replace_editor", "arguments": {"command": "view", "path": "pkg/a.py"}}</tool_call>')
    env.expert_action()               # the scripted expert's next turn (view, fix, run the tests, submit)
    patch = env.finish()              # `git diff` against base (new files included); removes the work tree

Tools: bash(command) runs `bash -c` in the sandbox (network off, only the work tree writable, envs/tools/bash.py);
str_replace_editor(command, path, ...) views and edits files (envs/tools/editor.py; .git is off limits); submit()
ends the episode. Outputs are cut to `obs_chars` so a small context survives. With `grade=False` (the eval) the
reward is 0 and grading happens after the episode, in the harness, like the official benchmark; with `grade=True`
(training) the episode's patch is graded in the sandbox when it ends and the reward is 1 for a resolved instance
(or, with `partial_credit`, the fraction of FAIL_TO_PASS tests that pass when every PASS_TO_PASS test does).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from typing import Any

from envs.base import Env, Message, StepResult
from envs.swe import harness
from envs.tools import (
    BashTool,
    StrReplaceEditor,
    Tool,
    format_tool_call,
    parse_tool_calls,
    run_tool_call,
    tool_call_grammar,
)
from envs.tools.bash import clip

SYSTEM_PROMPT = "Fix the issue in this repo with the tools, then call submit."
NUDGE = "Call a tool: <tool_call>{...}</tool_call>; submit when done."
TEST_COMMAND = "python -m pytest -q 2>&1 | tail -3"

__all__ = ["SWEEnv", "SubmitTool", "clip", "expert_plan"]


class SubmitTool(Tool):
    name = "submit"
    description = "Finish: your changes are the fix."
    parameters = {"type": "object", "properties": {}, "required": []}

    def __call__(self) -> str:
        return "submitted"


class SWEEnv(Env):
    name = "swebench"

    def __init__(
        self,
        instance: dict,
        max_turns: int = 8,
        obs_chars: int = 300,
        issue_chars: int = 700,
        cmd_timeout_s: float = 30.0,
        python: str = sys.executable,
        max_calls_per_turn: int = 4,
        grade: bool = False,
        partial_credit: bool = False,
        test_timeout_s: float = 120.0,
        constrain_paths: bool = True,
        constrain_old_str: bool = True,
    ):
        self.instance, self.max_turns, self.obs_chars, self.issue_chars = (
            instance,
            max_turns,
            obs_chars,
            issue_chars,
        )
        self.cmd_timeout_s, self.python, self.max_calls_per_turn = cmd_timeout_s, python, max_calls_per_turn
        self.grade, self.partial_credit, self.test_timeout_s = grade, partial_credit, test_timeout_s
        self.constrain_paths, self.constrain_old_str = constrain_paths, constrain_old_str
        self.bash = BashTool(timeout_s=cmd_timeout_s, max_output_chars=obs_chars, python=python)
        self.editor = StrReplaceEditor(max_output_chars=obs_chars, protected=(".git",))
        self.tools = [self.bash, self.editor, SubmitTool()]
        self.workdir: str | None = None
        self.patch: str | None = None
        self.error: str | None = None
        self.result: dict | None = None  # the harness's verdict (grade=True)
        self.turn, self.submitted, self.n_calls, self.n_invalid, self.steps = 0, False, 0, 0, 0
        self.done = False

    def reset(self) -> list[Message]:
        self._cleanup()
        self.patch, self.error, self.result, self.done = None, None, None, False
        self.turn, self.submitted, self.n_calls, self.n_invalid, self.steps = 0, False, 0, 0, 0
        self.workdir = tempfile.mkdtemp(prefix="nanosky-swe-")
        self.bash.root = self.editor.root = self.workdir
        self.editor.history = {}
        try:
            repo = harness.resolve_repo(self.instance["local_repo"], self.instance["base_commit"])
            harness.checkout(repo, self.instance["base_commit"], self.workdir)
        except Exception as e:  # noqa: BLE001 - reported at the first step, never raised
            self.error = f"checkout failed: {type(e).__name__}: {e}"[:300]
        self.plan = expert_plan(self.instance, self._read)
        issue = clip(self.instance["problem_statement"].strip(), self.issue_chars)
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": issue}]

    def step(self, action: str) -> StepResult:
        try:
            return self._step(action if isinstance(action, str) else "")
        except Exception as e:  # noqa: BLE001 - step never raises
            self.finish()
            self.done = True
            return StepResult([], 0.0, True, self._info([], error=repr(e)[:300]))

    def _step(self, action: str) -> StepResult:
        if self.error or self.patch is not None:
            self.done = True
            return StepResult([], 0.0, True, self._info([], error=self.error or "episode is over"))
        self.turn += 1
        self.steps = self.turn
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
            reward, extra = self._end()
            return StepResult([], reward, True, self._info(results, **extra))
        obs = [r.to_message() for r in results] or [{"role": "user", "content": NUDGE}]
        return StepResult(obs, 0.0, False, self._info(results))

    def _end(self) -> tuple[float, dict]:
        """Finish the episode; with `grade`, grade its patch in the sandbox (test run included in `grade_s`)."""
        self.done = True
        patch = self.finish()
        if not self.grade:
            return 0.0, {}
        t0 = time.perf_counter()
        self.result = harness.evaluate_instance(self.instance, patch, self.test_timeout_s, self.python)
        status = self.result.get("tests_status", {})
        f2p = status.get("FAIL_TO_PASS", {"success": [], "failure": []})
        p2p_ok = not status.get("PASS_TO_PASS", {}).get("failure") and bool(status)
        n = len(f2p["success"]) + len(f2p["failure"])
        reward = 1.0 if self.result["resolved"] else 0.0
        if self.partial_credit and not self.result["resolved"] and p2p_ok and n:
            reward = len(f2p["success"]) / n
        return reward, {
            "success": self.result["resolved"],
            "resolution": self.result["resolution"],
            "patch_applied": self.result["patch_applied"],
            "empty_patch": self.result["empty_patch"],
            "grade_s": round(time.perf_counter() - t0, 3),
        }

    def _info(self, results: list, **extra: Any) -> dict:
        # tool_calls / invalid_calls are cumulative over the episode (as the agent loop expects); calls: this turn's.
        return {
            "success": False,
            "tool_calls": self.n_calls,
            "invalid_calls": self.n_invalid,
            "calls": [r.record() for r in results],
            "submitted": self.submitted,
            "turn": self.turn,
            **extra,
        }

    def _read(self, path: str) -> str | None:
        try:
            with open(os.path.join(self.workdir or "", path), encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None

    def action_grammar(self) -> str:
        """Every turn is one call of bash / str_replace_editor / submit (`--rollout.constrain-actions`). With
        `constrain_paths` the editor's path, for every command but create, is one that is in the work tree now
        (made-up paths were a third of the failed calls under RL, docs/experiments/swe.md). With `constrain_old_str` too, a
        str_replace's old_str is text that is in its file exactly once (an old_str with no match was the most
        common failed call left, docs/experiments/swe.md)."""
        paths = self.editor.tree_paths() if self.constrain_paths and self.workdir else None
        if paths is None:
            return tool_call_grammar(self.tools)
        olds = self.editor.old_str_choices(paths) if self.constrain_old_str else None
        return tool_call_grammar(self.tools, {self.editor.name: self.editor.arguments_schema_within(paths, olds)})

    def expert_action(self) -> str:
        """The scripted expert's next turn: read the file(s) the fix touches, make the fix with str_replace, run the
        tests, submit. It follows the instance's gold patch (its plan is fixed at reset)."""
        return self.plan[min(self.turn, len(self.plan) - 1)]

    def finish(self) -> str:
        """The episode's patch (computed once), then the work tree is removed. Safe to call any time."""
        if self.patch is None:
            ok = self.workdir and not self.error and os.path.isdir(os.path.join(self.workdir, ".git"))
            self.patch = harness.diff_against(self.workdir, self.instance["base_commit"]) if ok else ""
        self._cleanup()
        return self.patch

    def close(self) -> None:
        """The checkout goes (the env pool and `EnvTask` call this when the episode ends)."""
        self._cleanup()

    def _cleanup(self) -> None:
        if getattr(self, "workdir", None):
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


# ---------------------------------------------------------------------------------------------- the expert


def expert_plan(instance: dict, read=lambda path: None) -> list[str]:
    """The expert's turns for an instance: (find the function,) view each file the gold patch touches, one
    str_replace per hunk with the smallest old_str unique in the file (`read(path)` gives its text), run the tests,
    submit."""
    edits = patch_edits(instance["patch"], read)
    turns = []
    bug = instance.get("bug") or {}
    if instance.get("level", 1) > 1 and bug.get("function"):
        turns.append(format_tool_call("bash", {"command": f"grep -rn 'def {bug['function']}(' --include=*.py ."}))
    for path in dict.fromkeys(e["path"] for e in edits):
        turns.append(format_tool_call("str_replace_editor", {"command": "view", "path": path}))
    for e in edits:
        turns.append(format_tool_call("str_replace_editor", e))
    turns.append(format_tool_call("bash", {"command": TEST_COMMAND}))
    turns.append(format_tool_call("submit", {}))
    return turns


def patch_edits(patch: str, read=lambda path: None) -> list[dict]:
    """str_replace_editor arguments that apply `patch`, one per hunk (a new file is one `create`). Each old_str is the
    hunk's changed lines, widened by context lines only until it is unique in the file (`read(path)`, or the
    patch's own lines when it gives None)."""
    out = []
    for block in re.split(r"^diff --git ", patch, flags=re.MULTILINE)[1:]:
        path = re.search(r"^\+\+\+ b/(\S+)", block, flags=re.MULTILINE).group(1)
        hunks = re.split(r"^@@[^\n]*\n", block, flags=re.MULTILINE)[1:]
        lines_of = [[(ln[:1], ln[1:]) for ln in h.split("\n") if ln[:1] in (" ", "-", "+")] for h in hunks]
        if re.search(r"^--- /dev/null", block, flags=re.MULTILINE):
            out.append({"command": "create", "path": path, "file_text": "".join(t + "\n" for _, t in lines_of[0])})
            continue
        original = read(path) or "\n".join(t for h in lines_of for tag, t in h if tag != "+")
        for h in lines_of:
            out.append({"command": "str_replace", "path": path, **_smallest(h, original)})
    return out


def _smallest(hunk: list[tuple[str, str]], original: str) -> dict:
    changed = [i for i, (tag, _) in enumerate(hunk) if tag != " "]
    lo, hi = changed[0], changed[-1]
    while True:
        span = hunk[lo : hi + 1]
        old = "\n".join(t for tag, t in span if tag != "+")
        if old.strip() and original.count(old) == 1 or (lo == 0 and hi == len(hunk) - 1):
            return {"old_str": old, "new_str": "\n".join(t for tag, t in span if tag != "-")}
        lo, hi = max(0, lo - 1), min(len(hunk) - 1, hi + 1)
