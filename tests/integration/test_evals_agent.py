"""evals.agent: HLE-schema loading (image rows skipped), grading (exact match, multiple choice), confidence and
calibration error, the tool-using env on the real mini-wiki tools, and the CLI end to end with a scripted server."""

import json
import re

import pytest

from envs.tools import get_tool
from evals import agent
from evals.scripted import ScriptedServer

MC_Q = "Which city is in Bilovia?\nAnswer Choices: A. Moburg B. Brenmoor C. Tethford D. Famdale"


def test_extract_final_answer_and_confidence():
    assert agent.extract_final("<answer>Moburg</answer>") == ("Moburg", None)
    assert agent.extract_final("Explanation: ...\nAnswer: 1,200\nConfidence: 85%") == ("1,200", 0.85)
    assert agent.extract_final("<answer>B</answer> <confidence>0.3</confidence>") == ("B", 0.3)
    assert agent.extract_final("Confidence: 150%") == (None, None)  # out of range is not a confidence
    assert agent.extract_final("no answer here") == (None, None)


@pytest.mark.parametrize(
    "pred, gold, ok",
    [
        ("The Moburg.", "moburg", True),
        ("  Feth   Norbaeth ", "Feth Norbaeth", True),
        ("1,200", "1200", True),
        ("1200.0", "1200", True),
        ("Moburgs", "Moburg", False),
        ("1201", "1200", False),
        ("", "x", False),
    ],
)
def test_exact_match(pred, gold, ok):
    assert agent.grade(pred, gold, "exactMatch") is ok


@pytest.mark.parametrize("pred", ["C", "c", "(C)", "C.", "C) Tethford", "Option C", "The answer is C", "Tethford"])
def test_multiple_choice_accepts_letter_forms_and_option_text(pred):
    assert agent.parse_choices(MC_Q) == {"A": "Moburg", "B": "Brenmoor", "C": "Tethford", "D": "Famdale"}
    assert agent.grade(pred, "C", "multipleChoice", MC_Q)


@pytest.mark.parametrize("pred", ["B", "Brenmoor", "E", "Paris"])
def test_multiple_choice_rejects_other_options(pred):
    assert not agent.grade(pred, "C", "multipleChoice", MC_Q)


def test_calibration_error():
    assert agent.calibration_error([1.0, 1.0, 0.0], [True, True, False]) == 0.0
    assert agent.calibration_error([1.0] * 4, [False] * 4) == 1.0
    # one bin of 4: mean confidence 0.6, accuracy 0.5 -> |0.1|
    assert agent.calibration_error([0.9, 0.7, 0.5, 0.3], [True, True, False, False]) == pytest.approx(0.1)
    # two bins of 2, sorted by confidence: (0.1, 0.2) all wrong -> 0.15; (0.8, 0.9) right -> 0.15
    assert agent.calibration_error([0.9, 0.1, 0.8, 0.2], [True, False, True, False], bin_size=2) == pytest.approx(0.15)


def test_load_rows_skips_images_and_bad_rows(tmp_path):
    rows = [
        {"id": "a", "question": "q1", "answer": "x", "answer_type": "exactMatch", "image": ""},
        {
            "id": "b",
            "question": "q2",
            "answer": "y",
            "answer_type": "exactMatch",
            "image": "data:image/png;base64,AA",
        },
        {"id": "c", "question": "q3", "answer_type": "exactMatch"},
        {"id": "d", "question": "q4", "answer": "A", "answer_type": "freeForm"},
    ]
    f = tmp_path / "hle.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    good, bad = agent.load_rows(str(f))
    assert [r["id"] for r in good] == ["a"]
    assert {b["id"]: ("image" in b, "answer" in b["error"] or "answer_type" in b["error"]) for b in bad} == {
        "b": (True, False),
        "c": (False, True),
        "d": (False, True),
    }


def test_shipped_sample_is_answerable_with_the_tools():
    rows, bad = agent.load_rows(None)
    assert len(rows) >= 50 and not bad
    assert {r["answer_type"] for r in rows} == {"exactMatch", "multipleChoice"}
    wiki = get_tool("wiki")
    fact = lambda title, key: re.search(rf"{key}: ([^.]+)\.", wiki(title=title)).group(1)  # noqa: E731
    checked = 0
    for r in rows:  # replay two multi-hop templates through the real wiki tool
        if m := re.fullmatch(r"What is the population of the capital of (\w+)\?", r["question"]):
            assert fact(fact(m.group(1), "Capital"), "Population") == r["answer"]
            checked += 1
        elif m := re.fullmatch(r"In what year was the inventor of the (\w+) born\?", r["question"]):
            assert fact(fact(m.group(1), "Inventor"), "Born") == r["answer"]
            checked += 1
    assert checked >= 10


def test_env_runs_tools_and_grades():
    env = agent.AgentQAEnv(
        {"question": "What is the capital of Bilovia?", "answer": "X", "answer_type": "exactMatch"}, max_turns=3
    )
    msgs = env.reset()
    assert msgs[0]["role"] == "system" and [t.name for t in env.tools] == ["search", "wiki", "python_exec"]
    res = env.step('<tool_call>{"name": "python_exec", "arguments": {"code": "print(6 * 7)"}}</tool_call>')
    assert not res.done and res.observations[0]["role"] == "tool" and res.observations[0]["content"] == "42"
    assert res.info["tool_calls"] == 1 and res.info["invalid_calls"] == 0
    res = env.step("hmm")
    assert not res.done and res.observations[0]["role"] == "user"  # nudged
    res = env.step("<answer>x</answer>")
    assert res.done and res.reward == 1.0 and res.info["success"]


