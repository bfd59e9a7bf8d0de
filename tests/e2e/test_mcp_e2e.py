"""`--env mcp_sqlite` in a real 2-rank run (torchrun, vLLM, FSDP2 over gloo): the shop questions through the real
`mcp-server-sqlite`, each episode on its own copy of the database. SFT on the expert's episodes (its `read_query`
run by the server, its answer scored by the env), then a GRPO step from that model samples its own calls."""

import json

from spawn import scalars, torchrun

BASE = ["--env", "mcp_sqlite", "--env-kwargs.tools", "read_query", "--model.path", "tiny-tool", "--precision", "fp32"]
BASE += ["--rollout.max-new-tokens", "64", "--rollout.max-total-tokens", "512", "--engine.max-model-len", "512"]
BASE += ["--log.ckpt-every", "0"]
BASE += ["--eval.every", "0", "--eval.limit", "2", "--log.no-tqdm"]


def test_the_sqlite_mcp_task_trains_with_calls_run_by_the_real_server(tmp_path):
    sft, rl = tmp_path / "sft", tmp_path / "rl"
    args = ["--algo", "sft", "--steps", "2", "--rollout.prompts-per-step", "4", "--optim.lr", "1e-4"]
    r = torchrun([*BASE, *args, "--log.run-dir", str(sft)], timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    a = scalars(str(sft))
    assert [v for _, v in a["train/reward_mean"]] == [1.0, 1.0]  # every demonstration is scored right by the env
    assert all(v == 0 for _, v in a["envs/failed"])
    demos = [json.loads(x) for x in open(sft / "rollouts.jsonl") if '"split": "train"' in x]
    assert len(demos) == 4  # rank 0 logs its half
    for d in demos:
        [tool] = [m for m in d["messages"] if m["role"] == "tool"]
        assert tool["name"] == "read_query" and tool["content"].startswith("[{'")  # the server's own reply format
        assert d["messages"][-1]["content"] == f"<answer>{d['info']['answer']}</answer>" and d["reward"] == 1.0
    args = ["--algo", "grpo", "--model.path", str(sft), "--steps", "1", "--rollout.prompts-per-step", "2"]
    args += ["--rollout.group-size", "4", "--optim.no-skip-zero-adv"]
    r = torchrun([*BASE, *args, "--log.run-dir", str(rl)], timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    b = scalars(str(rl))
    assert [st for st, _ in b["train/pg_loss"]] == [1] and b["envs/failed"] == [(1, 0.0)]
    sampled = [json.loads(x) for x in open(rl / "rollouts.jsonl") if '"split": "train"' in x]
    assert len(sampled) == 4 and all(s["prompt_len"] > 150 for s in sampled)  # the server's tools were in the prompt
