"""`envs.make("swe", split, seed, level=1)`: fix a bug in a Python repository with bash and str_replace_editor.

    env = envs.make("swe", "train", seed=3, level=1)   # a generated package with one injected bug
    env.instance                                        # its SWE-bench fields (+ local_repo, level, bug)
    env.reset(); env.step(env.expert_action())          # the scripted expert: view, fix, run the tests, submit
    envs.make("swe", "test", seed=0)                    # the shipped swe_mini suite (seed % 27), unseen in training
    envs.make("swe", "test", seed=0, test_suite="generated")   # held-out generated bugs

The train split is generated (`envs/swe/generate.py`): small packages built from templates, one SWE-smith-style bug
each, an issue written from the failing behaviour, FAIL_TO_PASS and PASS_TO_PASS tests. `level` is 1, 2 or 3, or a
list to draw from by seed. The reward is 1 when the submitted work tree passes every FAIL_TO_PASS and PASS_TO_PASS
test, graded by the local SWE-bench harness (`envs/swe/harness.py`) in the sandbox (`partial_credit`: else the fraction of FAIL_TO_PASS
that pass, when no PASS_TO_PASS test broke).
"""

from __future__ import annotations

import json
import sys

from envs.swe import harness
from envs.swe.build import to_instance
from envs.swe.env import SWEEnv, expert_plan, patch_edits
from envs.swe.generate import LEVELS, Task, generate

_MINI: list[dict] | None = None
OBS_CHARS = 1600
"""Tool outputs are cut to this many characters: a whole level-1 module's view (up to ~1,300) fits."""


def mini_suite() -> list[dict]:
    """The shipped swe_mini instances (built once per process)."""
    global _MINI
    if _MINI is None:
        from envs.swe.suite import build_suite

        _MINI = build_suite()
    return _MINI


class SWETaskEnv(SWEEnv):
    name = "swe"

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        level: int | list[int] = 1,
        test_suite: str = "mini",
        partial_credit: bool = False,
        max_turns: int = 8,
        obs_chars: int = OBS_CHARS,
        cache_dir: str | None = None,
        cmd_timeout_s: float = 30.0,
        python: str = sys.executable,
        constrain_paths: bool = True,
        constrain_old_str: bool = True,
    ):
        levels = json.loads(level) if isinstance(level, str) else level
        levels = [levels] if isinstance(levels, int) else list(levels)
        if not levels or any(lv not in LEVELS for lv in levels):
            raise ValueError(f"level must be one of {LEVELS} or a list of them, got {level!r}")
        if test_suite not in ("mini", "generated"):
            raise ValueError(f"test_suite must be 'mini' or 'generated', got {test_suite!r}")
        if split == "test" and test_suite == "mini":
            rows = mini_suite()
            row = rows[seed % len(rows)]
        else:
            row = to_instance(generate(seed, levels[seed % len(levels)], split), cache_dir)
        self.split, self.seed = split, seed
        super().__init__(
            harness.normalize_instance(row),
            max_turns=max_turns,
            obs_chars=obs_chars,
            cmd_timeout_s=cmd_timeout_s,
            python=python,
            grade=True,
            partial_credit=partial_credit,
            constrain_paths=constrain_paths,
            constrain_old_str=constrain_old_str,
        )


__all__ = [
    "SWEEnv",
    "SWETaskEnv",
    "Task",
    "generate",
    "to_instance",
    "expert_plan",
    "patch_edits",
    "mini_suite",
]
