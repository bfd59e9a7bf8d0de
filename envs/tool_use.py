"""tool_use: short questions that need a tool (calculator, wiki, search, python_exec) to answer reliably.

Kinds: "arith" (big-number arithmetic -> calculator), "wiki" (a fact about a mini-wiki entity -> wiki),
"search" (a reverse lookup, e.g. which city has mayor X -> search), "python" (what a small program prints ->
python_exec) and, off by default, "multihop" (two wiki lookups). The policy calls tools with
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` and finishes with `<answer>...</answer>`: 1.0 if
correct, 0.1 if well-formed but wrong after at least one tool call that ran (`format_needs_tool`), 0 otherwise;
`call_reward=c` adds c once for a call that returns what the gold call returns.

    env = ToolUseEnv(split="test", seed=3)
    msgs = env.reset()                       # [system, user]
    env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "48213 * 9127"}}</tool_call>')
    env.expert_conversation()                # a full solved demonstration, tools actually run

The test split is a fixed list of TEST_SIZE tasks from its own RNG stream. It is disjoint from train in
questions, and wiki/search questions are about held-out entities (`wiki_data.is_test_entity`), so facts seen in
training never answer a test question.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field
from typing import Any

from envs.answers import stated_answer
from envs.base import Env, Message, NoExpert, StepResult
from envs.text_math import extract_answer, normalize_answer
from envs.tools import ToolResult, format_tool_call, get_tool, parse_tool_calls, run_tool_call
from envs.tools.calculator import evaluate, format_number
from envs.tools.search import search_wiki
from envs.tools.wiki_data import Page, is_test_entity, pages

SYSTEM_PROMPT = (
    'Use the tools. Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
    "Give the final answer as <answer>...</answer>."
)
NUDGE = "Call a tool with <tool_call>...</tool_call> or give the final answer as <answer>...</answer>."
TOOL_NAMES = ("calculator", "search", "wiki", "python_exec")
KINDS = ("arith", "wiki", "search", "python")
ALL_KINDS = KINDS + ("multihop",)
TEST_SIZE = 200
VALIDATION_SIZE = 200


@dataclass(frozen=True)
class Question:
    """One generated tool_use question: the text, its answer, and the expert's tool calls (not `nanosky.agent.Task`,
    the agent loop's episode life cycle)."""

    question: str
    answer: str
    kind: str
    calls: tuple[tuple[str, dict], ...]  # the expert's tool calls in order: (tool name, arguments)
    entities: frozenset[str] = field(default_factory=frozenset)  # wiki titles the task involves


# ---------------------------------------------------------------------------------------------- generators


def _gen_arith(rng: random.Random, split: str) -> Question:
    n = lambda lo, hi: rng.randint(10**lo, 10**hi - 1)  # noqa: E731 - a number with lo+1..hi digits
    expr = rng.choice(
        (
            lambda: f"{n(3, 5)} * {n(2, 4)}",
            lambda: f"{n(5, 7)} + {n(5, 7)} - {n(3, 6)}",
            lambda: f"{rng.randint(3, 19)} ** {rng.randint(7, 16)}",
            lambda: f"{n(6, 8)} // {n(1, 3)}",
            lambda: f"{n(6, 8)} % {n(1, 3)}",
            lambda: f"({n(3, 5)} + {n(3, 5)}) * {n(2, 3)}",
        )
    )()
    question = rng.choice(("What is {}?", "Compute {}.", "Calculate {}."))
    return Question(
        question.format(expr), format_number(evaluate(expr)), "arith", (("calculator", {"expression": expr}),)
    )


_WIKI_QUESTIONS = {
    "country": {
        "Capital": "What is the capital of {}?",
        "Population": "What is the population of {}?",
        "Founded": "In what year was {} founded?",
        "Language": "What language is spoken in {}?",
    },
    "city": {
        "Country": "In which country is {}?",
        "Population": "What is the population of {}?",
        "Founded": "In what year was {} founded?",
        "Mayor": "Who is the mayor of {}?",
    },
    "person": {
        "Born": "In what year was {} born?",
        "Birthplace": "Where was {} born?",
        "Job": "What is the job of {}?",
        "Mayor of": "Which city is {} the mayor of?",
        "Invented": "What did {} invent?",
    },
    "invention": {
        "Inventor": "Who invented the {}?",
        "Year": "In what year was the {} invented?",
        "Use": "What is the {} used for?",
    },
}


