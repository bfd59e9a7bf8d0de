"""SFT in the same launch (issue 63): `run.py --algo sft` at 2 ranks through torchrun trains on the env's own expert's
episodes (a two-row GSM8K-layout file, so the demonstrations repeat and their NLL must fall), checkpoints, resumes
exactly, and its checkpoint starts an RL run (`--model.path` the SFT run's dir: its latest checkpoint's export)."""

import json
import math
import os
import shutil

from spawn import python, scalars, torchrun

ROWS = [
    {"question": "Ann has 3 apples and buys 4 more. How many apples does she have?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "Bo has 10 pens and gives away 6. How many pens are left?", "answer": "10 - 6 = 4\n#### 4"},
]
ARGS = ["--preset", "smoke", "--algo", "sft", "--precision", "fp32", "--steps", "3", "--log.ckpt-every", "2"]
ARGS += ["--optim.lr", "1e-3", "--eval.limit", "4", "--envpool.workers", "1"]
TAGS = ("train/nll", "train/pg_loss", "train/grad_norm", "train/reward_mean")


def test_sft_trains_on_the_experts_demonstrations_resumes_exactly_and_starts_rl(tmp_path):
    data = tmp_path / "two.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = [*ARGS, "--env-data", str(data)]
    r = torchrun([*args, "--log.run-dir", str(straight)])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "nanosky: sft on math" in r.stdout and "8 prompts x 1 = 8" in r.stdout  # one demonstration a prompt
    a = scalars(str(straight))
    nll = [v for _, v in a["train/nll"]]
    assert [st for st, _ in a["train/nll"]] == [1, 2, 3] and nll[-1] < 0.7 * nll[0], nll  # the demos' NLL falls
    assert all(v == 1.0 for _, v in a["train/reward_mean"])  # every demonstration solves its problem
    rows = [json.loads(x) for x in open(straight / "rollouts.jsonl")]
    trained = [x for x in rows if x["split"] == "train"]
    assert trained and all(
        x["messages"][-1]["content"] in ("3 + 4 = 7\n<answer>7</answer>", "10 - 6 = 4\n<answer>4</answer>")
        for x in trained
    )
    assert all(not math.isnan(v) for _, v in a["eval/accuracy"])  # the evals sample the policy, not the expert

    shutil.copytree(straight / "checkpoints" / "step_000002", resumed / "checkpoints" / "step_000002")
    r = torchrun([*args, "--log.run-dir", str(resumed), "--resume", str(resumed / "checkpoints" / "step_000002")])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    b = scalars(str(resumed))
    for tag in TAGS:
        assert b[tag][-1] == a[tag][-1], (tag, a[tag], b[tag])

    export = straight / "checkpoints" / "step_000003" / "export"  # the run dir names its latest checkpoint's export
    rl = ["--preset", "smoke", "--model.path", str(straight), "--steps", "1"]
    rl += ["--precision", "fp32", "--eval.limit", "4", "--envpool.workers", "0", "--log.run-dir", str(tmp_path / "rl")]
    r = python(rl)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "nanosky: grpo on math" in r.stdout and str(export) in r.stdout
    assert os.path.exists(tmp_path / "rl" / "checkpoints" / "step_000001" / "export" / "model.safetensors")
