"""reply: write what a user asks for, under the constraints they state. There is no checker: whether a reply is
good (on topic, in the asked tone, useful, within the constraints) is for a rubric to judge, so this env's reward
is always 0 and its success unknown (None). It is the judge's example (docs/judge.md): train it with a judge
alone, and evaluate its test split with the same judge.

    torchrun --nproc_per_node 2 run.py --env reply --reward.judge group --reward.judge-url URL --reward.judge-only
    python -m evals.judged --ckpt runs/reply-grpo --env reply --reward.judge group --reward.judge-url URL

Each task is a request (a message to a customer, a colleague, a neighbour; a short note, notice or blurb) about a
subject, with two or three constraints drawn from a list (a word limit, a word to use, a word to avoid, a tone, a
closing question, a sign-off). The test split is TEST_SIZE tasks from its own RNG stream, none of them a train task.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from envs.base import Env, Message, StepResult

SYSTEM_PROMPT = "Write what the user asks for. Follow every constraint they state. Reply with the text only."
TEST_SIZE = 100

_KINDS = (
    ("a reply to a customer whose {x}", "customer"),
    ("a short note to a colleague about {x}", "colleague"),
    ("a message to a neighbour about {x}", "neighbour"),
    ("a notice for the office about {x}", "office"),
    ("a two-line product blurb for {x}", "blurb"),
)
_SUBJECTS = {
    "customer": ("order arrived late", "parcel came damaged", "refund is still pending", "invoice shows a wrong amount",
                 "subscription renewed by mistake", "item is out of stock"),
    "colleague": ("tomorrow's meeting moving to 3 pm", "the report draft being ready", "a missing budget figure",
                  "covering their shift on Friday", "the new printer", "a deadline that slipped"),
    "neighbour": ("a parcel you took in for them", "noise from a party on Saturday", "their cat in your garden",
                  "a shared fence that needs fixing", "borrowing a ladder", "a tree dropping leaves on the path"),
    "office": ("the kitchen being cleaned on Monday", "a fire drill at 11 am", "the lift being out of order",
               "a new recycling rule", "the heating being off on Friday", "parking spaces being repainted"),
    "blurb": ("a steel water bottle", "a folding bicycle", "a wool scarf", "a desk lamp with a dimmer",
              "a notebook with dotted pages", "a pair of running socks"),
}  # fmt: skip
_WORDS = ("thanks", "today", "please", "soon", "glad", "simple", "together", "quick", "kind", "clear")
_TONES = ("warm", "formal", "brief and direct", "cheerful", "calm")


@dataclass(frozen=True)
class Request:
    """One task: the user's request and the constraints it states (kept for the judge's eyes and the records)."""

    text: str
    constraints: tuple[str, ...]


def make_request(rng: random.Random) -> Request:
    form, who = rng.choice(_KINDS)
    subject = rng.choice(_SUBJECTS[who])
    pool = [
        f"at most {rng.choice((20, 30, 40, 50))} words",
        f"use the word '{rng.choice(_WORDS)}'",
        f"do not use the word '{rng.choice(('sorry', 'very', 'just', 'really', 'basically'))}'",
        f"keep the tone {rng.choice(_TONES)}",
        "end with a question",
        f"sign it as {rng.choice(('Sam', 'Alex', 'Priya', 'Jon', 'Mei'))}",
    ]
    constraints = tuple(rng.sample(pool, rng.choice((2, 3))))
    text = f"Write {form.format(x=subject)}. Constraints: " + "; ".join(constraints) + "."
    return Request(text, constraints)


@functools.cache
def test_requests() -> tuple[Request, ...]:
    rng = random.Random(1_000_003)  # its own stream: the test split never moves when train changes
    return tuple(make_request(rng) for _ in range(TEST_SIZE))


@functools.cache
def _test_texts() -> frozenset[str]:
    return frozenset(r.text for r in test_requests())


def train_request(seed: int) -> Request:
    """The train task of `seed`; a draw that is a test task is drawn again (the splits share no task)."""
    rng = random.Random(seed)
    while (r := make_request(rng)).text in _test_texts():
        pass
    return r


class ReplyEnv(Env):
    """One single-turn request. No checker (`checker = False`): reward 0, success None; a judge scores it."""

    name = "reply"
    max_turns = 1
    checker = False

    def __init__(self, split: str = "train", seed: int = 0, system_prompt: str = SYSTEM_PROMPT):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        self.request = train_request(seed) if split == "train" else test_requests()[seed % TEST_SIZE]
        self.split, self.seed, self.system_prompt = split, seed, system_prompt

    def reset(self) -> list[Message]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.request.text},
        ]

    def step(self, action: str) -> StepResult:
        info = {"success": None, "constraints": list(self.request.constraints)}
        return StepResult([], 0.0, True, info)
