"""The harness runner (nanosky/endpoint/harness.py): external agents, async, blocking and as commands, play tool_use
episodes through the endpoint over a scripted engine that writes the env's expert turns (the real engine is in
tests/integration/test_endpoint_engine.py). Rewards, rows, masking of failed episodes, timeouts, 410 after the
episode, the error log, the agent/* metrics, and the bound on episodes at once (--rollout.agent-concurrency)."""

import asyncio
import json
import sys
import textwrap
import time

import openai
import pytest

import envs
from examples.mirror_agent import solve as mirror
from nanosky.agent import EnvTask, GenerationResult
from nanosky.bundled import resolve_model_path
from nanosky.endpoint.command import reward_line
from nanosky.endpoint.harness import AgentError, Harness, load_agent, metrics
from nanosky.endpoint.server import Sampling
from nanosky.rollout.chat import encode, load_tokenizer

SEEDS = [0, 1, 2, 3]


class Expert:
    """The engine side: answers each tool_use conversation with the env's expert turn for it."""

    def __init__(self, tok, seeds):
        self.tok, self.requests = tok, []
        self.turns = {}
        for s in seeds:
            conv = envs.make("tool_use", split="train", seed=s).expert_conversation()
            self.turns[conv[1]["content"]] = [m["content"] for m in conv if m["role"] == "assistant"]

    async def generate(self, req):
        self.requests.append(req)
        await asyncio.sleep(0)
        prompt = self.tok.decode(req.prompt_ids)
        question = next(q for q in self.turns if q in prompt)
        turns = self.turns[question]
        text = turns[min(prompt.count("<tool_response>"), len(turns) - 1)]
        ids = encode(self.tok, text) + [self.tok.eos_token_id]
        return GenerationResult(text, ids, [-0.5] * len(ids), "stop", len(req.prompt_ids), len(ids))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("tiny-tool"))


@pytest.fixture
def host(tok):
    """Makes harnesses over the expert engine side; closes them (their endpoints and loops) after the test."""
    made = []

    def make(agent=None, cmd=None, timeout_s=30.0, log_dir=None, seeds=SEEDS, concurrency=32):
        h = Harness(
            Expert(tok, seeds),
            tok,
            Sampling(max_tokens=64, max_total_tokens=1024),
            agent=agent,
            cmd=cmd,
            timeout_s=timeout_s,
            log_dir=log_dir,
            concurrency=concurrency,
        )
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def _tasks(seeds=SEEDS):
    return [EnvTask.make("tool_use", "train", seed=s) for s in seeds]


def _run(host, tok, agent=None, cmd=None, timeout_s=30.0, log_dir=None, seeds=SEEDS):
    h = host(agent, cmd, timeout_s, log_dir, seeds)
    trajs = h.run(_tasks(seeds), groups=[0, 0, 1, 1][: len(seeds)], seeds=seeds, sample_seed=5)
    return h, trajs


def test_an_async_sdk_agent_earns_the_envs_rewards_on_one_row_of_sampled_ids(host, tok):
    _, trajs = _run(host, tok, mirror)
    for t in trajs:
        assert t.stop_reason == "done" and t.reward == 1.0 and t.success
        assert t.info["agent"]["segments"] == 1 and t.turns == t.info["agent"]["calls"] == 2
        # one row: the prompt, each call's sampled ids (mask 1, the engine's logprobs), the tool output (mask 0)
        sampled = [lp for lp, m in zip(t.logprobs, t.loss_mask) if m]
        assert sampled and set(sampled) == {-0.5} and len(t.steps) == 1
        assert tok.decode(t.ids).count("<tool_response>") == 1
    m = metrics(trajs)
    assert m["agent/calls_per_episode"] == 2 and m["agent/segments_per_episode"] == 1
    assert m["agent/errors"] == m["agent/timeouts"] == 0


