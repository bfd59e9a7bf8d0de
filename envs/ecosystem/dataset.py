"""dataset: any local file of prompts with a reward, as verl, TRL or a GSM8K dump writes it. One turn per episode.

    torchrun --nproc_per_node 2 run.py --env dataset --env-data train.parquet                  # verl layout, math
    torchrun --nproc_per_node 2 run.py --env dataset --env-data gsm8k.jsonl --env-kwargs.test-data test.jsonl
    torchrun --nproc_per_node 2 run.py --env dataset --env-data rows.jsonl --env-kwargs.reward my_rewards:fn

The reward is `math` (the default: math-verify on the reply's last \\boxed{}, else its last number, against the row's
ground truth, else its solution's "#### N" or \\boxed{}; envs/ecosystem/mathreward.py) or `MODULE:FN`, a TRL reward function
`fn(prompts, completions, **columns) -> list[float | None]`, called once per group with every column of the rows
(TRL's convention: a string prompt gives string completions, a chat prompt chat completions). `None` leaves an
episode unscored (success unknown, as for an env without a checker); a function that raises or returns the wrong
length masks its group (`nanosky/env_rewards.py` applies it, and counts `env/reward_errors`).

`--algo sft` trains on each train row's own solution (TRL's `completion`, the last assistant turn of `messages`,
verl's `extra_info.answer`, `response`, MATH's `solution`, a GSM8K `answer`, or `--env-kwargs.solution-key COL`).

The test split is `--env-kwargs.test-data FILE` (its "test" split for a saved DatasetDict folder), else the rows
whose prompt hashes below `--env-kwargs.test-fraction` (0.1): the same rows on every run and machine, and a prompt
never on both sides. Seeds index rows: train `seed % len(train)`, test `seed % len(test)`.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import sys
from collections.abc import Callable

from envs.base import Env, Message, StepResult
from envs.ecosystem.mathreward import gold_answer, last_boxed, math_reward
from envs.ecosystem.rows import DataError, Task, split_tasks, to_task

TEST_FRACTION = 0.1


def load_split(
    data_path: str,
    split: str,
    test_data: str | None = None,
    test_fraction: float = TEST_FRACTION,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    solution_key: str | None = None,
    **_,
) -> tuple[Task, ...]:
    """The split's tasks from `DatasetEnv`'s kwargs (those that do not choose rows, such as the reward, ignored).
    Every row must read."""
    return _read_split(
        str(data_path),
        split,
        test_data and str(test_data),
        float(test_fraction),
        prompt_key,
        answer_key,
        solution_key,
    )


@functools.lru_cache(maxsize=16)
def _read_split(data_path, split, test_data, test_fraction, prompt_key, answer_key, solution_key) -> tuple[Task, ...]:
    """Cached per process: an env is made per episode."""
    parse = functools.partial(to_task, prompt_key=prompt_key, answer_key=answer_key, solution_key=solution_key)
    return split_tasks(data_path, split, test_data, test_fraction, parse)


def import_reward(spec: str) -> Callable:
    """MODULE:FN from the working directory or the path (as --plugins); one line when it is not there."""
    module, _, fn = spec.partition(":")
    if not module or not fn:
        raise DataError(f"reward {spec!r}: expected 'math' or MODULE:FN (a TRL-style reward function)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(module), fn)
    except ModuleNotFoundError as e:
        raise DataError(f"reward {spec!r}: no module named {e.name!r}") from None
    except AttributeError:
        raise DataError(f"reward {spec!r}: module {module!r} has no {fn!r}") from None
    if not callable(obj):
        raise DataError(f"reward {spec!r}: {fn!r} is not callable")
    return obj


class DatasetEnv(Env):
    """One row of a local file, one answer turn, scored by math-verify or the user's reward function."""

    name = "dataset"
    max_turns = 1

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        data_path: str | None = None,
        prompt_key: str | None = None,
        answer_key: str | None = None,
        solution_key: str | None = None,
        reward: str = "math",
        test_data: str | None = None,
        test_fraction: float = TEST_FRACTION,
        system_prompt: str | None = None,
        success_at: float = 1.0,
    ):
        if data_path is None:
            raise DataError("env dataset needs a file: --env-data FILE (parquet, jsonl, json, csv or a saved dataset)")
        if not 0.0 < float(test_fraction) < 1.0:
            raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
        rows = load_split(
            data_path,
            split,
            test_data=test_data,
            test_fraction=test_fraction,
            prompt_key=prompt_key,
            answer_key=answer_key,
            solution_key=solution_key,
        )
        self.task, self.n_rows = rows[seed % len(rows)], len(rows)
        self.reward_spec, self.success_at = reward, float(success_at)
        if reward == "math":
            answer, sol = self.task.answer, self.task.solution
            if answer is None and sol is not None and ("####" in sol or last_boxed(sol) is not None):
                answer = sol  # an SFT file's rows (TRL's prompt-completion): the solution's own final answer
            if answer is None:
                raise DataError(
                    f"{data_path}: no answer column for the math reward (looked for "
                    "reward_model.ground_truth, answer, solution, ...; name yours with "
                    f"--env-kwargs.answer-key); columns found: {', '.join(self.task.columns)}"
                )
            self.gold = gold_answer(answer)
        else:
            import_reward(reward)  # fails at the first episode (and at start-up), not after the rollout
        self.system_prompt, self.split, self.seed, self.data_path = system_prompt, split, seed, data_path

    @classmethod
    def group_scorer(cls, split: str = "train", **kwargs) -> GroupReward | None:
        """A group's rewards at once (a TRL reward function), or None when each episode scores itself (math)."""
        reward = kwargs.get("reward", "math")
        return None if reward == "math" else GroupReward(split, kwargs)

    def reset(self) -> list[Message]:
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return head + [dict(m) for m in self.task.prompt]

    @classmethod
    def expert_refusal(cls, data_path: str | None = None, **kwargs) -> str | None:
        """A file demonstrates its rows' solutions: one whose first train row (seed 0's) has none is refused."""
        if data_path is None:
            return None
        return _no_solution(data_path, load_split(data_path, "train", **kwargs)[0])

    def expert_action(self) -> str:
        """The row's own solution (`--algo sft`'s demonstration: envs/ecosystem/rows.py says which column). The test
        split is never demonstrated."""
        if self.split != "train":
            raise DataError("dataset: no demonstration on the test split (its rows are held out)")
        if why := _no_solution(self.data_path, self.task):
            raise DataError(why)
        return self.task.solution

    def step(self, action: str) -> StepResult:
        if self.reward_spec != "math":  # scored with its group once every episode is done
            return StepResult([], 0.0, True, {"success": None, "source": self.task.source})
        reward, info = math_reward(action, self.gold)
        return StepResult([], reward, True, info | {"source": self.task.source})


