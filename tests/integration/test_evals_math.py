"""evals.math: answer extraction, equivalence, data loading with bad rows, pass@k, and the CLI end to end through
a scripted OpenAI-compatible server (the --ckpt path with real vLLM is covered by the slow test in test_swebench)."""

import json
from collections import Counter

import pytest
import tyro

from evals import common
from evals import math as emath
from evals.scripted import ScriptedServer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("steps... <answer>1,200</answer>", "1,200"),
        ("so \\boxed{\\frac{3}{4}} is it", "\\frac{3}{4}"),
        ("\\boxed{a} then \\boxed{\\sqrt{x^{2}}}", "\\sqrt{x^{2}}"),  # the last box, nested braces kept
        ("\\boxed 5", "5"),
        ("\\fbox{7}", "7"),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        ("The answer is 17.", "17"),
        ("first 3, then 5.5", "5.5"),
        ("no digits here", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_answer(text, expected):
    assert emath.extract_answer(text) == expected


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("0.5", "1/2"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac12", "1/2"),
        ("-\\frac{3}{2}", "-1.5"),
        ("\\frac{-3}{2}", "-1.5"),
        ("1,000", "1000"),
        ("$30", "30"),
        ("30 dollars", "30"),
        ("50\\%", "50"),
        ("x = 6", "6"),
        ("(7,3)", "(7, 3)"),
        ("\\sqrt{2}", "\\sqrt2"),
        ("Yes.", "yes"),
        ("007", "7"),
    ],
)
def test_equivalent(pred, gold):
    assert emath.is_equiv(pred, gold)


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("0.33", "1/3"),
        ("2", "3"),
        ("1,2", "12"),
        ("(7,3)", "(3,7)"),
        ("(7,3)", "[7,3]"),
        (None, "1"),
        ("", "0"),
    ],
)
def test_not_equivalent(pred, gold):
    assert not emath.is_equiv(pred, gold)


def test_gold_answer_formats():
    assert emath.gold_answer({"question": "q", "answer": "48 / 2 = 24\n#### 1,024"}) == "1,024"
    assert emath.gold_answer({"problem": "p", "solution": "so $\\boxed{\\frac{5}{6}}$."}) == "\\frac{5}{6}"
    with pytest.raises(ValueError):
        emath.gold_answer({"problem": "p", "solution": "no box"})


def test_shipped_sets_load():
    for name, n in (("text_math", 200), ("gsm8k", 20), ("math", 30)):
        rows, bad = emath.load_rows(name)
        assert len(rows) == n and not bad
        assert all(r["question"] and r["answer"] for r in rows)
    rows, _ = emath.load_rows("math")
    # every shipped MATH answer is equivalent to its own solution's box (what an oracle would write)
    assert all(emath.is_equiv(emath.extract_answer(f"\\boxed{{{r['answer']}}}"), r["answer"]) for r in rows)


