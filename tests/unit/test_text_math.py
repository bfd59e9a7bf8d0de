"""text_math: generators (determinism, split disjointness, correct scratchpads), scoring, GSM8K loader, env."""

from __future__ import annotations

import json
import random
import re
import warnings
from collections import Counter
from pathlib import Path

import pytest

import envs
from envs import text_math as tm
from envs.text_math import (
    KINDS,
    LEVELS,
    SYSTEM_PROMPT,
    TEST_SIZE,
    Problem,
    TextMathEnv,
    extract_answer,
    load_gsm8k_jsonl,
    normalize_answer,
    sample_problem,
    score,
    train_problem,
)
from envs.text_math import test_problems as held_out  # renamed so pytest does not collect it

FIXTURE = Path(tm.__file__).parent / "data" / "gsm8k_sample.jsonl"

# ------------------------------------------------------------------------------------------ reference solvers
# Written independently of the generators: parse the question text and compute the answer from scratch.


def _solve(p: Problem) -> str:
    q = p.question
    if m := re.fullmatch(r"What is (\d+) ([-+*]) (\d+)(?: ([-+]) (\d+))?\?", q):
        a, op, b, op2, c = m.groups()
        v = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        return str(v if op2 is None else v + int(c) if op2 == "+" else v - int(c))
    if m := re.fullmatch(r"Which is (larger|smaller), (\d+) or (\d+)\?", q):
        f = max if m.group(1) == "larger" else min
        return str(f(int(m.group(2)), int(m.group(3))))
    if m := re.fullmatch(r"Which is the (largest|smallest) of (\d+), (\d+) and (\d+)\?", q):
        f = max if m.group(1) == "largest" else min
        return str(f(int(x) for x in m.groups()[1:]))
    if m := re.fullmatch(r"Is (\d+) even or odd\?", q):
        return "even" if int(m.group(1)) % 2 == 0 else "odd"
    if m := re.fullmatch(r"Is (\d+) (greater|less) than (\d+)\?", q):
        a, b = int(m.group(1)), int(m.group(3))
        return "yes" if (a > b if m.group(2) == "greater" else a < b) else "no"
    if m := re.fullmatch(r"(All|No) (\w+)s are (\w+)s\. (\w+) is a (\w+)\. Is \4 a (\w+)\?", q):
        quant, p_, q_, _, member, asked = m.groups()
        if quant == "All":
            assert (member, asked) == (p_, q_)
            return "yes"
        assert {member, asked} == {p_, q_}
        return "no"
    if m := re.fullmatch(
        r"(\w+) is (taller|shorter) than (\w+)\. (\w+) is (taller|shorter) than (\w+)\. Who is the (tallest|shortest)\?",
        q,
    ):
        taller = {}  # name -> set of names they are taller than (direct facts only)
        for x, rel, y in (m.group(1, 2, 3), m.group(4, 5, 6)):
            hi, lo = (x, y) if rel == "taller" else (y, x)
            taller.setdefault(hi, set()).add(lo)
        names = {m.group(i) for i in (1, 3, 4, 6)}
        assert len(names) == 3
        below = {n for s in taller.values() for n in s}
        if m.group(7) == "tallest":
            (top,) = names - below
            return top
        (bottom,) = names - set(taller)
        return bottom
    if m := re.search(r"How many \w+ does (\w+) have now\?|How many \w+ does each friend get\?", q):
        return _solve_word(q)
    raise AssertionError(f"no reference solver for {q!r}")


def _solve_word(q: str) -> str:
    sentences = re.findall(r"[^.?]+[.?]", q)
    name = sentences[0].split()[0]
    if m := re.fullmatch(rf"{name} has (\d+) boxes of (\d+) \w+\.", sentences[0]):
        cur = int(m.group(1)) * int(m.group(2))
    else:
        cur = int(re.fullmatch(rf"{name} has (\d+) \w+\.", sentences[0]).group(1))
    for s in (s.strip() for s in sentences[1:-1]):
        if m := re.fullmatch(rf"{name} buys (\d+) packs of (\d+) more\.", s):
            cur += int(m.group(1)) * int(m.group(2))
        elif m := re.fullmatch(rf"(?:{name} buys|{name} finds|\w+ gives {name}) (\d+) more\.", s):
            cur += int(m.group(1))
        elif m := re.fullmatch(rf"{name} (?:gives (\d+) to \w+|loses (\d+)|sells (\d+))\.", s):
            cur -= int(next(g for g in m.groups() if g))
        elif m := re.fullmatch(rf"{name} shares them equally among (\d+) friends\.", s):
            assert cur % int(m.group(1)) == 0
            cur //= int(m.group(1))
        else:
            raise AssertionError(f"unknown sentence {s!r}")
        assert cur > 0
    return str(cur)


