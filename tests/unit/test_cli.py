"""run.py's flags (nanosky.cli.parse_args): env kwargs merged over a preset's, in both spellings."""

import pytest

from nanosky.cli import parse_args


def _kw(*flags):
    return parse_args(list(flags), console=False).env_kwargs


def test_env_kwargs_new_keys_on_a_preset_that_sets_some():
    # tool_use's preset sets "kinds"; a key it does not set was refused before (tyro's per-key flags)
    kw = _kw("--preset", "tool_use", "--env-kwargs.format-reward", "0", "--steps", "3")
    assert kw == {"kinds": '["arith", "python"]', "format_reward": "0"}
    kw = _kw("--preset", "tool_use", "--env-kwargs", "format_needs_tool", "false", "kinds", '["python"]')
    assert kw == {"kinds": '["python"]', "format_needs_tool": "false"}
    assert _kw("--preset", "tool_use", "--env-kwargs.kinds=[1]") == {"kinds": "[1]"}


def test_env_kwargs_without_a_preset_and_the_other_flags_still_parse():
    cfg = parse_args(["--env", "math", "--env-kwargs", "kinds", '["logic"]', "--steps", "7"], console=False)
    assert cfg.env_kwargs == {"kinds": '["logic"]'} and cfg.steps == 7
    assert cfg.env_args() == {"kinds": ["logic"]}  # values are parsed as JSON when they are JSON
    # the agent presets keep their kwargs, and the later of two spellings of one key wins
    kw = _kw(
        "--env",
        "alfworld_lite",
        "--env-kwargs.progress-reward",
        "0.2",
        "--env-kwargs",
        "progress_reward",
        "0.3",
    )
    assert kw["progress_reward"] == "0.3" and kw["show_actions"] == "true"


@pytest.mark.parametrize(
    "flags, match",
    [(["--env-kwargs", "kinds"], "KEY VALUE pairs"), (["--env-kwargs.kinds"], "needs a value")],
)
def test_env_kwargs_malformed(flags, match):
    with pytest.raises(SystemExit, match=match):
        parse_args(["--env", "math", *flags], console=False)


@pytest.mark.parametrize(
    "old, new",
    [
        (["--algorithm.rollout-correction-level", "token"], "--algorithm.rollout-correction tis|mis|seq-tis"),
        (["--algorithm.rollout_correction_mode=mask"], "--algorithm.rollout-correction tis|mis|seq-tis"),
        (["--algorithm.rollout-correction-threshold", "3"], "--algorithm.rollout-is-cap"),
    ],
)
def test_the_old_correction_flags_are_refused_naming_the_one_flag(old, new):
    """Issue 62 item 4: one name-valued flag and one cap; the fine-grained spellings fail with the new name."""
    with pytest.raises(SystemExit, match=new.replace("|", r"\|")):
        parse_args(["--env", "math", *old], console=False)
    cfg = parse_args(["--algorithm.rollout-correction", "seq-mis", "--algorithm.rollout-is-cap", "3"], console=False)
    assert (cfg.algorithm.rollout_correction, cfg.algorithm.rollout_is_cap) == ("seq-mis", 3.0)