def _entities(*values: str) -> frozenset[str]:
    """The wiki titles among `values` (fact values such as years are not entities)."""
    table = pages()
    return frozenset(table[v.lower()].title for v in values if v.lower() in table)


def _gen_wiki(rng: random.Random, split: str) -> Question | None:
    page = _pick_page(rng, split)
    fact = rng.choice([f for f in _WIKI_QUESTIONS[page.kind] if f in page.facts])
    answer = page.facts[fact]
    q = _WIKI_QUESTIONS[page.kind][fact].format(page.title)
    return Question(q, answer, "wiki", (("wiki", {"title": page.title}),), _entities(page.title, answer))


def _gen_search(rng: random.Random, split: str) -> Question | None:
    """A reverse lookup whose answer is the top search hit for the question itself."""
    page = _pick_page(rng, split, kinds=("country", "city", "invention"))
    if page.kind == "country":
        q, clue = f"Which country has the capital {page.facts['Capital']}?", page.facts["Capital"]
    elif page.kind == "city":
        q, clue = f"Which city has the mayor {page.facts['Mayor']}?", page.facts["Mayor"]
    else:
        q, clue = f"Which invention is used for {page.facts['Use']}?", ""
    if search_wiki(q, k=1) != [page.title]:
        return None  # BM25 ranks another page first: the expert demonstration would not be clean
    return Question(q, page.title, "search", (("search", {"query": q}),), _entities(page.title, clue))


def _gen_multihop(rng: random.Random, split: str) -> Question | None:
    table = pages()
    page = _pick_page(rng, split, kinds=("country", "invention"))
    if page.kind == "country":
        hop = table[page.facts["Capital"].lower()]
        q, answer = f"What is the population of the capital of {page.title}?", hop.facts["Population"]
    else:
        hop = table[page.facts["Inventor"].lower()]
        q, answer = f"In what year was the inventor of the {page.title} born?", hop.facts["Born"]
    calls = (("wiki", {"title": page.title}), ("wiki", {"title": hop.title}))
    return Question(q, answer, "multihop", calls, _entities(page.title, hop.title))


_WORDS = ("planet", "tomato", "silver", "garden", "rocket", "window", "pencil", "dragon", "castle", "summer")


def _gen_python(rng: random.Random, split: str) -> Question:
    """(program, what it prints): the answer is computed here in Python, never by running the string."""
    r = rng.randint
    variant = r(0, 6)
    if variant == 0:
        k = r(10, 60)
        code, out = f"print(sum(i * i for i in range({k})))", sum(i * i for i in range(k))
    elif variant == 1:
        a, b = r(3, 29), r(20, 90)
        code, out = f"print(len(str({a} ** {b})))", len(str(a**b))
    elif variant == 2:
        a, b = r(2, 9), r(20, 60)
        code, out = f"print(sum(int(d) for d in str({a} ** {b})))", sum(int(d) for d in str(a**b))
    elif variant == 3:
        x0, n, k, m = r(1, 50), r(3, 9), r(2, 9), r(50, 999)
        code, x = f"x = {x0}\nfor i in range({n}):\n    x = (x * {k} + i) % {m}\nprint(x)", x0
        for i in range(n):
            x = (x * k + i) % m
        out = x
    elif variant == 4:
        xs, i = [r(1, 999) for _ in range(5)], r(0, 4)
        code, out = f"print(sorted({xs})[{i}])", sorted(xs)[i]
    elif variant == 5:
        w = rng.choice(_WORDS) + rng.choice(_WORDS)
        code, out = f"print('{w}'[::-1])", w[::-1]
    else:
        m, a = r(7, 97), r(100, 900)
        b = a + r(5, 60)
        code, out = f"print(max(x % {m} for x in range({a}, {b})))", max(x % m for x in range(a, b))
    return Question(f"What does this Python code print? {code}", str(out), "python", (("python_exec", {"code": code}),))