def _check_steps(p: Problem) -> None:
    """Every line is one known, correct operation; the last line ends in the answer."""
    assert p.steps, p
    for line in p.steps:
        if m := re.fullmatch(r"(-?\d+) ([-+*/]) (\d+) = (-?\d+)", line):
            a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
            if op == "/":
                assert a % b == 0 and a // b == c, line
            else:
                assert {"+": a + b, "-": a - b, "*": a * b}[op] == c, line
        elif m := re.fullmatch(r"(\d+) ([<>]) (\d+)(?:, so (\w+))?", line):
            a, b = int(m.group(1)), int(m.group(3))
            assert (a < b) if m.group(2) == "<" else (a > b), line
        elif m := re.fullmatch(r"the last digit of (\d+) is (\d)", line):
            assert int(m.group(1)) % 10 == int(m.group(2)), line
        elif m := re.fullmatch(r"(\d) is (even|odd)", line):
            assert (int(m.group(1)) % 2 == 0) == (m.group(2) == "even"), line
        elif m := re.fullmatch(r"(\w+) is a (\w+)", line):
            assert f"{line}." in p.question, line  # restates a premise
        elif m := re.fullmatch(r"((?:all|no) \w+ are \w+), so (yes|no)", line):
            assert f"{m.group(1)}." in p.question.lower(), line
        elif m := re.fullmatch(r"(\w+) > (\w+) > (\w+)", line):
            hi, mid, lo = m.groups()
            for x, y in ((hi, mid), (mid, lo)):
                assert f"{x} is taller than {y}." in p.question or f"{y} is shorter than {x}." in p.question
        elif re.fullmatch(r"so the (tallest|shortest) is \w+", line):
            pass  # its conclusion is checked against the reference answer below
        else:
            raise AssertionError(f"unrecognised step {line!r} in {p}")
    assert p.steps[-1].split()[-1] == p.answer, p


# ------------------------------------------------------------------------------------------ generators


def test_every_kind_and_level_has_correct_answer_and_steps():
    rng = random.Random(123)
    for kind in KINDS:
        for level in range(1, LEVELS[kind] + 1):
            for _ in range(150):
                p = tm.generate(rng, kind, level)
                assert (p.kind, p.level) == (kind, level)
                assert _solve(p) == p.answer, p
                _check_steps(p)
                assert len(p.question.split()) <= 40, p.question


def test_generators_respect_level_constraints():
    rng = random.Random(7)
    negatives = Counter()
    for level in range(1, 6):
        for _ in range(300):
            p = tm.generate(rng, "arith", level)
            negatives[level] += p.answer.startswith("-")
            nums = [int(x) for x in re.findall(r"\d+", p.question)]
            if level == 1:
                assert all(0 <= x <= 20 for x in nums)
            elif level in (2, 5):
                assert all(10 <= x <= 99 for x in nums)
            elif level == 3:
                assert 100 <= nums[0] <= 999 and 10 <= nums[1] <= 999
            else:
                assert 10 <= nums[0] <= 99 and 2 <= nums[1] <= 9
    assert negatives[3] == negatives[4] == negatives[5] == 0
    assert 0 < negatives[1] < 60 and 0 < negatives[2] < 60  # present but sparing
    for level in (1, 2, 3):  # word problems: 2 ops at level 1-2, 3 at level 3, all values below 100
        for _ in range(200):
            p = tm.generate(rng, "word", level)
            assert len(p.steps) == (3 if level == 3 else 2), p
            assert all(0 < int(s.split()[-1]) < 100 for s in p.steps), p
    answers = Counter(tm.generate(rng, "logic", 2).answer for _ in range(600))
    assert answers["yes"] > 200 and answers["no"] > 200  # both polarities
    with pytest.raises(ValueError):
        tm.generate(rng, "arith", 6)
    with pytest.raises(ValueError):
        tm.generate(rng, "poetry", 1)


def test_determinism():
    assert train_problem(42) == train_problem(42)
    assert [sample_problem(random.Random(5)) for _ in range(3)] == [sample_problem(random.Random(5))] * 3
    assert len({train_problem(s).question for s in range(50)}) > 45  # seeds give different problems
    assert held_out() == held_out() and held_out() is not held_out()  # cached but callers cannot mutate it


