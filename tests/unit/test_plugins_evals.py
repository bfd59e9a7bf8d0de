"""`--plugins` on the eval CLIs (evals/common.py): a user's env, registered in their module, becomes an `--env` the
evals can play; a missing module is one line."""

import textwrap

import pytest
import tyro

import envs
from evals.agent import AgentEvalConfig
from evals.math import MathEvalConfig

PLUGIN = textwrap.dedent(
    """
    import envs
    from envs.text_math import TextMathEnv


    @envs.register_env("user_math_for_evals")
    def make(split="test", seed=0, **kwargs):
        return TextMathEnv(split=split, seed=seed, **kwargs)
    """
)


def test_an_eval_imports_the_users_module_first_so_their_env_is_registered(tmp_path, monkeypatch):
    (tmp_path / "user_env_mod.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "user_math_for_evals" not in envs.env_names()
    cfg = tyro.cli(AgentEvalConfig, args=["--plugins", "user_env_mod", "--env", "user_math_for_evals"])
    assert cfg.plugins == ["user_env_mod"] and "user_math_for_evals" in envs.env_names()
    assert envs.make("user_math_for_evals", split="test", seed=3).reset()  # a real episode of the user's env


def test_a_missing_plugin_is_one_line_on_every_eval_cli(capsys):
    for config in (AgentEvalConfig, MathEvalConfig):
        with pytest.raises(SystemExit, match=r"--plugins no_such_user_mod: no module named 'no_such_user_mod'"):
            tyro.cli(config, args=["--plugins", "no_such_user_mod"])