def test_bad_rows_are_reported_and_skipped(tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text(
        '{"question": "1+1?", "answer": "#### 2"}\n'
        "not json\n"
        '{"question": "no answer"}\n'
        '{"problem": "p", "solution": "unboxed"}\n'
        "[1, 2]\n"
        '{"problem": "2+2?", "solution": "\\\\boxed{4}"}\n'
    )
    rows, bad = emath.load_rows(str(f))
    assert [r["answer"] for r in rows] == ["2", "4"]
    assert sorted(b["line"] for b in bad) == [2, 3, 4, 5]


def test_pass_at_k():
    assert common.pass_at_k(2, 1, 1) == pytest.approx(0.5)
    assert common.pass_at_k(2, 1, 2) == 1.0
    assert common.pass_at_k(4, 0, 4) == 0.0
    assert common.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    m = common.pass_metrics({"a": [True, False, False, False], "b": [False] * 4})
    assert m["mean@4"] == pytest.approx(0.125) and m["pass@1"] == pytest.approx(0.125)
    assert m["pass@4"] == pytest.approx(0.5) and set(m) == {"mean@4", "pass@1", "pass@2", "pass@4"}


def test_env_rewards_equivalent_answer():
    env = emath.MathQAEnv("What is 1/2 + 1/4?", "\\frac{3}{4}")
    assert env.reset()[1]["content"] == "What is 1/2 + 1/4?"
    assert env.step("<answer>0.75</answer>").reward == 1.0
    res = env.step("I think it is 1")
    assert res.reward == 0.0 and res.done and res.info["pred"] == "1"


def test_config_rejects_greedy_multi_sample():
    with pytest.raises(ValueError, match="temperature"):
        emath.MathEvalConfig(n_samples=4, temperature=0.0)


def test_cli_against_scripted_server(tmp_path):
    """An oracle that is right on every other question: accuracy, pass@k, outputs and bad rows end to end."""
    data = tmp_path / "gsm.jsonl"
    qs = [(f"What is {i} + {i}?", 2 * i) for i in range(6)]
    data.write_text("".join(json.dumps({"question": q, "answer": f"...\n#### {a}"}) + "\n" for q, a in qs) + "{}\n")
    answers = dict(qs)

    def reply(messages):
        q = messages[-1]["content"]
        a = answers[q] if (answers[q] // 2) % 2 == 0 else answers[q] + 1
        return f"{q[8:-1]} = {a}\n<answer>{a}</answer>"

    out = tmp_path / "out"
    with ScriptedServer(reply) as url:
        report = emath.main(
            ["--base-url", url, "--data", str(data), "--out", str(out), "--n-samples", "2", "--temperature", "1.0"]
        )
    assert report["accuracy"] == pytest.approx(0.5) and report["pass@2"] == pytest.approx(0.5)
    assert report["n_examples"] == 6 and report["n_episodes"] == 12 and report["n_skipped"] == 1
    assert report["completion_tokens"] > 0 and report["mean_steps"] == 1.0
    lines = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
    episodes = [x for x in lines if not x.get("skipped")]
    assert len(episodes) == 12 and len(lines) == 13
    assert all(
        e["messages"][-1]["role"] == "assistant" and e["correct"] == (e["pred"] == e["answer"]) for e in episodes
    )
    saved = json.loads((out / "report.json").read_text())
    assert saved["accuracy"] == report["accuracy"] and saved["config"]["n_samples"] == 2


def test_a_dataset_env_file_is_evaluated_with_its_prompt_and_math_verify(tmp_path):
    """A verl parquet file, as `--env dataset` trains on it: the rows' own chat prompt is sent, and the reply is
    scored by math-verify (\\boxed{1/2} against 0.5), the same reward as in training."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("math_verify", reason="the gyms extra (make test installs it)")
    rows = [
        {
            "data_source": "halves",
            "prompt": [{"role": "system", "content": "Box it."}, {"role": "user", "content": f"Half of {i}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i / 2)},
        }
        for i in range(1, 7)
    ]
    data = tmp_path / "test.parquet"
    pd.DataFrame(rows).to_parquet(data)
    seen = []

    def reply(messages):
        seen.append(messages)
        i = int(messages[-1]["content"].split()[2].rstrip("?"))
        return f"\\boxed{{\\frac{{{i}}}{{2}}}}" if i % 3 else "\\boxed{0}"  # right on 4 of 6, as a fraction

    with ScriptedServer(reply) as url:
        report = emath.main(["--base-url", url, "--data", str(data), "--out", str(tmp_path / "out")])
    assert report["accuracy"] == pytest.approx(4 / 6) and report["accuracy_by_source"] == {
        "halves": pytest.approx(4 / 6)
    }
    assert all(m[0] == {"role": "system", "content": "Box it."} for m in seen)  # the file's prompt, not text_math's


# ---------------------------------------------------------------------------------------------- skill apart from format


def _played(rows, replies, n_samples=1):
    """The trajectories `evaluate` would get from `rollout`, without a model: each row's MathQAEnv fed `replies`."""
    from nanosky.agent.trajectory import Trajectory

    trajs = []
    for row, reply in zip([r for r in rows for _ in range(n_samples)], replies):
        env = emath.MathQAEnv(row["question"], row["answer"], messages=row.get("messages"), options=row.get("options"))
        res = env.step(reply)
        trajs.append(Trajectory(success=res.info.get("success"), reward=res.reward, turns=1, info=res.info))
    return trajs


def test_an_option_row_is_read_by_the_option_named_and_strict_by_the_tag_alone():
    env = emath.MathQAEnv("Which is larger, 5 or 3?", "5", options=("5", "3"))
    said = env.step("5 is larger than 3").info  # the last number (3) is not the answer; the option named (5) is
    assert said["success"] and not said["strict"] and said["pred"] == "5" and said["options"] == ("5", "3")
    assert env.step("<answer>5</answer>").info["strict"] and env.step("<answer>05</answer>").info["success"]
    wrong = env.step("3 is larger than 5").info
    assert not wrong["success"] and not wrong["strict"]
    open_q = emath.MathQAEnv("What is 2 + 2?", "4").step("2 + 2 = 4").info  # an open row: the format-free reading
    assert open_q["success"] and not open_q["strict"] and "options" not in open_q


def test_the_report_gives_strict_accuracy_chance_and_the_best_constant_answer():
    rows = [
        {"id": "a", "question": "Is 4 even?", "answer": "yes", "source": "text_math", "options": ("yes", "no")},
        {
            "id": "b",
            "question": "Who is tallest?",
            "answer": "Ann",
            "source": "text_math",
            "options": ("Ann", "Ben", "Cy"),
        },
        {"id": "c", "question": "Is it?", "answer": "Yes.", "source": "text_math", "options": ()},  # open
    ]
    replies = ["<answer>yes</answer>", "Ann is the tallest.", "The answer is yes."]  # right, two without the tag
    report, records = emath.report_of(rows, _played(rows, replies), emath.MathEvalConfig(), [], 1.0)
    assert report["accuracy"] == 1.0 and report["accuracy_strict"] == pytest.approx(1 / 3)
    assert report["chance"] == pytest.approx((1 / 2 + 1 / 3 + 0) / 3)
    assert report["constant_best"] == pytest.approx(2 / 3)  # "yes" and "Yes." are one answer
    assert [r["strict"] for r in records] == [True, False, False]
    assert {"eval/math/accuracy_strict", "eval/math/chance", "eval/math/constant_best"} <= set(
        common.metrics(report, "eval/math")
    )
    table = common.summary_table(report)
    assert all(k in table for k in ("accuracy_strict", "chance", "constant_best"))


def test_open_rows_have_no_chance_and_zero_rows_claim_nothing():
    rows, _ = emath.load_rows("gsm8k", limit=4)
    replies = [f"so it is {r['answer']}" for r in rows]  # right, never tagged
    report, _ = emath.report_of(rows, _played(rows, replies), emath.MathEvalConfig(), [], 1.0)
    assert "chance" not in report and report["accuracy"] == 1.0 and report["accuracy_strict"] == 0.0
    assert report["constant_best"] == pytest.approx(max(Counter(r["answer"] for r in rows).values()) / 4)
    empty, _ = emath.report_of([], [], emath.MathEvalConfig(), [], 0.0)
    assert empty["accuracy"] != empty["accuracy"]  # NaN, not 0
    assert not {"accuracy_strict", "chance", "constant_best"} & set(empty)
    verified = [{"id": "v", "messages": [{"role": "user", "content": "1?"}], "question": "1?", "answer": "1"}]
    report, _ = emath.report_of(
        [r | {"source": "d"} for r in verified], _played(verified, ["1"]), emath.MathEvalConfig()
    )
    assert "accuracy_strict" not in report  # math-verify's rows have no tag reading


def test_split_validation_loads_the_validation_problems_and_only_for_text_math():
    from envs.text_math import test_problems, validation_problems

    rows, bad = emath.load_rows("text_math", split="validation")
    assert not bad and [r["question"] for r in rows] == [p.question for p in validation_problems()]
    assert [r["options"] for r in rows] == [tuple(p.options) for p in validation_problems()]
    test_rows, _ = emath.load_rows(None)
    assert [r["options"] for r in test_rows] == [tuple(p.options) for p in test_problems()]
    assert any(r["options"] for r in test_rows) and any(not r["options"] for r in test_rows)
    assert tyro.cli(emath.MathEvalConfig, args=["--split", "validation"]).split == "validation"
    with pytest.raises(ValueError, match="text_math"):
        emath.MathEvalConfig(data="gsm8k", split="validation")
    with pytest.raises(ValueError, match="text_math"):
        emath.load_rows("gsm8k", split="validation")