def _pick_page(rng: random.Random, split: str, kinds: tuple[str, ...] = tuple(_WIKI_QUESTIONS)) -> Page:
    """A subject page. Train subjects are never held out; test subjects may be anything, because `generate`
    keeps only test tasks that involve at least one held-out entity (as subject or as answer)."""
    pool = _entity_pool(split, kinds)
    return pool[rng.randrange(len(pool))]


@functools.lru_cache(maxsize=32)
def _entity_pool(split: str, kinds: tuple[str, ...]) -> list[Page]:
    return [p for p in pages().values() if p.kind in kinds and (split == "test" or not is_test_entity(p.title))]


_GENERATORS = {
    "arith": _gen_arith,
    "wiki": _gen_wiki,
    "search": _gen_search,
    "python": _gen_python,
    "multihop": _gen_multihop,
}


def generate(rng: random.Random, kind: str, split: str) -> Question:
    """One task of `kind` on the right side of the entity split: a test task involves at least one held-out
    entity, a train task none. Tasks without entities (arith, python) are split by question text only."""
    while True:
        task = _GENERATORS[kind](rng, split)
        if task is None:
            continue
        held_out = any(is_test_entity(e) for e in task.entities)
        if held_out == (split == "test") or not task.entities:
            return task


HELD_OUT = {"test": (TEST_SIZE, "test"), "validation": (VALIDATION_SIZE, "train")}
"""Each held-out split: its size and the side of the entity split its wiki questions come from. The test split asks
about held-out entities; the validation split (for choosing the lr, the steps and the checkpoint) asks about train
entities, in questions no train task repeats."""


@functools.lru_cache(maxsize=2)
def _held_out(split: str) -> tuple[Question, ...]:
    """A held-out split's distinct tasks, kinds round-robin, from the split's own RNG stream. The wiki kinds have only
    a few dozen distinct held-out questions each; a kind that keeps repeating itself hands its slot to the next kind.
    The validation split repeats no test question."""
    size, side = HELD_OUT[split]
    rng = random.Random(f"nanosky/tool_use/{split}")
    tasks: list[Question] = []
    seen: set[str] = set() if split == "test" else {t.question for t in _held_out("test")}
    exhausted: set[str] = set()
    i = 0
    while len(tasks) < size and len(exhausted) < len(ALL_KINDS):
        kind = ALL_KINDS[i % len(ALL_KINDS)]
        i += 1
        if kind in exhausted:
            continue
        for _ in range(200):
            task = generate(rng, kind, side)
            if task.question not in seen:
                seen.add(task.question)
                tasks.append(task)
                break
        else:
            exhausted.add(kind)
    return tuple(tasks)


@functools.lru_cache(maxsize=1)
def _held_out_questions() -> frozenset[str]:
    return frozenset(t.question for split in HELD_OUT for t in _held_out(split))


def test_tasks(kinds: tuple[str, ...] = ALL_KINDS, split: str = "test") -> list[Question]:
    """A fixed held-out split (`split`: "test", TEST_SIZE tasks, or "validation", VALIDATION_SIZE), balanced over
    ALL_KINDS, filtered to `kinds`."""
    return [t for t in _held_out(split) if t.kind in kinds]


test_tasks.__test__ = False  # not a pytest test, despite the name


def train_task(seed: int, kinds: tuple[str, ...] = KINDS) -> Question:
    """Deterministic per seed; never a held-out (test or validation) question."""
    rng = random.Random(f"nanosky/tool_use/train/{seed}")
    kind = rng.choice(kinds)
    held_out = _held_out_questions()
    while (task := generate(rng, kind, "train")).question in held_out:
        pass
    return task


# ---------------------------------------------------------------------------------------------- scoring


def _norm(s: str) -> str:
    return normalize_answer(re.sub(r"^(the|a|an)\s+", "", str(s).strip(), flags=re.IGNORECASE))


