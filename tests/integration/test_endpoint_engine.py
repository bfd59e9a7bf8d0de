"""The endpoint over the real colocated engine (vLLM) and the bundled tool model: an openai-SDK agent that mirrors
nanosky's loop builds, at temperature 0, the same token ids, masks and rewards as the loop itself; the OpenAI
Agents SDK example runs through it as one chain of engine-sampled ids per episode."""

import json
import subprocess
import sys

import pytest
from cpu import FP32
from spawn import ROOT, child_env

from examples.mirror_agent import solve as mirror
from nanosky.agent import AgentRunner, EngineBackend, EnvTask
from nanosky.bundled import resolve_model_path
from nanosky.endpoint.harness import Harness
from nanosky.endpoint.server import Sampling
from nanosky.rollout.chat import load_tokenizer

SEEDS = list(range(12))
MAX_NEW, MAX_TOTAL = 64, 480  # the tool_use preset's budgets


# session scope: a vLLM engine torn down mid-session takes vLLM's process-wide parallel state with it, and the
# session's other engine (conftest's `engine`) stops working
@pytest.fixture(scope="session")
def tool_model(dist_info):
    from nanosky.rollout.engine import Engine, EngineConfig

    path = resolve_model_path("tiny-tool")
    return Engine(EngineConfig(kv_cache_gib=0.25, seed=0), path, dist_info, precision=FP32), load_tokenizer(path)


def _harness(tool_model, agent):
    engine, tok = tool_model
    return Harness(EngineBackend(engine, tok), tok, Sampling(0.0, 1.0, MAX_NEW, MAX_TOTAL), agent=agent, timeout_s=120)


def _tasks():
    return [EnvTask.make("tool_use", "test", seed=s) for s in SEEDS]


def test_a_mirroring_sdk_agent_equals_nanoskys_loop_at_temperature_0(tool_model):
    engine, tok = tool_model
    runner = AgentRunner(
        EngineBackend(engine, tok),
        tok=tok,
        max_parallel_agents=None,
        max_tokens_per_turn=MAX_NEW,
        temperature=0.0,
        max_total_tokens=MAX_TOTAL,
    )
    loop = runner.run(_tasks(), sample_seed=1)
    harness = _harness(tool_model, mirror)
    try:
        ext = harness.run(_tasks(), seeds=SEEDS, sample_seed=2)
    finally:
        harness.close()
    assert sum(t.tool_calls for t in loop) >= 3  # the comparison covers tool-call round trips
    for a, b in zip(loop, ext):
        assert b.stop_reason == "done", b.error
        assert a.ids == b.ids and a.loss_mask == b.loss_mask and a.prompt_len == b.prompt_len
        assert a.reward == b.reward and a.success == b.success and a.turns == b.turns
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        assert b.info["agent"]["segments"] == 1


def test_the_openai_agents_sdk_example_trains_on_one_chain_of_sampled_ids(tool_model):
    pytest.importorskip("agents")
    from examples.openai_agents_tool_use import solve

    harness = _harness(tool_model, solve)
    try:
        trajs = harness.run(_tasks(), seeds=SEEDS, sample_seed=3)
    finally:
        harness.close()
    assert all(t.stop_reason == "done" for t in trajs), [t.error for t in trajs]
    calls = [c["function"]["name"] for t in trajs for m in t.messages for c in m.get("tool_calls") or []]
    assert "calculator" in calls, "the SDK ran no calculator call in any episode"
    ran = [t for t in trajs if any(m.get("role") == "tool" for m in t.messages)]
    assert [t.task_id for t in ran] == [t.task_id for t in trajs if t.tool_calls]  # each call's output went back
    assert all(t.info["env_steps"] == t.tool_calls + 1 for t in ran)  # the calls ran in the env, then the grade
    for t in trajs:
        assert t.info["agent"]["segments"] == 1  # the SDK's history extends the last call append-only
        turns = [m for m in t.messages if m["role"] == "assistant"]
        assert len(turns) == t.info["agent"]["calls"] >= 1
        # every trained id was sampled by the engine: its logprob is the engine's, <= 0; the rest are masked
        assert all(lp < 0 or lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if m)
        assert sum(t.loss_mask) == t.completion_tokens and t.reward in (0.0, 0.1, 1.0)


def test_evals_agent_evaluates_your_agent_on_an_env_like_the_loop_at_temperature_0(tmp_path):
    """`python -m evals.agent --agent MODULE:FN --ckpt ... --env tool_use`: the mirroring agent scores what nanosky's
    loop scores on the same held-out episodes, greedy; a bad --agent is one line before any model loads."""
    base = [
        sys.executable,
        "-m",
        "evals.agent",
        "--ckpt",
        "tiny-tool",
        "--env",
        "tool_use",
        "--limit",
        "6",
        "--max-model-len",
        str(MAX_TOTAL),
        "--max-new-tokens",
        str(MAX_NEW),
    ]
    reports = {}
    for name, extra in (("loop", []), ("agent", ["--agent", "examples.mirror_agent:solve"])):
        r = subprocess.run(
            [*base, *extra, "--out", str(tmp_path / name)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=child_env(),
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())
    loop, agent = reports["loop"], reports["agent"]
    assert agent["n_episodes"] == loop["n_episodes"] == 6 and agent["accuracy"] == loop["accuracy"]
    assert agent["tool_calls_per_example"] == loop["tool_calls_per_example"] > 0
    bad = subprocess.run(
        [*base, "--agent", "no_such_agent:solve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert bad.returncode != 0 and "--agent no_such_agent:solve: no module named" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_an_agents_sdk_agent_with_an_mcp_server_runs_its_calls_on_the_server_and_trains_on_them(tool_model, tmp_path):
    """examples/openai_agents_mcp.py: the SDK's own MCP client starts the server and runs the model's calls there."""
    pytest.importorskip("agents")
    from envs.tool_use import test_tasks
    from examples.openai_agents_mcp import make_solve

    toy = f"{sys.executable} {ROOT}/tests/scripts/mcp_toy_server.py"
    rows, log = tmp_path / "rows.jsonl", tmp_path / "calls.log"
    rows.write_text(
        "".join(json.dumps({"question": q.question, "answer": q.answer}) + "\n" for q in test_tasks(("arith",))[:12])
    )
    kw = {"data_path": str(rows), "test_data": str(rows), "server": toy, "tools": "calculator"}
    harness = _harness(tool_model, make_solve(f"{toy} --calls {log}", tools=["calculator"]))
    try:
        trajs = harness.run([EnvTask.make("mcp", "test", s, **kw) for s in SEEDS], seeds=SEEDS, sample_seed=3)
    finally:
        harness.close()
    assert all(t.stop_reason == "done" for t in trajs), [t.error for t in trajs]
    sent = [
        json.loads(c["function"]["arguments"])["expression"]
        for t in trajs
        for m in t.messages
        for c in m.get("tool_calls") or []
    ]
    assert sent, "the model made no calculator call in any episode"
    # every call the model made ran on the agent's MCP server, once
    assert sorted(log.read_text().splitlines()) == sorted(sent)
    results = [m for t in trajs for m in t.messages if m["role"] == "tool"]
    assert len(results) == len(sent)  # and each result went back to the model
    for t in trajs:
        assert t.info["agent"]["segments"] == 1 and sum(t.loss_mask) == t.completion_tokens > 0