def test_test_split_is_fixed_balanced_and_unique():
    t = held_out()
    assert len(t) == TEST_SIZE and all(isinstance(p, Problem) for p in t)
    assert len({p.question for p in t}) == TEST_SIZE
    kinds = Counter(p.kind for p in t)
    assert set(kinds) == set(KINDS) and max(kinds.values()) - min(kinds.values()) <= 1
    for kind in KINDS:
        levels = Counter(p.level for p in t if p.kind == kind)
        assert set(levels) == set(range(1, LEVELS[kind] + 1))
        assert max(levels.values()) - min(levels.values()) <= 1
    for p in t:
        assert _solve(p) == p.answer
        _check_steps(p)


def test_train_never_returns_a_test_question():
    test_qs = {p.question for p in held_out()}
    train = [train_problem(s) for s in range(20_000)]
    assert not any(p.question in test_qs for p in train)
    assert Counter(p.kind for p in train).keys() == set(KINDS)
    # Not vacuous: an unfiltered stream of the same generators does hit test questions this often.
    rng = random.Random(0)
    assert sum(sample_problem(rng).question in test_qs for _ in range(20_000)) > 0
    # with a kinds filter too
    assert all(train_problem(s, ("logic",)).kind == "logic" for s in range(200))


# ------------------------------------------------------------------------------------------ scoring


@pytest.mark.parametrize(
    "raw, norm",
    [
        (" 42 ", "42"),
        ("$1,200.00", "1200"),
        ("12.0", "12"),
        ("+5", "5"),
        ("-12", "-12"),
        ("-0", "0"),
        ("007", "7"),
        ("0.50", "0.5"),
        ("6/3", "2"),
        ("-6 / 3", "-2"),
        ("1/2", "0.5"),
        ("1/128", "0.0078125"),
        ("2/6", "1/3"),
        ("5/0", "5/0"),
        ("Yes.", "yes"),
        ("ANN", "ann"),
        ("42.", "42"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_extract_answer_edge_cases():
    assert extract_answer("so <answer> 42 </answer>") == "42"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer("<answer>1</answer> then <answer>2") == "1"  # last one unclosed
    assert extract_answer("<answer>a<answer>7</answer>") == "7"  # nested open
    assert extract_answer("<answer>7</answer></answer>") == "7"  # stray close
    assert extract_answer("</answer><answer>7") is None
    assert extract_answer("<answer>7") is None
    assert extract_answer("no tags at all") is None
    assert extract_answer("") is None
    assert extract_answer("<answer>\n 3\n</answer>") == "3"


def test_score_rewards_and_info():
    assert score("1 + 1 = 2 <answer>2</answer>", "2") == (
        1.0,
        {"success": True, "format_ok": True, "pred": "2"},
    )
    assert score("<answer>$1,000</answer>", "1000")[0] == 1.0
    assert score("<answer>Yes</answer>", "yes")[0] == 1.0
    assert score("<answer>3</answer>", "2") == (0.1, {"success": False, "format_ok": True, "pred": "3"})
    assert score("<answer></answer>", "2")[0] == 0.0  # empty answer earns no format reward
    assert score("2", "2") == (0.0, {"success": False, "format_ok": False, "pred": None})
    assert score("<answer>2", "2")[0] == 0.0


def test_score_never_raises():
    big = "9" * 200_000
    cases = [
        None,
        "",
        big,
        f"<answer>{big}</answer>",
        f"<answer>{big}/3</answer>",
        "<answer>1e999999</answer>",
        "<answer>١٢</answer>",  # non-ASCII digits
        "<answer>🙂</answer>",
        "<answer>\x00</answer>",
        "<answer>" * 10_000 + "</answer>" * 10_000,
    ]
    rng = random.Random(0)
    pieces = ["<answer>", "</answer>", "<", ">", "/", "1", "-", ".", "$", ",", " ", "é", "\n", "answer"]
    cases += ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))) for _ in range(2000)]
    for c in cases:
        reward, info = score(c, "12")
        assert reward in (0.0, 0.1, 1.0) and set(info) == {"success", "format_ok", "pred"}
    assert score(f"<answer>{big}</answer>", big)[0] == 1.0  # beyond int()'s digit limit, still compared


# ------------------------------------------------------------------------------------------ GSM8K


def test_load_gsm8k_skips_malformed_rows(tmp_path):
    good = {
        "question": "Tom has 3 bags of 4 apples. How many apples?",
        "answer": "3*4=<<3*4=12>>12\n#### 1,012",
    }
    lines = [
        json.dumps(good),
        "",
        "{not json",
        json.dumps({"question": "no answer"}),
        json.dumps({"question": "no marker", "answer": "12"}),
        json.dumps({"question": 5, "answer": "#### 3"}),
        json.dumps(["a", "list"]),
        json.dumps({"question": "empty final", "answer": "x\n####   "}),
        json.dumps({"question": "Q2?", "answer": "#### -4"}),
    ]
    path = tmp_path / "g.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match="skipped 6 malformed"):
        rows = load_gsm8k_jsonl(path)
    assert [r.answer for r in rows] == ["1012", "-4"]
    assert rows[0].steps == ("3*4=12",) and rows[0].kind == "gsm8k"


