"""A user's own loss and advantage estimator, registered in their module, work from the command line (--plugins)."""

import json
import os
import textwrap

import pytest
from spawn import ROOT, child_env, scalars, torchrun

PLUGIN = textwrap.dedent(
    '''
    """A user's module: a plain policy-gradient loss and an estimator that gives every token advantage 1."""
    import os

    import algos
    from algos.agg import agg_loss


    @algos.register_policy_loss("user_pg")
    def user_pg(log_prob, old_log_prob, advantages, response_mask, cfg, weights=None):
        with open(os.environ["USER_PG_MARKER"], "a") as f:
            f.write("called\\n")
        loss = agg_loss(-advantages * log_prob, response_mask, cfg.loss_agg_mode, cfg.norm_const)
        return loss, {"clip_frac": 0.0}


    @algos.register_adv_estimator("all_ones")
    def all_ones(token_rewards, response_mask, group_index, values=None, gamma=1.0, lam=1.0):
        return response_mask.float(), token_rewards
    '''
)


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "user_algo.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_plugins_flag_makes_registered_names_valid(plugin_dir, monkeypatch):
    from nanosky.cli import parse_args

    monkeypatch.setenv("USER_PG_MARKER", str(plugin_dir / "marker"))
    args = ["--algorithm.policy-loss", "user_pg", "--algorithm.adv-estimator", "all_ones"]
    cfg = parse_args(["--plugins", "user_algo", *args], console=False)
    assert cfg.plugins == ["user_algo"] and cfg.algorithm.policy_loss == "user_pg"
    assert cfg.algorithm.adv_estimator == "all_ones" and not cfg.algorithm.needs_critic


def test_user_loss_and_estimator_train_from_the_cli(plugin_dir, tmp_path):
    """Two ranks, one step: the user's loss runs on every micro-batch and the user's advantages (all 1) reach the
    update, through the batch-wide path (a user estimator is not declared per-group, so ranks gather)."""
    env = child_env() | {
        "PYTHONPATH": f"{plugin_dir}{os.pathsep}{ROOT}",
        "USER_PG_MARKER": str(tmp_path / "marker"),
    }
    run_dir = tmp_path / "run"
    args = ["--preset", "smoke", "--steps", "1", "--log.run-dir", str(run_dir), "--eval.limit", "2"]
    args += [
        "--plugins",
        "user_algo",
        "--algorithm.policy-loss",
        "user_pg",
        "--algorithm.adv-estimator",
        "all_ones",
    ]
    r = torchrun(args, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    calls = (tmp_path / "marker").read_text().split()
    assert len(calls) >= 2  # one per micro-batch, on each rank
    assert scalars(str(run_dir))["train/adv_mean"][-1][1] == pytest.approx(1.0)
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["plugins"] == ["user_algo"] and saved["algorithm"]["policy_loss"] == "user_pg"
