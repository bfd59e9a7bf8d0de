"""reasoning_gym: reasoning-gym's procedural tasks (105 of its 106 generate and score offline), one answer turn each.

    torchrun --nproc_per_node 2 run.py --env reasoning_gym --env-kwargs.tasks basic_arithmetic,chain_sum \\
        --env-kwargs.config '{"basic_arithmetic": {"max_terms": 2, "max_digits": 1}}' --env-kwargs.weights 3,1

The prompt asks for the answer in <answer> tags (reasoning-gym's own "default" system prompt, or
`--env-kwargs.system-prompt`); the reward is the task's own `score_answer` on the tag's content; success is a full
score. Each task's reward and success go to TensorBoard as `env/<task>/reward`, `env/<task>/success`.

Splits: the test split is `test_size` questions per task from a dataset seeded far from the train one (item i of a
reasoning-gym dataset is drawn from `Random(seed + i)`, and the seed ranges never meet); the validation split (for
choosing the lr, the steps and the checkpoint) is made as the test split from its own range. A train draw that
repeats a held-out question is drawn again, so no held-out question is ever trained on. Each episode's info holds
`lenient`: the task's own scorer on the answer however the reply states it (`envs.answers.stated_answer`).
"""

from __future__ import annotations

import functools
import json
import random

from envs.answers import LAST_PROMPT, stated_answer
from envs.base import Env, Message, StepResult
from envs.ecosystem import require

TRAIN_SEED, TRAIN_SIZE = 0, 100_000  # train items come from Random(0 + i), i < 100_000 ...
TEST_SEED = 1_000_000_000  # ... test items from Random(10^9 + i): the ranges never meet
ANSWER_FORMATS = ("tags", "last")
HELD_OUT = {"test": TEST_SEED, "validation": 2_000_000_000}  # validation items from Random(2 * 10^9 + i)


def _names(tasks) -> tuple[str, ...]:
    out = tuple(t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if str(t).strip())
    if not out:
        raise ValueError("reasoning_gym needs --env-kwargs.tasks NAME[,NAME...]")
    return out


def task_names() -> list[str]:
    """Every task reasoning-gym registers (composite excluded: it takes a list of dataset specs)."""
    return sorted(n for n in require("reasoning_gym").factory.DATASETS if n != "composite")


def _configs(tasks: tuple[str, ...], config) -> dict[str, dict]:
    if isinstance(config, str):
        try:
            config = json.loads(config) if config.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"config: not JSON ({e.msg}): {config[:80]!r}") from None
    config = config or {}
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise ValueError('config must map a task to its settings: {"basic_arithmetic": {"max_digits": 1}}')
    if extra := sorted(set(config) - set(tasks)):
        raise ValueError(f"config names {extra}, which are not in tasks {list(tasks)}")
    return {t: dict(config.get(t, {})) for t in tasks}


def _weights(tasks: tuple[str, ...], weights) -> tuple[float, ...]:
    if weights is None:
        return (1.0,) * len(tasks)
    if isinstance(weights, str):
        weights = [w for w in weights.split(",") if w.strip()]
    if isinstance(weights, dict):
        weights = [weights.get(t, 0.0) for t in tasks]
    try:
        out = tuple(float(w) for w in weights)
    except (TypeError, ValueError):
        raise ValueError(f"weights must be numbers, one per task, got {weights!r}") from None
    if len(out) != len(tasks) or any(w < 0 for w in out) or not sum(out) > 0:
        raise ValueError(f"weights: {len(tasks)} non-negative numbers (one per task), not all 0, got {list(out)}")
    return out


@functools.lru_cache(maxsize=32)
def _dataset(task: str, config_json: str, seed: int, size: int):
    rg = require("reasoning_gym")
    if task not in rg.factory.DATASETS or task == "composite":
        raise ValueError(f"reasoning_gym: unknown task {task!r}; valid: {', '.join(task_names())}")
    try:
        return rg.create_dataset(task, seed=seed, size=size, **json.loads(config_json))
    except (TypeError, ValueError, AssertionError) as e:
        raise ValueError(f"reasoning_gym task {task!r}: bad config {config_json} ({e})") from None