def _no_solution(data_path, task: Task) -> str | None:
    if task.solution is not None:
        return None
    return (
        f"{data_path}: no solution column to demonstrate (looked for completion, messages, "
        "extra_info.answer, response, solution, and a GSM8K answer with '####'; name yours with "
        f"--env-kwargs.solution-key); columns found: {', '.join(task.columns)}"
    )


class GroupReward:
    """A TRL reward function over one group's episodes: `fn(prompts=, completions=, **columns)` where each column
    is a list over the group. Returns (rewards, successes): a reward is a float or None (unscored); success is
    reward >= `success_at` (None when unscored). Raises RewardError on a raise, a wrong length or a bad value."""

    def __init__(self, split: str, kwargs: dict):
        k = dict(kwargs)
        self.fn = import_reward(k["reward"])
        self.success_at = float(k.get("success_at", 1.0))
        self.rows = load_split(split=split, **k)  # the split's rows as `DatasetEnv` reads them (cached per process)

    def __call__(self, seeds: list[int], replies: list[str]) -> tuple[list[float | None], list[bool | None]]:
        tasks = [self.rows[s % len(self.rows)] for s in seeds]  # the row `DatasetEnv(split, seed)` played
        chat = not isinstance(tasks[0].raw_prompt, str)
        completions = [[{"role": "assistant", "content": r}] if chat else r for r in replies]
        columns = {c: [t.columns.get(c) for t in tasks] for c in tasks[0].columns if c not in ("prompt", "completions")}
        try:
            out = self.fn(prompts=[t.raw_prompt for t in tasks], completions=completions, **columns)
        except Exception as e:  # noqa: BLE001 - the user's function: its group is masked, the run goes on
            raise RewardError(f"{type(e).__name__}: {e}"[:500]) from None
        if not isinstance(out, (list, tuple)) or len(out) != len(seeds):
            got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
            raise RewardError(f"returned {got} for a group of {len(seeds)}")
        rewards: list[float | None] = []
        for v in out:
            if v is None or (isinstance(v, float) and math.isnan(v)):
                rewards.append(None)
            elif isinstance(v, (int, float)) and math.isfinite(v):
                rewards.append(float(v))
            else:
                raise RewardError(f"returned {v!r}: each reward must be a finite number or None")
        return rewards, [None if r is None else r >= self.success_at for r in rewards]


class RewardError(RuntimeError):
    """A user's reward function failed on a group (raised, returned the wrong length or a bad value)."""