def test_a_blocking_agent_runs_in_a_thread_and_none_means_the_env_grades(host, tok):
    def solve(client, task):  # a plain blocking client loop that never calls grade
        assert isinstance(client, openai.OpenAI)
        msgs = list(task.messages)
        r = client.chat.completions.create(model="x", messages=msgs, tools=task.tools)
        call = r.choices[0].message.tool_calls[0]
        out = task.step(
            f'<tool_call>{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}</tool_call>'
        )
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {**out.observations[0], "tool_call_id": call.id},
        ]
        client.chat.completions.create(model="x", messages=msgs, tools=task.tools)
        return None

    _, trajs = _run(host, tok, solve)
    assert [t.reward for t in trajs] == [1.0] * 4 and all(t.info["agent"]["segments"] == 1 for t in trajs)


def test_a_raising_agent_costs_its_episode_only_masked_and_logged(host, tok, tmp_path):
    async def solve(client, task):
        await client.chat.completions.create(model="x", messages=task.messages, tools=task.tools)
        if task.seed == 2:
            raise RuntimeError("my harness broke")
        return 0.0 if task.seed == 3 else 1.0

    h, trajs = _run(host, tok, solve, log_dir=str(tmp_path))
    bad = trajs[2]
    assert bad.stop_reason == "error" and "my harness broke" in bad.error
    assert sum(bad.loss_mask) == 0 and all(sum(s.loss_mask) == 0 for s in bad.steps)
    assert bad.reward == trajs[3].reward == 0.0  # its group's mean over the episodes that did not fail
    assert [t.stop_reason for t in trajs] == ["done", "done", "error", "done"] and trajs[0].reward == 1.0
    log = (tmp_path / "agent_errors.rank0.log").read_text()
    assert "Traceback" in log and "my harness broke" in log and "tool_use/train/2" in log
    assert metrics(trajs)["agent/errors"] == 1


def test_an_agent_out_of_token_budget_is_a_truncated_episode_not_an_error(tok, tmp_path):
    """An agent that never checks its budget (LangGraph raises on the endpoint's 400) ran out of
    --rollout.max-total-tokens, it did not fail: its episode is truncated (stop_reason "length"), its segments are
    trained, and its last reply is graded, as when an agent returns None. agent/errors stays for real failures."""

    async def solve(client, task):
        msgs = list(task.messages)
        r = await client.chat.completions.create(model="x", messages=msgs, tools=task.tools)
        call = r.choices[0].message.tool_calls[0]
        out = await task.step(
            f'<tool_call>{{"name": "{call.function.name}", "arguments": {call.function.arguments}}}</tool_call>'
        )
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {**out.observations[0], "tool_call_id": call.id}]
        while True:  # the expert's final answer, again and again, until the endpoint refuses: its 400 raises
            r = await client.chat.completions.create(model="x", messages=msgs, tools=task.tools)
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]

    h = Harness(
        Expert(tok, SEEDS), tok, Sampling(max_tokens=64, max_total_tokens=700), agent=solve, log_dir=str(tmp_path)
    )
    try:
        trajs = h.run(_tasks(), groups=[0, 0, 1, 1], seeds=SEEDS, sample_seed=5)
    finally:
        h.close()
    for t in trajs:
        assert t.stop_reason == "length" and t.error == "", (t.stop_reason, t.error)
        assert t.reward == 1.0 and t.success  # the last reply (the expert's answer) graded
        assert sum(t.loss_mask) > 0 and t.info["agent"]["calls"] >= 3  # its segments are trained
    m = metrics(trajs)
    assert m["agent/errors"] == 0 and m["agent/truncated"] == 4
    assert not (tmp_path / "agent_errors.rank0.log").exists()
    assert metrics([]) == {}  # no episodes: no agent/* scalars, not zeros


