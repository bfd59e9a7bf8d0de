"""text_math: procedural arithmetic, word and logic problems (plus GSM8K-style JSONL) with exact-match reward.

Problems are short enough for a tiny model: every `Problem` carries a scratchpad (`steps`) whose lines are each
one easy operation ("385 + 40 = 425") and whose last line ends in the answer, so a warm start can imitate it.
The policy answers inside `<answer>...</answer>`; reward is 1.0 for a match after normalisation, 0.1 for a
well-formed but wrong answer, 0.0 otherwise.

    from envs.text_math import TextMathEnv
    env = TextMathEnv(split="test", seed=3); msgs = env.reset(); env.step("... <answer>42</answer>")

The test split (`test_problems()`) comes from its own RNG stream; `train_problem(seed)` resamples whenever it
draws a test question, so the splits never share a question.
"""

from __future__ import annotations

import functools
import json
import random
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from envs.answers import (  # noqa: F401 - the scorer's names, as text_math has always exported them
    FORMATS,
    HASH_PROMPT,
    LAST_PROMPT,
    SYSTEM_PROMPT,
    extract_answer,
    extract_hashes,
    extract_last,
    lenient_match,
    normalize_answer,
    score,
)
from envs.base import Env, Message, StepResult


@dataclass(frozen=True)
class Problem:
    question: str  # user-facing text, e.g. "What is 385 + 47?"
    answer: str  # canonical answer, e.g. "432", "yes", "Ann"
    kind: str  # "arith" | "word" | "logic" | "gsm8k"
    level: int  # difficulty: 1..5 for arith, 1..3 otherwise
    steps: tuple[str, ...]  # scratchpad, one easy operation per line; the last line ends in the answer
    options: tuple[str, ...] = ()  # a closed set of answers (logic: the two numbers, even/odd, yes/no, the names)


TEST_SIZE = 200
KINDS = ("arith", "word", "logic")
LEVELS = {"arith": 5, "word": 3, "logic": 3}

# ---------------------------------------------------------------------------------------------- arithmetic


def _add_steps(a: int, b: int) -> list[str]:
    """a + b, adding b one place value at a time (hundreds, tens, units); zero parts are skipped."""
    steps, cur = [], a
    for part in _place_parts(b):
        steps.append(f"{cur} + {part} = {cur + part}")
        cur += part
    return steps or [f"{a} + 0 = {a}"]


def _sub_steps(a: int, b: int) -> list[str]:
    """a - b for a >= b, subtracting b one place value at a time."""
    steps, cur = [], a
    for part in _place_parts(b):
        steps.append(f"{cur} - {part} = {cur - part}")
        cur -= part
    return steps or [f"{a} - 0 = {a}"]


def _place_parts(n: int) -> list[int]:
    """385 -> [300, 80, 5]; zeros dropped (307 -> [300, 7])."""
    digits = str(n)
    return [int(d) * 10 ** (len(digits) - i - 1) for i, d in enumerate(digits) if d != "0"]


def _minus(a: int, b: int, split: bool) -> list[str]:
    """a - b; a negative result is computed as b - a first, because that is the direction a child knows."""
    if a >= b:
        return _sub_steps(a, b) if split else [f"{a} - {b} = {a - b}"]
    return (_sub_steps(b, a) if split else [f"{b} - {a} = {b - a}"]) + [f"{a} - {b} = {a - b}"]


