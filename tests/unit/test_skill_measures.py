"""Measurement that tells skill from format (issue 72): the format-free (lenient) score reads the answer however a
reply states it; a closed-set split gives its chance level and best constant answer; the validation split shares no
question with test or train."""

import pytest

import envs
from envs.answers import lenient_match, named_option, stated_answer
from envs.text_math import TextMathEnv, test_problems, train_problem, validation_problems
from nanosky import dist
from nanosky.agent.trajectory import Trajectory
from nanosky.cli import parse_args
from nanosky.evaluate import MAX_TASKS, answer_metrics
from nanosky.preflight import UsageError


@pytest.mark.parametrize(
    "reply, stated",
    [
        ("so <answer>12</answer> and then 13", "12"),  # an answer tag, before any later number
        ("the total is \\boxed{3/4}.", "3/4"),
        ("\\boxed{\\frac{1}{2}} is it", "\\frac{1}{2}"),  # one level of inner braces
        ("5 + 7 = 12\n#### 12", "12"),
        ("So the answer is: 20 apples.", "20"),
        ("4 + 5 = 9, and 9 - 1 = 8", "8"),  # the last number
        ("I do not know", None),
    ],
)
def test_the_stated_answer_is_read_in_each_form(reply, stated):
    assert stated_answer(reply) == stated


def test_the_lenient_score_compares_the_stated_answer_as_the_strict_one_does():
    assert lenient_match("#### 1,200", "1200") and lenient_match("The answer is $5.00.", "5")
    assert lenient_match("\\boxed{6/3}", "2") and not lenient_match("\\boxed{7}", "2")
    assert not lenient_match("no answer here", "2") and not lenient_match(None, "2")  # never raises
    assert lenient_match("<answer>4</answer>", "4")  # the strict format is lenient too


@pytest.mark.parametrize(
    "reply, option",
    [
        ("5 is larger than 3", "5"),  # one clause: its first named
        ("Between 3 and 5, the larger is 5", "5"),  # the last clause naming one alone
        ("7 is not even, it is odd.", "odd"),
        ("It is Odd.", "odd"),  # case aside
        ("<answer>no</answer>", "no"),
        ("The answer is: Ann. Ben is shorter.", "Ann"),  # an explicit statement first
        ("none of them", None),
        ("It is 35", None),  # whole words only: "35" names neither 3 nor 5
    ],
)
def test_the_option_a_reply_names(reply, option):
    assert named_option(reply, ("3", "5", "even", "odd", "yes", "no", "Ann", "Ben", "Cal")) == option


def test_a_text_math_episode_reports_its_lenient_verdict_and_its_options():
    env = TextMathEnv("test", next(i for i, p in enumerate(test_problems()) if p.options == ("even", "odd")))
    env.reset()
    info = env.step(f"It is {env.problem.answer}.").info  # right, without the answer tags
    assert info["success"] is False and info["lenient"] is True and info["options"] == ("even", "odd")
    info = env.step(f"<answer>{env.problem.answer}</answer>").info
    assert info["success"] is True and info["lenient"] is True
    arith = TextMathEnv("test", 0)
    assert "options" not in arith.step("0").info  # an open answer has no closed set


def test_the_logic_splits_chance_is_a_random_options_score():
    """The 66 held-out logic problems: 2, 2 and 3 options by level, a random option scores 0.444."""
    logic = [p for p in test_problems() if p.kind == "logic"]
    assert len(logic) == 66 and sorted({len(p.options) for p in logic}) == [2, 3]
    assert all(p.answer in p.options for p in logic)
    assert sum(1 / len(p.options) for p in logic) / len(logic) == pytest.approx(0.4444, abs=1e-4)