def test_bundled_gsm8k_fixture():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fixture itself must be clean
        rows = load_gsm8k_jsonl(FIXTURE)
    assert len(rows) >= 20
    for r in rows:
        assert re.fullmatch(r"-?\d+", r.answer) and r.steps and not any("<<" in s for s in r.steps)
        assert 1 <= r.level <= 3
    for line in FIXTURE.read_text().splitlines():  # the calculator annotations in the fixture are right
        for a, op, b, c in re.findall(r"<<(\d+)([-+*/])(\d+)=(\d+)>>", json.loads(line)["answer"]):
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) / int(b)}[op] == int(
                c
            )


# ------------------------------------------------------------------------------------------ env


def test_env_reset_step_contract():
    env = TextMathEnv(split="train", seed=3)
    assert env.problem == train_problem(3) and env.max_turns == 1
    msgs = env.reset()
    assert msgs == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": env.problem.question},
    ]
    res = env.step(f"thinking... <answer>{env.problem.answer}</answer>")
    assert res.done and res.observations == [] and res.reward == 1.0
    assert res.info["success"] and res.info["answer"] == env.problem.answer
    res = env.step("I don't know")
    assert res.done and res.reward == 0.0 and not res.info["success"]


def test_env_splits_kinds_and_data_path():
    assert TextMathEnv(split="test", seed=TEST_SIZE + 5).problem == held_out()[5]
    assert TextMathEnv(split="test", seed=1, kinds=("word",)).problem.kind == "word"
    assert TextMathEnv(split="train", seed=1, kinds=("arith",)).problem.kind == "arith"
    rows = load_gsm8k_jsonl(FIXTURE)
    env = TextMathEnv(split="test", seed=len(rows) + 2, data_path=FIXTURE, system_prompt="S")
    assert env.problem == rows[2] and env.reset()[0]["content"] == "S"
    assert env.step(f"<answer>{rows[2].answer}</answer>").reward == 1.0
    with pytest.raises(ValueError):
        TextMathEnv(split="val")
    with pytest.raises(ValueError):
        TextMathEnv(kinds=("poetry",))


def test_envs_make_math():
    env = envs.make("math", split="test", seed=0)
    assert isinstance(env, TextMathEnv) and env.problem == held_out()[0]
    assert envs.make("math", split="train", seed=9, data_path=str(FIXTURE)).problem.kind == "gsm8k"


def test_the_hashes_format_asks_for_and_grades_a_last_line_of_hashes():
    """`answer_format="hashes"`: GSM8K's `#### N`, the format a pretrained instruct model already writes."""
    from envs.text_math import HASH_PROMPT, TextMathEnv, extract_hashes

    env = TextMathEnv(split="test", seed=4, answer_format="hashes")
    assert env.reset()[0]["content"] == HASH_PROMPT
    answer = env.problem.answer
    assert env.step(f"Adding up.\n#### {answer}\nDone.").reward == 1.0
    assert TextMathEnv(split="test", seed=4, answer_format="hashes").step("#### nope").reward == 0.1
    assert TextMathEnv(split="test", seed=4, answer_format="hashes").step(f"<answer>{answer}</answer>").reward == 0.0
    assert TextMathEnv(split="test", seed=4).step(f"#### {answer}").reward == 0.0  # the default stays <answer>
    assert extract_hashes("#### 3\n#### 4 apples\n") == "4 apples" and extract_hashes("no marks") is None
    with pytest.raises(ValueError, match="answer_format"):
        TextMathEnv(answer_format="boxed")


def test_the_last_format_grades_the_closing_line_the_model_writes_or_its_last_number():
    from envs.text_math import LAST_PROMPT, TextMathEnv, extract_last

    env = TextMathEnv(split="test", seed=4, answer_format="last")
    assert env.reset()[0]["content"] == LAST_PROMPT
    answer = env.problem.answer
    assert env.step(f"Step 1: ...\n\nThe answer is: {answer}.").reward == 1.0
    assert extract_last("The Answer is $12 apples.") == "12" and extract_last("The answer is: yes.") == "yes"
    assert extract_last("3 then 4.50, The answer is 7\nso 9") == "7"  # the closing line wins over a later number
    assert extract_last("so 3 then -4.50 left") == "-4.50" and extract_last("no number") is None