def _gen_arith(rng: random.Random, level: int) -> Problem:
    if level in (1, 2):
        lo, hi = (0, 20) if level == 1 else (10, 99)
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice("+-")
        if op == "-" and a < b and rng.random() > 0.2:  # negative results only sparingly
            a, b = b, a
        split = level == 2  # 0-20 facts are one step; 2-digit numbers go tens then units
        if op == "+":
            steps = _add_steps(a, b) if split else [f"{a} + {b} = {a + b}"]
        else:
            steps = _minus(a, b, split)
        expr, value = f"{a} {op} {b}", a + b if op == "+" else a - b
    elif level == 3:
        a, b, op = rng.randint(100, 999), rng.randint(10, 999), rng.choice("+-")
        if op == "-" and a < b:
            a, b = b, a
        steps = _add_steps(a, b) if op == "+" else _sub_steps(a, b)
        expr, value = f"{a} {op} {b}", a + b if op == "+" else a - b
    elif level == 4:
        a, b = rng.randint(11, 99), rng.randint(2, 9)
        tens, units = a - a % 10, a % 10
        steps = [f"{tens} * {b} = {tens * b}"]
        if units:
            steps += [f"{units} * {b} = {units * b}", f"{tens * b} + {units * b} = {a * b}"]
        expr, value = f"{a} * {b}", a * b
    elif level == 5:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        c = rng.randint(10, min(99, a + b))  # a + b - c >= 0: negatives are a level 1-2 thing
        steps = _add_steps(a, b) + _sub_steps(a + b, c)
        expr, value = f"{a} + {b} - {c}", a + b - c
    else:
        raise ValueError(f"arith level must be 1..5, got {level}")
    return Problem(f"What is {expr}?", str(value), "arith", level, tuple(steps))


# ---------------------------------------------------------------------------------------------- word problems

_NAMES = tuple("Ann Ben Cal Dan Eva Fay Gus Ivy Jon Kim Leo Mia Ned Ola Pam Raj Sam Tom Uma Zoe".split())
_ITEMS = tuple(
    "apples pens stickers marbles cards books coins eggs shells stamps cookies balls rocks beads toys plums".split()
)
_MAX_VALUE = 99  # every intermediate count stays below 100 so each step is easy


def _change(rng: random.Random, name: str, friend: str, cur: int) -> tuple[str, int] | None:
    """One add/subtract sentence applied to `cur`: (sentence, new value), or None if it would go below 1."""
    b = rng.randint(2, 20)
    if rng.random() < 0.5:
        text = rng.choice((f"{name} buys {b} more.", f"{name} finds {b} more.", f"{friend} gives {name} {b} more."))
        return text, cur + b
    if b >= cur:
        return None
    return rng.choice((f"{name} gives {b} to {friend}.", f"{name} loses {b}.", f"{name} sells {b}.")), cur - b


def _word_once(rng: random.Random, level: int, variant: int) -> Problem | None:
    """One attempt at a word problem; None when the drawn numbers break a constraint (caller redraws)."""
    name, friend = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    sentences: list[str] = []
    steps: list[str] = []

    def change(cur: int) -> int | None:
        out = _change(rng, name, friend, cur)
        if out is None:
            return None
        sentences.append(out[0])
        steps.append(f"{cur} {'+' if out[1] > cur else '-'} {abs(out[1] - cur)} = {out[1]}")
        return out[1]

    # level 1: start, change, change. level 2: one of (boxes, change) (start, packs) (start, change, share).
    # level 3: one of (boxes, change, share) (start, packs, change) (start, change, change, share).
    cur: int | None
    if (level, variant) in ((2, 0), (3, 0)):
        k, m = rng.randint(2, 9), rng.randint(2, 9)
        sentences.append(f"{name} has {k} boxes of {m} {item}.")
        steps.append(f"{k} * {m} = {k * m}")
        cur = k * m
    else:
        cur = rng.randint(5, 40)
        sentences.append(f"{name} has {cur} {item}.")
    if (level, variant) in ((2, 1), (3, 1)):
        k, m = rng.randint(2, 9), rng.randint(2, 9)
        sentences.append(f"{name} buys {k} packs of {m} more.")
        steps += [f"{k} * {m} = {k * m}", f"{cur} + {k * m} = {cur + k * m}"]
        cur += k * m
    n_changes = {(1, 0): 2, (2, 0): 1, (2, 1): 0, (2, 2): 1, (3, 0): 1, (3, 1): 1, (3, 2): 2}[level, variant]
    for _ in range(n_changes):
        cur = change(cur) if cur is not None else None
    if cur is None or cur > _MAX_VALUE or any(int(s.split()[-1]) > _MAX_VALUE for s in steps):
        return None
    share = (level, variant) in ((2, 2), (3, 0), (3, 2))
    if share:
        k = rng.randint(2, 5)
        if cur % k:
            return None
        sentences.append(f"{name} shares them equally among {k} friends.")
        steps.append(f"{cur} / {k} = {cur // k}")
        cur //= k
        sentences.append(f"How many {item} does each friend get?")
    else:
        sentences.append(f"How many {item} does {name} have now?")
    return Problem(" ".join(sentences), str(cur), "word", level, tuple(steps))


