"""On-policy distillation (`--distill.teacher`, algos/distill.py, nanosky/distill.py): the advantage is the
teacher's per-token log-ratio on the student's own tokens, masked to them, plus the env's advantage at its weight;
its sum over the tokens is minus the reverse KL's sample estimate. The flags' rules and the teacher's tokenizer are
checked at start-up. The 2-rank runs are in tests/e2e/test_distill_e2e.py."""

import pytest
import torch

import algos
from nanosky import preflight
from nanosky.cli import parse_args


def _logprobs(seed: int, shape=(3, 5)) -> torch.Tensor:
    return torch.log_softmax(torch.randn(*shape, 7, generator=torch.Generator().manual_seed(seed)), -1)[..., 0]


MASK = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])  # prompt, response, padding; a row of none


def test_the_advantage_is_the_teachers_log_ratio_on_the_students_tokens_only():
    teacher, student = _logprobs(0), _logprobs(1)
    adv = algos.teacher_advantages(teacher, student, MASK)
    assert torch.equal(adv[MASK.bool()], (teacher - student)[MASK.bool()])
    assert torch.all(adv[~MASK.bool()] == 0)  # the prompt, the observations and padding carry no signal


def test_the_env_advantage_mixes_in_at_its_weight_and_not_at_weight_0():
    teacher, student, env = _logprobs(0), _logprobs(1), torch.full((3, 5), 2.0)
    alone = algos.teacher_advantages(teacher, student, MASK)
    assert torch.equal(algos.teacher_advantages(teacher, student, MASK, env_advantages=env, reward_weight=0.0), alone)
    mixed = algos.teacher_advantages(teacher, student, MASK, env_advantages=env, reward_weight=0.25)
    assert torch.allclose(mixed, alone + 0.5 * MASK)


def test_a_teacher_that_is_the_student_gives_no_signal_and_no_gradient_flows_through_the_ratio():
    student = _logprobs(1).requires_grad_()
    adv = algos.teacher_advantages(student.detach().clone(), student, MASK)
    assert torch.all(adv == 0) and not adv.requires_grad
    assert algos.reverse_kl_sums(student.detach(), student.detach(), MASK) == (0.0, 6.0)


def test_the_reverse_kl_is_the_students_minus_the_teachers_log_prob_over_its_tokens():
    teacher, student = _logprobs(0), _logprobs(1)
    total, n = algos.reverse_kl_sums(teacher, student, MASK)
    assert n == 6.0 and total == pytest.approx(float((student - teacher)[MASK.bool()].sum()), abs=1e-5)
    # its mean is minus the advantage's: descending the policy gradient of the advantage lowers KL(student||teacher)
    assert total == pytest.approx(-float(algos.teacher_advantages(teacher, student, MASK).sum()), abs=1e-5)


def test_a_teacher_is_the_switch_and_a_group_is_needed_only_for_the_env_reward():
    with pytest.raises(preflight.UsageError, match="--algo distill needs --distill.teacher"):
        parse_args(["--algo", "distill"], console=False)
    # the teacher's two spellings set the one field; over another algorithm's estimator it distils too
    for flag in (["--teacher.path", "tiny"], ["--teacher.path=tiny"], ["--distill.teacher", "tiny"]):
        cfg = parse_args(["--algo", "rloo", *flag], console=False)
        assert cfg.distill.teacher == "tiny" and cfg.distill.on and cfg.algorithm.adv_estimator == "rloo"
    assert not parse_args([], console=False).distill.on
    with pytest.raises(preflight.UsageError, match="--algo sft plays the expert's"):
        parse_args(["--algo", "sft", "--teacher.path", "tiny"], console=False)
    with pytest.raises(preflight.UsageError, match="--distill.reward-weight must be >= 0"):
        parse_args(["--algo", "distill", "--teacher.path", "tiny", "--distill.reward-weight", "-1"], console=False)
    alone = ["--algo", "distill", "--teacher.path", "tiny", "--rollout.group-size", "1"]
    assert parse_args(alone, console=False).rollout.group_size == 1  # no group baseline to compute
    with pytest.raises(preflight.UsageError, match="--rollout.group-size must be >= 2"):
        parse_args([*alone, "--distill.reward-weight", "0.5"], console=False)  # GRPO's on the env's reward


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    def cfg(teacher):
        run = str(tmp_path / "run")
        return parse_args(["--preset", "smoke", "--algo", "distill", "--teacher.path", teacher, "--log.run-dir", run])

    # tiny-agent's tokenizer was trained on the agent envs' text: the same size, other ids
    with pytest.raises(
        preflight.UsageError, match=r"--distill.teacher tiny-agent: its tokenizer is not the student's"
    ) as e:
        preflight.check(cfg("tiny-agent"), world=1)
    assert "\n" not in str(e.value)
    with pytest.raises(preflight.UsageError, match=r"--distill.teacher /nonexistent: no such directory"):
        preflight.check(cfg("/nonexistent"), world=1)
    preflight.check(cfg("tiny-tool"), world=1)  # another model, the same tokenizer: a teacher
