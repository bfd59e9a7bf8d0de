"""`--env openenv` in real 2-rank runs (torchrun, vLLM, FSDP2 over gloo): an OpenEnv environment defined in the tests
(tests/scripts/openenv_toy.py, served by openenv-core's `create_app`, started by nanosky in each env worker) trains 2
steps, every reward the env's own; resumed from step 1's checkpoint into a fresh run dir, step 2 is the straight
run's exactly (issue 73)."""

import importlib.util
import json
import math
import os

import pytest
from spawn import ROOT, scalars, torchrun

pytest.importorskip("openenv.core", reason="the gyms setup (make install puts openenv-core in)")
TOY = os.path.join("tests", "scripts", "openenv_toy.py")
FLAGS = "--preset smoke --precision fp32 --steps 2 --eval.limit 4 --rollout.prompts-per-step 4 --log.ckpt-every 1"
FLAGS = [*FLAGS.split(), "--env", "openenv", "--env-kwargs.app", f"{TOY}:app", "--rollout.max-total-tokens", "256"]
TAGS = ("train/pg_loss", "train/reward_mean", "train/response_len", "train/grad_norm")


def _rows(run_dir: str, step: int) -> list[dict]:
    rows = [json.loads(x) for x in open(os.path.join(run_dir, "rollouts.jsonl"))]
    return [r for r in rows if r["split"] == "train" and r["step"] == step]


def test_an_openenv_env_trains_on_its_own_rewards_and_resumes_exactly(tmp_path):
    spec = importlib.util.spec_from_file_location("openenv_toy_e2e", os.path.join(ROOT, TOY))
    game = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(game)
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    r = torchrun([*FLAGS, "--log.run-dir", straight])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    a = scalars(straight)
    assert [s for s, _ in a["train/pg_loss"]] == [1, 2] and all(math.isfinite(v) for _, v in a["train/pg_loss"])
    assert all(v == 0 for _, v in a["envs/failed"]) and "env/openenv/return" in a
    rows = _rows(straight, 1) + _rows(straight, 2)
    assert rows and sum(r["turns"] >= 2 for r in rows) >= len(rows) // 2  # multi-turn: the hint came back
    for row in rows:  # each turn's reward is what the server's env paid for that reply
        digit = game.digit_of(row["env_seed"])
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert row["turn_rewards"] == pytest.approx([game.score(x.strip(), digit) for x in replies]), row
        assert row["reward"] == pytest.approx(sum(row["turn_rewards"]))
    assert any(r["reward"] > 0 for r in rows)  # a signal to train on, not zeros however the path is cut
    ckpt = os.path.join(straight, "checkpoints", "step_000001")
    r = torchrun([*FLAGS, "--log.run-dir", resumed, "--resume", ckpt])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    b = scalars(resumed)
    assert [s for s, _ in b["train/pg_loss"]] == [2]
    for tag in TAGS:
        assert math.isclose(a[tag][1][1], b[tag][0][1], rel_tol=1e-5, abs_tol=1e-7), (tag, a[tag], b[tag])
    same = [(r["messages"], r["reward"]) for r in _rows(straight, 2)]
    assert same == [(r["messages"], r["reward"]) for r in _rows(resumed, 2)]