def test_env_stops_at_max_turns():
    env = agent.AgentQAEnv({"question": "q", "answer": "a", "answer_type": "exactMatch"}, max_turns=2)
    env.reset()
    assert not env.step('<tool_call>{"name": "nope", "arguments": {}}</tool_call>').done
    res = env.step('<tool_call>{"name": "wiki", "arguments": {"title": "x"}}</tool_call>')
    assert res.done and res.reward == 0.0 and not res.observations


def test_cli_tool_turns_confidence_and_images(tmp_path):
    """A scripted agent: looks a page up, then answers (right on one question, wrong on the other) with a
    confidence. Checks tool results reach the server, and accuracy / calibration / skipped images in the report."""
    rows = [
        {
            "id": "q1",
            "question": "What does python print for 6*7?",
            "answer": "42",
            "answer_type": "exactMatch",
        },
        {
            "id": "q2",
            "question": "What does python print for 2**5?",
            "answer": "32",
            "answer_type": "exactMatch",
        },
        {"id": "q3", "question": "img", "answer": "1", "answer_type": "exactMatch", "image": "x.png"},
    ]
    data = tmp_path / "hle.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def reply(messages):
        last = messages[-1]["content"]
        if "<tool_response>" not in last:  # first turn: run the code
            expr = last.split("for ")[1].rstrip("?")
            return f'<tool_call>{{"name": "python_exec", "arguments": {{"code": "print({expr})"}}}}</tool_call>'
        value = re.search(r"<tool_response>(.*)</tool_response>", last).group(1)
        answer = value if value == "42" else "31"  # wrong on the second question
        return f"<answer>{answer}</answer> Confidence: 80%"

    out, server = tmp_path / "out", ScriptedServer(reply)
    with server as url:
        report = agent.main(["--base-url", url, "--data", str(data), "--out", str(out), "--ask-confidence"])
    # "text" tool mode: tools listed in the system prompt, tool results sent back as user turns
    second = next(r["messages"] for r in server.requests if len(r["messages"]) > 2)
    assert "# Tools" in second[0]["content"] and "- python_exec(code)" in second[0]["content"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert report["accuracy"] == 0.5 and report["n_image_skipped"] == 1 and report["n_skipped"] == 1
    assert report["n_with_confidence"] == 2
    assert report["calibration_error"] == pytest.approx(0.3)  # mean confidence 0.8 vs accuracy 0.5
    assert report["mean_steps"] == 2.0 and report["tool_calls_per_example"] == 1.0
    eps = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
    q1 = next(e for e in eps if e["id"] == "q1")
    assert [m["role"] for m in q1["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert q1["messages"][3]["content"] == "42" and q1["correct"] and q1["confidence"] == 0.8


def test_judge_hook_rescues_free_form_misses(tmp_path):
    """With a judge server, an exactMatch answer that misses the normalised match is asked about; the judge's
    yes counts (marked `judged`), and multiple-choice rows are never sent to the judge."""
    rows = [
        {"id": "a", "question": "Who wrote it?", "answer": "Feth Norbaeth", "answer_type": "exactMatch"},
        {
            "id": "b",
            "question": "Pick one.\nAnswer Choices: A. x B. y",
            "answer": "A",
            "answer_type": "multipleChoice",
        },
    ]
    data = tmp_path / "hle.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = ScriptedServer(
        lambda m: "<answer>F. Norbaeth</answer>" if "wrote" in m[-1]["content"] else "<answer>B</answer>"
    )
    judge = ScriptedServer(lambda m: "yes" if "Correct answer: Feth Norbaeth" in m[0]["content"] else "no")
    with model as url, judge as judge_url:
        report = agent.main(
            ["--base-url", url, "--judge-base-url", judge_url, "--data", str(data), "--out", str(tmp_path / "out")]
        )
    assert report["accuracy"] == 0.5 and len(judge.requests) == 1
    eps = {json.loads(x)["id"]: json.loads(x) for x in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()}
    assert eps["a"]["judged"] and eps["a"]["correct"] and not eps["b"]["correct"]


def test_env_dataset_with_a_trl_reward_function_is_graded_per_example(tmp_path, monkeypatch):
    """`evals.agent --env dataset` with `reward MODULE:FN`: the function scores each example's samples as a group,
    as in training (a scripted server answers the even rows right)."""
    pytest.importorskip("datasets", reason="the gyms extra (make test installs it)")
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1] / "scripts"))
    rows = [{"prompt": f"Say {i}.", "answer": str(i)} for i in range(40)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def reply(messages):
        i = int(messages[-1]["content"].split()[1].rstrip("."))
        return str(i) if i % 2 == 0 else "no"

    kwargs = json.dumps({"data_path": str(data), "reward": "trl_rewards:exact"})
    with ScriptedServer(reply) as url:
        report = agent.main(
            [
                "--base-url",
                url,
                "--env",
                "dataset",
                "--env-kwargs",
                kwargs,
                "--limit",
                "4",
                "--n-samples",
                "2",
                "--temperature",
                "1.0",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    import envs

    want = [int(envs.make("dataset", "test", i, data_path=str(data)).task.answer) % 2 == 0 for i in range(4)]
    assert report["accuracy"] == pytest.approx(sum(want) / 4) and 0 < sum(want) < 4