def test_a_hanging_agent_times_out_and_its_late_call_gets_410(host, tok, tmp_path):
    late = []

    def solve(client, task):  # blocking: the thread outlives the episode
        if task.seed == 1:
            time.sleep(1.5)
            try:
                client.chat.completions.create(model="x", messages=task.messages)
            except openai.APIStatusError as e:
                late.append(e.status_code)
            return 1.0
        return 0.5

    t0 = time.perf_counter()
    h, trajs = _run(host, tok, solve, timeout_s=0.5, log_dir=str(tmp_path))
    assert time.perf_counter() - t0 < 1.5  # the step did not wait for the hung agent
    assert trajs[1].stop_reason == "timeout" and trajs[1].reward == 0.5 and "agent-timeout-s" in trajs[1].error
    assert metrics(trajs)["agent/timeouts"] == 1

    async def next_phase():  # between phases the rank's loop is still; the late call is answered when it runs
        for _ in range(50):
            if late:
                return
            await asyncio.sleep(0.1)

    h._loop.run(next_phase())
    assert late == [410]


def test_a_command_agent_reads_its_task_and_reports_a_reward(host, tok, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(
        textwrap.dedent("""
        import json, os, sys, openai
        task = json.load(open(os.environ["NANOSKY_TASK"]))
        if task["seed"] == 3:
            print("no luck today", file=sys.stderr)
            sys.exit(3)
        r = openai.OpenAI().chat.completions.create(model="x", messages=task["messages"], tools=task["tools"])
        print("a log line the harness prints")
        print(json.dumps({"reward": 0.25 if r.choices[0].message.tool_calls else -1.0}))
    """)
    )
    _, trajs = _run(host, tok, cmd=f"{sys.executable} {script}", log_dir=str(tmp_path))
    assert [t.reward for t in trajs[:3]] == [0.25] * 3 and trajs[0].info["agent"]["calls"] == 1
    assert trajs[3].stop_reason == "error" and "status 3" in trajs[3].error and "no luck today" in trajs[3].error


def test_reward_lines_and_agent_specs():
    assert reward_line('x\n{"reward": 0.5}\n\n') == 0.5
    assert reward_line('{"reward": 1}\nlast words') is None and reward_line("") is None
    assert reward_line('{"reward": true}') is None
    assert json.dumps(load_agent("examples.mirror_agent:solve").__name__) == '"solve"'
    for spec, why in [
        ("nope", "MODULE:FUNCTION"),
        ("no_such_mod:f", "no module"),
        ("examples.mirror_agent:nope", "has no"),
    ]:
        with pytest.raises(AgentError, match=why):
            load_agent(spec)


def test_at_most_agent_concurrency_command_agents_are_alive_and_all_200_finish(host, tok, tmp_path):
    """The LangGraph run that started 408 processes at once: now `concurrency` episodes run, the rest queue."""
    live, seen = tmp_path / "live", tmp_path / "seen"
    live.mkdir()
    # each agent process marks itself alive, counts the marks, and removes its own before it exits
    cmd = f"touch {live}/$$; ls {live} | wc -l >> {seen}; sleep 0.05; rm {live}/$$; echo '{{\"reward\": 1}}'"
    seeds = list(range(200))
    h = host(cmd=cmd, seeds=[], concurrency=8)
    trajs = h.run([EnvTask.make("tool_use", "train", seed=s) for s in seeds], seeds=seeds)
    assert [t.stop_reason for t in trajs] == ["done"] * 200 and all(t.reward == 1.0 for t in trajs)
    counts = [int(x) for x in seen.read_text().split()]
    assert len(counts) == 200 and max(counts) <= 8 and h.peak == 8
    assert max(counts) > 1  # and they did run side by side


def test_an_episodes_timeout_counts_from_its_start_not_its_wait_in_the_queue(host, tok):
    async def solve(client, task):
        await asyncio.sleep(0.4)
        return 1.0

    h = host(solve, timeout_s=0.7, concurrency=1)
    t0 = time.perf_counter()
    trajs = h.run(_tasks(SEEDS[:3]), seeds=SEEDS[:3])
    assert time.perf_counter() - t0 >= 1.2  # one at a time
    assert [t.stop_reason for t in trajs] == ["done"] * 3 and h.peak == 1