def test_chance_and_the_best_constant_answer_over_a_closed_set_split():
    dist.init_distributed()

    def ep(answer, options=(), lenient=None, success=True):
        info = {"answer": answer} | ({"options": options} if options else {})
        return Trajectory(success=success, info=info | ({} if lenient is None else {"lenient": lenient}))

    yes_no, three = ("yes", "no"), ("a", "b", "c")
    trajs = [ep("yes", yes_no, True), ep("yes", yes_no, False), ep("no", yes_no, True), ep("a", three, True)]
    m = answer_metrics(trajs)
    assert m["eval/chance"] == pytest.approx((0.5 * 3 + 1 / 3) / 4)
    assert m["eval/constant_best"] == 0.5  # always "yes"
    assert m["eval/accuracy_lenient"] == 0.75
    # a split of both kinds (text_math's): an open answer's chance counts 0
    assert answer_metrics([ep("yes", yes_no, True), ep("12", lenient=True)])["eval/chance"] == 0.25
    # open answers: no chance level to state, a constant answer's score still; an unchecked episode is not counted
    m = answer_metrics([ep("12", lenient=True), ep("13", lenient=False), ep("12", success=None)])
    assert "eval/chance" not in m and m["eval/constant_best"] == pytest.approx(2 / 3)
    assert m["eval/accuracy_lenient"] == 0.5
    assert answer_metrics([Trajectory(success=False)]) == {}  # an env that says nothing: nothing claimed
    assert answer_metrics([]) == {}  # over zero episodes: absent, never 0
    # a split mixing a few tasks: each one's accuracy; one task per episode (alfworld's instructions): none
    by_task = [Trajectory(success=i % 2 == 0, info={"task": f"t{i % 2}", "answer": "1"}) for i in range(4)]
    assert answer_metrics(by_task)["eval/t0/accuracy"] == 1.0 and answer_metrics(by_task)["eval/t1/accuracy"] == 0.0
    many = [Trajectory(success=True, info={"task": f"put {i} in box", "answer": "1"}) for i in range(MAX_TASKS + 1)]
    assert not [k for k in answer_metrics(many) if k.startswith("eval/put")]


def test_the_validation_split_shares_no_question_with_test_or_train():
    val, test = {p.question for p in validation_problems()}, {p.question for p in test_problems()}
    assert len(val) == len(test) == 200 and not val & test
    assert not {train_problem(s).question for s in range(3000)} & (val | test)
    assert envs.make("math", "validation", 3).problem == validation_problems()[3]
    with pytest.raises(ValueError, match="env 'webshop_lite': split must be"):
        envs.make("webshop_lite", "validation", 0)


def test_tool_use_validation_split_shares_no_question_with_test_or_train():
    from envs.tool_use import KINDS, VALIDATION_SIZE, test_tasks, train_task

    val, test = {t.question for t in test_tasks(split="validation")}, {t.question for t in test_tasks()}
    assert len(val) == VALIDATION_SIZE and not val & test
    assert not {train_task(s).question for s in range(2000)} & (val | test)
    assert envs.make("tool_use", "validation", 7).task == test_tasks(KINDS, "validation")[7]
    assert envs.make("tool_use", "validation", 7, kinds=("python",)).task.kind == "python"


def test_reasoning_gym_has_a_validation_split_and_a_lenient_verdict():
    pytest.importorskip("reasoning_gym")
    kw = {"tasks": "basic_arithmetic", "config": '{"basic_arithmetic": {"max_terms": 2, "max_digits": 1}}'}
    kw["test_size"] = 20
    val = {envs.make("reasoning_gym", "validation", i, **kw).entry["question"] for i in range(20)}
    test = {envs.make("reasoning_gym", "test", i, **kw).entry["question"] for i in range(20)}
    assert val and not val & test
    assert not {envs.make("reasoning_gym", "train", i, **kw).entry["question"] for i in range(200)} & (val | test)
    env = envs.make("reasoning_gym", "test", 0, **kw)
    answer = env.entry["answer"]
    info = env.step(f"The answer is {answer}").info  # no tags: the strict score reads nothing
    assert info["success"] is False and info["lenient"] is True
    assert env.step(f"<answer>{answer}</answer>").info["lenient"] is True
    assert env.step("The answer is 1").info["env_metrics"]["basic_arithmetic/lenient"] == float(answer == "1")


def test_reasoning_gym_in_the_stated_answer_format_rewards_the_answer_however_stated():
    pytest.importorskip("reasoning_gym")
    kw = {"tasks": "chain_sum", "config": '{"chain_sum": {"max_terms": 2, "max_digits": 1}}', "test_size": 5}
    env = envs.make("reasoning_gym", "test", 1, answer_format="last", **kw)
    assert "The answer is" in env.reset()[0]["content"]  # its prompt asks for the model's own closing line
    answer = env.entry["answer"]
    for reply in (f"so it is {answer}", f"The answer is: {answer}.", f"<answer>{answer}</answer>"):
        r = env.step(reply)
        assert (r.reward, r.info["success"], r.info["lenient"]) == (1.0, True, True), reply
    wrong = env.step(f"The answer is {int(answer) + 1}, not {answer}")  # the statement wins over the last number
    assert (wrong.reward, wrong.info["lenient"]) == (0.0, False)
    assert envs.make("reasoning_gym", "test", 1, **kw).step(f"so it is {answer}").reward == 0.0  # tags: strict
    with pytest.raises(ValueError, match="answer_format: unknown 'boxed'"):
        envs.make("reasoning_gym", "test", 1, answer_format="boxed", **kw)


