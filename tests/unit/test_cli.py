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
