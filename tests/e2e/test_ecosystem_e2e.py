"""The ecosystem's envs in real 2-rank runs (torchrun, vLLM, FSDP2 over gloo): `dataset` on a verl parquet file
(math reward, GRPO), `skyrl_gym` on SkyRL rows of its multi-turn GSM8K env (DAPO), `textarena` step-wise (GiGPO),
each 2 steps and then resumed from step 1's checkpoint into a fresh run dir, where step 2 must be the straight run's
exactly; and
`reasoning_gym` on two tasks at once through the endpoint with the OpenAI Agents SDK example agent."""

import json
import math
import os

import pytest
from spawn import scalars, torchrun

pytest.importorskip("datasets", reason="the gyms extra (make test installs it)")
pd = pytest.importorskip("pandas")
# fp32: the engine-trainer agreement is asserted (bf16: tests/e2e/test_precision_e2e.py)
BASE = "--preset smoke --precision fp32 --steps 2 --eval.limit 4 --rollout.prompts-per-step 4".split()
TAGS = ("train/pg_loss", "train/reward_mean", "train/response_len", "train/grad_norm")


def _verl(tmp_path) -> list[str]:
    from envs.text_math import SYSTEM_PROMPT, train_problem

    rows = [
        {
            "data_source": "text_math",
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": (p := train_problem(s)).question},
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": p.answer},
            "extra_info": {"index": s},
        }
        for s in range(200)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    return ["--env", "dataset", "--env-data", str(tmp_path / "train.parquet")]


def _skyrl(tmp_path) -> list[str]:
    rows = [
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}? End with #### N"}],
            "env_class": "gsm8k_multi_turn",
            "reward_spec": {"method": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i, "max_turns": 3},
        }
        for i in range(60)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "skyrl.parquet")
    return [
        "--env",
        "skyrl_gym",
        "--env-data",
        str(tmp_path / "skyrl.parquet"),
        "--algo",
        "dapo",
        "--algorithm.overlong-cache-len",
        "8",
    ]


def _textarena(tmp_path) -> list[str]:
    return [
        "--env",
        "textarena",
        "--env-kwargs.game",
        "GuessTheNumber-v0",
        "--rollout.mode",
        "stepwise",
        "--algo",
        "gigpo",
        "--rollout.history-window",
        "1",
        "--rollout.max-turns",
        "4",
        "--rollout.max-total-tokens",
        "512",
    ]


def _samples(run_dir: str, step: int) -> list:
    rows = [json.loads(x) for x in open(os.path.join(run_dir, "rollouts.jsonl"))]
    return [(r["messages"], r["reward"]) for r in rows if r["split"] == "train" and r["step"] == step]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "turns", "env_tag"),
    [
        (_verl, 1, None),
        (_skyrl, 2, "env/gsm8k_multi_turn/avg_steps"),
        (_textarena, 2, "env/turns"),
    ],
)
def test_two_steps_then_resumed_exactly(tmp_path, source, turns, env_tag):
    flags = [*BASE, *source(tmp_path), "--log.ckpt-every", "1"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    r = torchrun([*flags, "--log.run-dir", straight])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    a = scalars(straight)
    assert [s for s, _ in a["train/pg_loss"]] == [1, 2] and all(math.isfinite(v) for _, v in a["train/pg_loss"])
    assert a["rollout/turns_mean"][0][1] >= turns  # multi-turn sources really played several turns
    assert env_tag is None or env_tag in a  # the env's own metrics reach TensorBoard
    ckpt = os.path.join(straight, "checkpoints", "step_000001")
    r = torchrun([*flags, "--log.run-dir", resumed, "--resume", ckpt])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    b = scalars(resumed)
    assert [s for s, _ in b["train/pg_loss"]] == [2]
    for tag in TAGS:
        assert math.isclose(a[tag][1][1], b[tag][0][1], rel_tol=1e-5, abs_tol=1e-7), (tag, a[tag], b[tag])
    assert _samples(straight, 2) == _samples(resumed, 2) and _samples(resumed, 2)


@pytest.mark.slow
def test_reasoning_gym_two_tasks_through_the_endpoint_with_an_agents_sdk_agent(tmp_path):
    pytest.importorskip("agents")
    run_dir = str(tmp_path / "rg")
    flags = [
        "--env",
        "reasoning_gym",
        "--env-kwargs.tasks",
        "basic_arithmetic,chain_sum",
        "--env-kwargs.config",
        '{"basic_arithmetic": {"max_terms": 2, "max_digits": 1}}',
        "--rollout.agent",
        "examples.openai_agents_tool_use:solve",
        "--rollout.max-total-tokens",
        "400",
        "--optim.no-skip-zero-adv",  # every row scored: the mismatch is measured even where no reward differs
    ]
    r = torchrun([*BASE, *flags, "--log.run-dir", run_dir])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(run_dir)
    assert all(v >= 1 for _, v in s["agent/calls_per_episode"]) and all(v == 0 for _, v in s["agent/errors"])
    for task in (
        "basic_arithmetic",
        "chain_sum",
    ):  # per-task rewards from the env, through the agent's episodes
        assert f"env/{task}/reward" in s and f"env/{task}/success" in s
    assert s["train/mismatch/mismatch_abs_mean"][-1][1] < 1e-3  # trained on the engine's own tokens
    assert [st for st, _ in s["eval/accuracy"]] == [0, 2]