def test_a_split_of_several_tasks_reports_each_tasks_accuracy():
    dist.init_distributed()

    def ep(task, success, lenient):
        return Trajectory(success=success, info={"task": task, "answer": "1", "lenient": lenient})

    m = answer_metrics([ep("a", True, True), ep("a", False, True), ep("b", False, False), ep("b", None, None)])
    assert (m["eval/a/accuracy"], m["eval/a/accuracy_lenient"]) == (0.5, 1.0)
    assert (m["eval/b/accuracy"], m["eval/b/accuracy_lenient"]) == (0.0, 0.0)  # the unchecked episode: not counted
    assert not any(k.startswith("eval/a/") for k in answer_metrics([ep("a", True, True)]))  # one task: the headline


def test_the_eval_split_is_one_the_env_makes():
    assert parse_args(["--eval.split", "validation"], console=False).eval.split == "validation"
    with pytest.raises(UsageError, match=r"--eval.split 'validation': env 'webshop_lite' makes only train, test"):
        parse_args(["--env", "webshop_lite", "--eval.split", "validation"], console=False)


def test_a_tool_use_episode_that_states_its_answer_without_tags_is_lenient_not_strict():
    env = envs.make("tool_use", "test", 0, max_turns=1)
    env.reset()
    info = env.step(f"The answer is {env.task.answer}").info  # no <answer> tag: not an answer to the env
    assert info["success"] is False and info["lenient"] is True
    env = envs.make("tool_use", "test", 0)
    env.reset()
    assert env.step(f"<answer>{env.task.answer}</answer>").info["lenient"] is True


def test_the_smollm2_arith_preset_trains_two_tasks_and_holds_two_out():
    """`--preset smollm2_arith`: train draws only the sums (weights 1,1,0,0); its held-out split interleaves all four
    tasks, so `--eval.limit 200` is every held-out question, and each answer is scored however it is stated."""
    pytest.importorskip("reasoning_gym")
    cfg = parse_args(["--preset", "smollm2_arith"], console=False)
    assert (cfg.env, cfg.eval.split, cfg.model.path) == ("reasoning_gym", "validation", "smollm2-135m")
    kw = cfg.env_args()
    assert {envs.make("reasoning_gym", "train", s, **kw).task for s in range(200)} == {"basic_arithmetic", "chain_sum"}
    held = [envs.make("reasoning_gym", "validation", s, **kw) for s in range(cfg.eval.limit)]
    assert [sum(e.task == t for e in held) for t in kw["tasks"].split(",")] == [50, 50, 50, 50]
    env = held[0]
    assert env.task == "basic_arithmetic" and env.step(f"so it is {env.entry['answer']}").reward == 1.0


def test_the_run_closes_with_each_tasks_accuracy_before_and_after():
    """The headline averages every task of the split, the ones not trained on included (reasoning_gym's weight-0
    tasks): the closing lines and summary.json give each task's start and end, so a skill's gain is not read off the
    mixed headline."""
    from types import SimpleNamespace

    from nanosky.evaluate import Evaluator

    dist.init_distributed()
    cfg = parse_args(["--eval.limit", "4", "--eval.n-samples", "1"], console=False)
    scores = {0: {"arith": [True, False], "spell": [False, False]}, 5: {"arith": [True, True], "spell": [True, False]}}

    class Log:
        scalars = rollouts = print = staticmethod(lambda *a, **k: None)

    class FakeRollout:
        tok, judging, step = None, None, 0

        def run(self, *a, **k):
            s = scores[self.step]
            trajs = [Trajectory(success=ok, info={"task": t, "answer": "1"}) for t in s for ok in s[t]]
            return SimpleNamespace(trajs=trajs)

    rollout = FakeRollout()
    ev = Evaluator(cfg, rollout, Log(), rank=0)
    acc0 = ev.initial(version=0)
    rollout.step = 5
    acc = ev.final(version=5, initial=acc0)
    assert (acc0, acc) == (0.25, 0.75)
    assert ev.by_task() == {"arith": {"initial": 0.5, "final": 1.0}, "spell": {"initial": 0.0, "final": 0.5}}
    assert ev.summary_fields(acc0, acc)["eval_by_task"]["arith"] == {"initial": 0.5, "final": 1.0}
    assert ev.by_task_line() == "\n  by task      arith 0.500 -> 1.000, spell 0.000 -> 0.500"
    # step 0 skipped (or a resumed run): the start is not measured, not 0
    ev.first = {}
    assert "arith not measured -> 1.000" in ev.by_task_line()
    one = Evaluator(cfg, rollout, Log(), rank=0)
    one.last = {"eval/accuracy": 1.0}
    assert one.by_task() == {} and one.by_task_line() == ""  # one task: the headline says it