def score_answer(response: str, answer: str) -> tuple[float, dict[str, Any]]:
    """(reward, info): 1.0 correct, 0.1 non-empty but wrong <answer>, 0.0 otherwise. Never raises."""
    try:
        pred = extract_answer(response)
        format_ok = bool(pred)
        success = format_ok and _norm(pred) == _norm(answer)
    except Exception:  # noqa: BLE001 - reward functions never raise
        pred, format_ok, success = None, False, False
    return (1.0 if success else 0.1 if format_ok else 0.0), {
        "success": success,
        "format_ok": format_ok,
        "pred": pred,
    }


# ---------------------------------------------------------------------------------------------- env


class ToolUseEnv(Env):
    """train: `train_task(seed)`; test / validation: `test_tasks(kinds, split)[seed % len]`. Up to `max_turns`
    assistant turns. The expert (`--algo sft`) makes the task's gold calls, a turn each, then answers."""

    name = "tool_use"
    splits = ("train", "validation", "test")

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        max_turns: int = 4,
        kinds: tuple[str, ...] | None = None,
        tool_timeout_s: float = 10.0,
        max_calls_per_turn: int = 4,
        system_prompt: str = SYSTEM_PROMPT,
        format_needs_tool: bool = True,
        format_reward: float = 0.1,
        call_reward: float = 0.0,
    ):
        """`format_needs_tool`: the 0.1 format term is paid only after a tool call that ran; a well-formed answer
        given without any working call earns 0. Without it, GRPO on a model that is rarely right learns that
        skipping the tools is the safe 0.1 (measured: tool calls per trajectory 1.0 -> 0.07 in 30 steps).
        `format_reward`: the value of that format term (0 = reward correctness only).
        `call_reward`: paid once per episode, on the turn of the first call whose output equals the output of one
        of the task's gold calls (the expert's calls, run once on first use): a step reward for getting the
        intermediate result right (ToolRL-style tool-call reward), judged by what the call returns, so a
        rewritten but equivalent expression or program counts too. Success is unchanged."""
        if split not in self.splits:
            raise ValueError(f"split must be one of {', '.join(self.splits)}, got {split!r}")
        kinds = tuple(kinds) if kinds else KINDS
        if bad := [k for k in kinds if k not in _GENERATORS]:
            raise ValueError(f"kinds: unknown {bad}; valid: {list(_GENERATORS)}")
        if split == "train":
            self.task = train_task(seed, kinds)
        else:
            pool = test_tasks(kinds, split)
            self.task = pool[seed % len(pool)]
        self.split, self.seed, self.max_turns = split, seed, max_turns
        self.tool_timeout_s = tool_timeout_s
        self.max_calls_per_turn = max_calls_per_turn
        self.system_prompt = system_prompt
        self.format_needs_tool, self.format_reward = format_needs_tool, float(format_reward)
        self.call_reward = float(call_reward)
        if self.call_reward < 0:
            raise ValueError(f"call_reward must be >= 0, got {call_reward}")
        self._gold: set[str] | None = None  # the gold calls' outputs, computed on first use
        self.tools = [get_tool(n) for n in TOOL_NAMES]
        self._reset_state()

    def _reset_state(self) -> None:
        self.turn, self.done, self.n_calls, self.n_invalid = 0, False, 0, 0
        self.call_paid = False

    def _run_gold_calls(self) -> list[tuple[str, list[ToolResult]]]:
        """Each of the task's gold (expert) calls as the model would write it, with its results (the tools run)."""
        table = {t.name: t for t in self.tools}
        texts = [format_tool_call(name, args) for name, args in self.task.calls]
        return [(t, [run_tool_call(c, table, self.tool_timeout_s) for c in parse_tool_calls(t)]) for t in texts]

    def gold_outputs(self) -> set[str]:
        """The stripped outputs of the task's gold calls (cached per env: they run once)."""
        if self._gold is None:
            self._gold = {r.output.strip() for _, results in self._run_gold_calls() for r in results if r.ok}
        return self._gold

    def reset(self) -> list[Message]:
        self._reset_state()
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.task.question},
        ]

    def step(self, action: str) -> StepResult:
        try:
            return self._step(action if isinstance(action, str) else "")
        except Exception as e:  # noqa: BLE001 - the contract: step never raises
            self.done = True
            return StepResult([], 0.0, True, self._info(success=False, calls=[], error=repr(e)[:300]))

    def _step(self, action: str) -> StepResult:
        if self.done:
            return StepResult([], 0.0, True, self._info(success=False, calls=[], error="episode is over"))
        self.turn += 1
        out_of_turns = self.turn >= self.max_turns
        calls = parse_tool_calls(action)
        if calls:  # tool calls win over an <answer> in the same turn: that answer was a guess
            table = {t.name: t for t in self.tools}
            results = [run_tool_call(c, table, self.tool_timeout_s) for c in calls[: self.max_calls_per_turn]]
            for c in calls[self.max_calls_per_turn :]:  # not run: tell the model, count as invalid
                c.error = f"at most {self.max_calls_per_turn} tool calls per turn"
                results.append(run_tool_call(c, table, self.tool_timeout_s))
            self.n_calls += len(results)
            self.n_invalid += sum(not r.ok for r in results)
            self.done = out_of_turns
            obs = [] if self.done else [r.to_message() for r in results]
            reward = 0.0
            if self.call_reward and not self.call_paid:
                gold = self.gold_outputs()
                if any(r.ok and r.output.strip() in gold for r in results):
                    self.call_paid, reward = True, self.call_reward
            info = self._info(success=False, calls=[r.record() for r in results])
            return StepResult(obs, reward, self.done, info)
        if extract_answer(action) is not None:
            reward, info = score_answer(action, self.task.answer)
            if not info["success"] and reward > 0:  # the format term: its size, and only after a working call
                no_tool = self.format_needs_tool and self.n_calls == self.n_invalid
                reward = 0.0 if no_tool else self.format_reward
            self.done = True
            return StepResult([], reward, True, self._info(calls=[], lenient=self._lenient(action), **info))
        self.done = out_of_turns
        obs = [] if self.done else [{"role": "user", "content": NUDGE}]
        return StepResult(obs, 0.0, self.done, self._info(success=False, calls=[], lenient=self._lenient(action)))

    def _lenient(self, reply: str) -> bool:
        """The answer however the reply states it (`eval/accuracy_lenient`): the reply that ends the episode counts."""
        try:
            stated = stated_answer(reply)
            return stated is not None and _norm(stated) == _norm(self.task.answer)
        except Exception:  # noqa: BLE001 - never raises
            return False

    def _info(self, success: bool, calls: list[dict], **extra: Any) -> dict[str, Any]:
        return {
            "success": success,
            "tool_calls": self.n_calls,  # cumulative over the episode
            "invalid_calls": self.n_invalid,  # cumulative: malformed, unknown tool, bad args, tool errors
            "calls": calls,  # this turn's calls: name, arguments, ok, error, latency_s
            "turn": self.turn,
            "kind": self.task.kind,
            "answer": self.task.answer,
            "gold_call": self.call_paid,  # a call returned a gold call's output (call_reward's condition)
            **extra,
        }

    def expert_action(self) -> str:
        """The expert's next reply (SFT's demonstration): the task's next gold call, one a turn, then the answer.
        A held-out task has none: the held-out splits are never taught."""
        if self.split != "train":
            raise NoExpert(f"tool_use: no expert on the {self.split} split (its tasks are held out)")
        return self._expert_reply()

    def _expert_reply(self) -> str:
        calls = self.task.calls
        if len(calls) >= self.max_turns:
            raise NoExpert(
                f"tool_use: {len(calls)} gold calls and the answer need more than max_turns={self.max_turns}"
            )
        if self.turn < len(calls):
            return format_tool_call(*calls[self.turn])
        return f"<answer>{self.task.answer}</answer>"

    def expert_conversation(self) -> list[Message]:
        """A solved episode: each expert call as one assistant turn, its real tool output, then the answer.
        Runs the tools but leaves the env's own episode state alone."""
        msgs = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.task.question},
        ]
        for text, results in self._run_gold_calls():
            msgs.append({"role": "assistant", "content": text})
            msgs += [r.to_message() for r in results]
        msgs.append({"role": "assistant", "content": f"<answer>{self.task.answer}</answer>"})
        return msgs