@functools.lru_cache(maxsize=8)
def _held_out_questions(specs: tuple[tuple[str, str], ...], test_size: int) -> frozenset[str]:
    """Every held-out (test and validation) question of the tasks (`specs`: (task, its config as JSON) each)."""
    return frozenset(
        _dataset(t, c, seed, test_size)[i]["question"]
        for t, c in specs
        for seed in HELD_OUT.values()
        for i in range(test_size)
    )


class ReasoningGymEnv(Env):
    """One reasoning-gym question. train: a task drawn by weight, then an item; test: `test_size` items per task."""

    name = "reasoning_gym"
    max_turns = 1
    splits = ("train", "validation", "test")

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        tasks="basic_arithmetic",
        config=None,
        weights=None,
        test_size: int = 50,
        system_prompt: str | None = None,
        answer_format: str = "tags",
    ):
        """`answer_format`: "tags" scores the last `<answer>` tag's content, reasoning-gym's own way (the default); "last"
        scores the answer however the reply states it (`envs.answers.stated_answer`: a tag, `\\boxed{}`, `#### N`,
        "the answer is N", else the last number), the prompt asking for "The answer is: N" (`LAST_PROMPT`). With
        "last" the reward is the lenient score: the run trains the skill, not a format."""
        rg = require("reasoning_gym")
        names = _names(tasks)
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format: unknown {answer_format!r}; valid: {list(ANSWER_FORMATS)}")
        size = int(test_size)
        cfg = {t: json.dumps(c, sort_keys=True) for t, c in _configs(names, config).items()}  # hashable: cache keys
        for t in names:  # unknown names and bad configs fail here, naming the valid ones
            _dataset(t, cfg[t], TEST_SEED, size)
        if split not in self.splits:
            raise ValueError(f"split must be one of {', '.join(self.splits)}, got {split!r}")
        if split in HELD_OUT:  # test_size items per task, the tasks interleaved
            k = seed % (len(names) * size)
            self.task, i = names[k % len(names)], k // len(names)
            self.dataset = _dataset(self.task, cfg[self.task], HELD_OUT[split], size)
        else:
            rng = random.Random(f"nanosky/reasoning_gym/train/{seed}")
            self.task = rng.choices(names, weights=_weights(names, weights))[0]
            self.dataset = _dataset(self.task, cfg[self.task], TRAIN_SEED, TRAIN_SIZE)
            held = _held_out_questions(tuple(cfg.items()), size)
            for _ in range(1000):  # a draw that is a test question is drawn again
                i = rng.randrange(TRAIN_SIZE)
                if self.dataset[i]["question"] not in held:
                    break
            else:
                raise ValueError(
                    f"reasoning_gym task {self.task!r}: 1000 draws all repeated a held-out question; its "
                    "config allows too few distinct questions (lower test_size)"
                )
        self.entry = self.dataset[i]
        default = rg.utils.SYSTEM_PROMPTS["default"] if answer_format == "tags" else LAST_PROMPT
        self.system_prompt = system_prompt if system_prompt is not None else default
        self.split, self.seed, self.answer_format = split, seed, answer_format

    def reset(self) -> list[Message]:
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return head + [{"role": "user", "content": self.entry["question"]}]

    def step(self, action: str) -> StepResult:
        rg = require("reasoning_gym")
        stated = stated_answer(action)
        tagged = rg.utils.extract_answer(action) if isinstance(action, str) else None
        answer = tagged if self.answer_format == "tags" else stated
        reward = self._score(answer)
        ok = reward >= 1.0
        lenient = ok or (stated is not None and self._score(stated) >= 1.0)
        info = {
            "success": ok,
            "lenient": lenient,
            "pred": answer,
            "answer": self.entry["answer"],
            "task": self.task,
            "env_metrics": {
                f"{self.task}/reward": reward,
                f"{self.task}/success": float(ok),
                f"{self.task}/lenient": float(lenient),
            },
        }
        return StepResult([], reward, True, info)

    def _score(self, answer: str | None) -> float:
        """The task's own scorer on `answer`; a scorer that trips on a malformed answer scores it 0."""
        try:
            return float(self.dataset.score_answer(answer, self.entry))
        except Exception:  # noqa: BLE001
            return 0.0