def _gen_word(rng: random.Random, level: int) -> Problem:
    if level not in (1, 2, 3):
        raise ValueError(f"word level must be 1..3, got {level}")
    variant = 0 if level == 1 else rng.randrange(3)  # drawn once so redraws do not favour easy variants
    while (p := _word_once(rng, level, variant)) is None:
        pass
    return p


# ---------------------------------------------------------------------------------------------- logic

# Nonsense nouns (singular; plural adds "s"), all starting with a consonant so the article is always "a".
_BLIPS = (
    "blip",
    "zork",
    "grib",
    "plonk",
    "wug",
    "fep",
    "tov",
    "quim",
    "snarg",
    "blik",
    "morp",
    "teem",
    "voop",
    "jun",
    "krell",
    "norp",
)


def _gen_logic(rng: random.Random, level: int) -> Problem:
    if level == 1:
        if rng.random() < 0.5:  # larger / smaller of two numbers
            a, b = rng.sample(range(1, 100), 2)
            big, small = max(a, b), min(a, b)
            ab = (str(a), str(b))
            if rng.random() < 0.5:
                return Problem(
                    f"Which is larger, {a} or {b}?", str(big), "logic", 1, (f"{big} > {small}, so {big}",), ab
                )
            return Problem(
                f"Which is smaller, {a} or {b}?", str(small), "logic", 1, (f"{small} < {big}, so {small}",), ab
            )
        n = rng.randint(10, 999)  # even / odd, via the last digit
        parity = "even" if n % 2 == 0 else "odd"
        steps = (f"the last digit of {n} is {n % 10}", f"{n % 10} is {parity}")
        return Problem(f"Is {n} even or odd?", parity, "logic", 1, steps, ("even", "odd"))
    if level == 2:
        if rng.random() < 0.5:  # "is X greater/less than Y?"
            a, b = rng.sample(range(1, 1000), 2)
            rel = rng.choice(("greater", "less"))
            yes = a > b if rel == "greater" else a < b
            fact = f"{a} > {b}" if a > b else f"{a} < {b}"
            ans = "yes" if yes else "no"
            return Problem(f"Is {a} {rel} than {b}?", ans, "logic", 2, (f"{fact}, so {ans}",), ("yes", "no"))
        x, (p, q) = rng.choice(_NAMES), rng.sample(_BLIPS, 2)  # syllogism: yes and no equally often
        if rng.random() < 0.5:
            rule, member, asked, ans = f"All {p}s are {q}s.", p, q, "yes"
        else:  # either the member is excluded from q, or a q cannot be a p
            rule, ans = f"No {p}s are {q}s.", "no"
            member, asked = rng.choice(((p, q), (q, p)))
        fact = f"{x} is a {member}"
        steps = (fact, f"{rule[:-1].lower()}, so {ans}")  # restate the used premise, then conclude
        return Problem(f"{rule} {fact}. Is {x} a {asked}?", ans, "logic", 2, steps, ("yes", "no"))
    if level == 3:
        if rng.random() < 0.5:  # tallest / shortest of three people from two comparisons
            top, mid, low = rng.sample(_NAMES, 3)
            facts = [
                rng.choice((f"{top} is taller than {mid}.", f"{mid} is shorter than {top}.")),
                rng.choice((f"{mid} is taller than {low}.", f"{low} is shorter than {mid}.")),
            ]
            rng.shuffle(facts)
            which, ans = rng.choice((("tallest", top), ("shortest", low)))
            steps = (f"{top} > {mid} > {low}", f"so the {which} is {ans}")
            return Problem(f"{facts[0]} {facts[1]} Who is the {which}?", ans, "logic", 3, steps, (top, mid, low))
        nums = rng.sample(range(1, 100), 3)  # largest / smallest of three numbers
        hi, md, lo = sorted(nums, reverse=True)
        three, of = tuple(map(str, nums)), f"{nums[0]}, {nums[1]} and {nums[2]}"
        if rng.random() < 0.5:
            steps = (f"{hi} > {md}", f"{hi} > {lo}, so {hi}")
            return Problem(f"Which is the largest of {of}?", str(hi), "logic", 3, steps, three)
        steps = (f"{lo} < {md}", f"{lo} < {hi}, so {lo}")
        return Problem(f"Which is the smallest of {of}?", str(lo), "logic", 3, steps, three)
    raise ValueError(f"logic level must be 1..3, got {level}")


