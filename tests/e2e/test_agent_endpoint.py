"""2-rank training runs where an external agent plays the episodes through the endpoint (issue 36): the OpenAI
Agents SDK example under GiGPO with the eval during training, a harness whose edited history gives two segments
per episode (step-wise rows), and a command agent (`--rollout.agent-cmd`) with LoRA, checkpoints and a resume."""

import json
import math
import os
import sys

import pytest
from spawn import scalars, torchrun

# fp32: these runs assert the fp32 engine-trainer agreement (bf16: tests/e2e/test_precision_e2e.py)
# every row forwarded, zero-advantage ones too: the engine-trainer agreement is measured even where no reward
# differs within a group (a skipped row is never scored; its metrics are then absent)
SMALL = [
    "--optim.no-skip-zero-adv",
    "--engine.kv-cache-gib",
    "0.25",
    "--precision",
    "fp32",
    "--preset",
    "tool_use",
    "--rollout.prompts-per-step",
    "4",
    "--rollout.group-size",
    "4",
    "--eval.limit",
    "8",
    "--eval.n-samples",
    "1",
]


def _records(run_dir: str) -> list[dict]:
    return [json.loads(x) for x in open(os.path.join(run_dir, "rollouts.jsonl"))]


@pytest.mark.slow
def test_an_agents_sdk_harness_trains_under_gigpo_with_evals(tmp_path):
    pytest.importorskip("agents")
    run_dir = str(tmp_path / "sdk")
    agent = ["--rollout.agent", "examples.openai_agents_tool_use:solve", "--algo", "gigpo"]
    r = torchrun([*SMALL, *agent, "--steps", "2", "--eval.every", "1", "--log.run-dir", run_dir])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(run_dir)
    assert [st for st, _ in s["agent/calls_per_episode"]] == [1, 2]
    assert all(v >= 1 for _, v in s["agent/calls_per_episode"])
    assert all(v == 1 for _, v in s["agent/segments_per_episode"])  # the SDK's history is append-only
    assert all(v == 0 for tag in ("agent/errors", "agent/timeouts") for _, v in s[tag])
    assert "gigpo/anchor_size_mean" in s and all(math.isfinite(v) for _, v in s["train/pg_loss"])
    assert [st for st, _ in s["eval/accuracy"]] == [0, 1, 2]  # the eval runs the agent too
    assert all(v < 1e-3 for _, v in s["train/mismatch/mismatch_abs_mean"])  # trained on the engine's own tokens
    recs = _records(run_dir)
    train = [x for x in recs if x.get("split") != "eval"]
    assert train and all(x["info"]["agent"]["calls"] >= 1 for x in train)
    assert any(m.get("tool_calls") for x in train for m in x["messages"])  # the SDK called tools


@pytest.mark.slow
def test_an_edited_history_trains_as_stepwise_rows(tmp_path):
    run_dir = str(tmp_path / "edit")
    agent = ["--rollout.agent", "tests.scripts.edit_agent:solve", "--eval.every", "0", "--eval.limit", "2"]
    r = torchrun([*SMALL, *agent, "--steps", "1", "--log.run-dir", run_dir])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(run_dir)
    assert s["agent/segments_per_episode"] == [(1, 2.0)] and s["agent/calls_per_episode"] == [(1, 2.0)]
    assert math.isfinite(s["train/pg_loss"][0][1]) and s["train/mismatch/mismatch_abs_mean"][0][1] < 1e-3


@pytest.mark.slow
def test_a_command_agent_trains_with_lora_and_resumes(tmp_path):
    run_dir = str(tmp_path / "cmd")
    cmd = [
        "--rollout.agent-cmd",
        f"{sys.executable} examples/http_agent.py",
        "--lora.rank",
        "8",
        "--eval.every",
        "0",
        "--log.ckpt-every",
        "1",
        "--log.run-dir",
        run_dir,
    ]
    r = torchrun([*SMALL, *cmd, "--steps", "1"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    r = torchrun([*SMALL, *cmd, "--steps", "2", "--resume", "latest"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(run_dir)
    assert [st for st, _ in s["agent/calls_per_episode"]] == [1, 2]
    assert all(v == 0 for _, v in s["agent/errors"])
    assert os.path.isdir(os.path.join(run_dir, "checkpoints", "step_000002", "export", "adapter"))
    assert not os.path.exists(os.path.join(run_dir, "agent_errors.rank0.log"))