_GENERATORS = {"arith": _gen_arith, "word": _gen_word, "logic": _gen_logic}


def generate(rng: random.Random, kind: str, level: int) -> Problem:
    """One problem of a given kind and level, drawn from `rng`."""
    if kind not in _GENERATORS:
        raise ValueError(f"kind must be one of {sorted(_GENERATORS)}, got {kind!r}")
    return _GENERATORS[kind](rng, level)


def sample_problem(rng: random.Random, kinds: tuple[str, ...] = KINDS) -> Problem:
    """Uniform over `kinds`, then uniform over that kind's levels."""
    kind = rng.choice(kinds)
    return generate(rng, kind, rng.randint(1, LEVELS[kind]))


# ---------------------------------------------------------------------------------------------- splits


@functools.lru_cache(maxsize=2)
def _held_out(split: str) -> tuple[tuple[Problem, ...], frozenset[str]]:
    """A held-out split (test, or validation: never a test question) and its questions. Stratified: kinds
    round-robin, levels round-robin within a kind; its own RNG stream, no repeated questions."""
    rng = random.Random(f"nanosky/text_math/{split}")
    problems: list[Problem] = []
    seen: set[str] = set()
    taken = _held_out("test")[1] if split == "validation" else frozenset()
    for i in range(TEST_SIZE):
        kind = KINDS[i % len(KINDS)]
        level = 1 + (i // len(KINDS)) % LEVELS[kind]
        p = generate(rng, kind, level)
        while p.question in seen or p.question in taken:
            p = generate(rng, kind, level)
        seen.add(p.question)
        problems.append(p)
    return tuple(problems), frozenset(seen)


def test_problems() -> list[Problem]:
    """The fixed held-out split: TEST_SIZE problems, balanced over kinds and levels."""
    return list(_held_out("test")[0])


test_problems.__test__ = False  # not a pytest test, despite the name


def validation_problems() -> list[Problem]:
    """The validation split: TEST_SIZE problems as the test split is made, none of them a test or train question."""
    return list(_held_out("validation")[0])


def train_problem(seed: int, kinds: tuple[str, ...] = KINDS) -> Problem:
    """Deterministic per seed; redraws (same kind and level) until the question is in neither held-out split."""
    rng = random.Random(f"nanosky/text_math/train/{seed}")
    kind = rng.choice(kinds)
    level = rng.randint(1, LEVELS[kind])
    held = _held_out("test")[1] | _held_out("validation")[1]
    p = generate(rng, kind, level)
    while p.question in held:
        p = generate(rng, kind, level)
    return p


# ---------------------------------------------------------------------------------------------- GSM8K


def load_gsm8k_jsonl(path: str | Path) -> list[Problem]:
    """Rows {"question", "answer": "reasoning...\\n#### 42"}; malformed rows are skipped with one warning."""
    problems, bad = [], 0
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question, full = row["question"].strip(), row["answer"]
            reasoning, final = full.rsplit("####", 1)
            final = final.strip().replace(",", "")
            if not question or not final:
                raise ValueError("empty question or answer")
        except (ValueError, KeyError, TypeError, AttributeError):
            bad += 1
            continue
        # Drop GSM8K's calculator annotations "<<3*4=12>>": the text already states the result.
        steps = tuple(ln.strip() for ln in re.sub(r"<<[^>]*>>", "", reasoning).splitlines() if ln.strip())
        problems.append(Problem(question, final, "gsm8k", min(max(len(steps), 1), 3), steps))
    if bad:
        warnings.warn(f"load_gsm8k_jsonl: skipped {bad} malformed row(s) in {path}", stacklevel=2)
    return problems


# ---------------------------------------------------------------------------------------------- env


class TextMathEnv(Env):
    """One single-turn problem. train: `train_problem(seed)`; test: `test_problems()[seed % TEST_SIZE]`.
    With `data_path` (GSM8K-style JSONL) both splits index its rows by `seed % len(rows)`."""

    name = "text_math"
    max_turns = 1
    splits = ("train", "validation", "test")

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        data_path: str | Path | None = None,
        kinds: tuple[str, ...] | None = None,
        system_prompt: str | None = None,
        answer_format: str = "tags",
    ):
        """`answer_format`: "tags" (`<answer>...</answer>`), "hashes" (a last line `#### N`) or "last" ("The answer
        is: N", else the last number); the default system prompt asks for it."""
        if split not in self.splits:
            raise ValueError(f"split must be one of {', '.join(self.splits)}, got {split!r}")
        kinds = tuple(kinds) if kinds else KINDS
        if bad := [k for k in kinds if k not in _GENERATORS]:
            raise ValueError(f"kinds: unknown {bad}; valid: {list(_GENERATORS)}")
        if answer_format not in FORMATS:
            raise ValueError(f"answer_format: unknown {answer_format!r}; valid: {list(FORMATS)}")
        prompt, self.extract = FORMATS[answer_format]
        self.answer_format = answer_format
        if data_path is not None:
            rows = _load_cached(str(data_path))
            if not rows:
                raise ValueError(f"data_path {data_path} has no valid rows")
            self.problem = rows[seed % len(rows)]
        elif split == "train":
            self.problem = train_problem(seed, kinds)
        else:
            pool = [p for p in _held_out(split)[0] if p.kind in kinds]
            self.problem = pool[seed % len(pool)]
        self.split, self.seed, self.system_prompt = split, seed, system_prompt or prompt

    def reset(self) -> list[Message]:
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.problem.question},
        ]

    def expert_action(self) -> str:
        """The scripted expert's reply to a training problem (SFT's demonstration): its scratchpad, one easy operation
        a line, then the answer in this env's format. A held-out problem has none: the test split is never taught."""
        if self.split != "train":
            raise ValueError("text_math: no expert on the test split (its problems are held out)")
        answer = {"tags": "<answer>{}</answer>", "hashes": "#### {}", "last": "The answer is: {}"}[self.answer_format]
        return "\n".join([*self.problem.steps, answer.format(self.problem.answer)])

    def step(self, action: str) -> StepResult:
        p = self.problem
        reward, info = score(action, p.answer, self.extract)
        info |= {"answer": p.answer, "lenient": lenient_match(action, p.answer, p.options)}
        return StepResult(
            observations=[], reward=reward, done=True, info=info | ({"options": p.options} if p.options else {})
        )


@functools.lru_cache(maxsize=8)
def _load_cached(path: str) -> tuple[Problem, ...]:
    return tuple(load_gsm8k_jsonl(path))
