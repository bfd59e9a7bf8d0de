"""AgentRunner: tasks → trajectories through the pipelined Dispatcher; EnvTask / PooledEnvTask adapters; failures
cost one trajectory; the engine backend on the real tiny model; the HTTP backend against a real `vllm serve`."""

import asyncio
import json
import time
from pathlib import Path

import helpers_envs  # noqa: F401 - registers "pool_test"
import pytest

import envs
from nanosky.agent import (
    AgentRunner,
    BackendError,
    EngineBackend,
    EnvTask,
    GenerationResult,
    OpenAIBackend,
    PooledEnvTask,
    Request,
    Task,
    load_jsonl,
    save_jsonl,
    summarize,
)
from nanosky.agent.backends import _parse_completion
from nanosky.agent.serve import local_vllm_server
from nanosky.rollout.chat import prompt_ids
from nanosky.rollout.envpool import EnvPool
from nanosky.tiny import ASSET_DIR


def _model_dir() -> str | None:
    """The bundled tiny model; until it is committed, the stand-in at /tmp/tiny_test (same tokenizer format)."""
    if (ASSET_DIR / "model.safetensors").exists():
        from nanosky.tiny import ensure_tiny_model

        return str(ensure_tiny_model())
    return "/tmp/tiny_test" if Path("/tmp/tiny_test/model.safetensors").exists() else None


class ExpertBackend:
    """Answers each tool_use conversation with the env's own scripted expert turn (real tool outputs)."""

    def __init__(self, experts: dict[str, list[dict]], delay_s: float = 0.0, fail_on: str | None = None):
        self.experts, self.delay_s, self.fail_on, self.calls = experts, delay_s, fail_on, 0

    async def aclose(self) -> None:
        pass

    async def generate(self, req: Request) -> GenerationResult:
        messages = req.messages
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        question = messages[1]["content"]
        if question == self.fail_on:
            raise BackendError("server said no")
        expert = self.experts[question]
        assert messages == expert[: len(messages)]  # the runner rebuilt exactly the expert's conversation so far
        text = expert[len(messages)]["content"]
        return GenerationResult(text, None, None, "stop", sum(len(m["content"]) for m in messages), len(text))


class TimedTask(Task):
    """Single-turn task that records when it was initialised, for pipelining checks."""

    max_turns = 1

    def __init__(self, i: int, log: list):
        self.i, self.log, self.task_id = i, log, f"timed/{i}"

    async def initialize_runtime(self):
        t0 = time.monotonic()
        await asyncio.sleep(0.05)
        self.log.append(("initialize", t0, time.monotonic()))

    def get_instruction(self):
        return [{"role": "system", "content": "s"}, {"role": "user", "content": f"task {self.i}"}]

    async def evaluate_result(self, result):
        return {"reward": float(self.i % 2), "success": self.i % 2 == 1}


class SleepBackend:
    def __init__(self, log: list, delay_s: float):
        self.log, self.delay_s = log, delay_s

    async def aclose(self) -> None:
        pass

    async def generate(self, req: Request):
        t0 = time.monotonic()
        await asyncio.sleep(self.delay_s)
        self.log.append(("generate", t0, time.monotonic()))
        return GenerationResult("<answer>1</answer>", None, None, "stop", 10, 3)


def _tool_tasks(n: int) -> tuple[list[EnvTask], dict[str, list[dict]]]:
    tasks = [EnvTask.make("tool_use", "test", seed=s) for s in range(n)]
    return tasks, {
        t.env.task.question: envs.make("tool_use", "test", seed=s).expert_conversation() for s, t in enumerate(tasks)
    }


def test_dispatcher_limits_stages_and_pipelines():
    log: list = []
    runner = AgentRunner(SleepBackend(log, 0.1), max_parallel_agents=4, stage_limits={"initialize": 2})
    t0 = time.monotonic()
    trajs = runner.run([TimedTask(i, log) for i in range(12)])
    elapsed = time.monotonic() - t0
    peak = runner.last_dispatcher.peak
    assert peak["generate"] == 4 and peak["initialize"] == 2  # limits reached, never exceeded
    assert elapsed < 12 * 0.15 * 0.6, elapsed  # far from serial (12 x (0.05 init + 0.1 generate))
    inits = [(a, b) for s, a, b in log if s == "initialize"]
    gens = [(a, b) for s, a, b in log if s == "generate"]
    assert any(a1 < b2 and a2 < b1 for a1, b1 in inits for a2, b2 in gens)  # stages overlap: a pipeline
    assert [t.task_id for t in trajs] == [f"timed/{i}" for i in range(12)]  # results keep task order
    assert [t.reward for t in trajs] == [float(i % 2) for i in range(12)]


def test_max_live_episodes_bounds_the_episodes_in_progress_and_keeps_their_order():
    log: list = []
    runner = AgentRunner(SleepBackend(log, 0.05), max_parallel_agents=None, max_live_episodes=3)
    trajs = runner.run([TimedTask(i, log) for i in range(10)])
    # an episode is in progress from its initialisation's start to its generation's end; the log keeps both in order
    starts = sorted(a for s, a, _ in log if s == "initialize")
    ends = sorted(b for s, _, b in log if s == "generate")
    live = max(sum(a <= t for a in starts) - sum(b < t for b in ends) for t in starts)
    assert live == 3 and runner.last_dispatcher.peak["generate"] == 3
    assert [t.reward for t in trajs] == [float(i % 2) for i in range(10)]


def test_env_task_multi_turn_tool_use_matches_expert():
    tasks, experts = _tool_tasks(4)
    trajs = AgentRunner(ExpertBackend(experts), max_parallel_agents=4).run(tasks)
    for t, task in zip(trajs, tasks):
        expert = experts[task.env.task.question]
        assert t.messages == expert and t.stop_reason == "done", (t.stop_reason, t.error)
        assert t.success and t.reward == 1.0
        assert t.turns == sum(m["role"] == "assistant" for m in expert)
        assert [c["name"] for c in t.info["calls"]] == [name for name, _ in task.env.task.calls]
        assert all(c["ok"] and c["turn"] == 1 for c in t.info["calls"])
    s = summarize(trajs)
    assert s["accuracy"] == 1.0 and s["tool_calls_per_traj"] >= 1 and s["invalid_tool_call_rate"] == 0.0


def test_failures_cost_one_trajectory_each(tmp_path):
    tasks, experts = _tool_tasks(3)

    class RaisingTask(EnvTask):
        async def step(self, action):
            raise RuntimeError("task bug")

    bad_backend_q = tasks[1].env.task.question
    tasks[2] = RaisingTask(tasks[2].env, "raising")
    with EnvPool(n_workers=1, step_timeout_s=5) as pool:
        dying = PooledEnvTask(pool, "pool_test", seed=0)

        class DieBackend(ExpertBackend):
            async def generate(self, req: Request):
                if req.messages[-1]["content"] == "env 0":
                    return GenerationResult("die", None, None, "stop", 1, 1)
                return await super().generate(req)

        trajs = AgentRunner(DieBackend(experts, fail_on=bad_backend_q)).run(tasks + [dying])
        assert pool.stats["failed"] == 1 and pool.stats["worker_restarts"] == 1
    assert [t.stop_reason for t in trajs] == ["done", "backend_error", "error", "env_error"]
    assert trajs[0].success and all(t.reward == 0.0 and not t.success for t in trajs[1:])
    assert "server said no" in trajs[1].error and "task bug" in trajs[2].error and "died" in trajs[3].error
    # JSONL round trip keeps everything, including the failures
    rows = load_jsonl(save_jsonl(trajs, tmp_path / "t.jsonl"))
    assert [r["stop_reason"] for r in rows] == [t.stop_reason for t in trajs]
    assert rows[0]["messages"] == trajs[0].messages and rows[0]["turns"] == trajs[0].turns


def test_turn_and_token_limits():
    class Cut(SleepBackend):
        async def generate(self, req: Request):
            return GenerationResult("no tool, no answer", None, None, self.finish, 10, req.max_tokens)

    for finish, max_turns, want_reason, want_turns in [
        ("stop", 2, "max_turns", 2),
        ("length", 3, "max_tokens", 1),
    ]:
        backend = Cut([], 0)
        backend.finish = finish
        [t] = AgentRunner(backend, max_turns=max_turns, max_tokens_per_turn=7).run([EnvTask.make("tool_use", seed=1)])
        assert (t.stop_reason, t.turns, t.completion_tokens) == (want_reason, want_turns, 7 * want_turns)
        assert t.reward == 0.0 and not t.success  # limits still get evaluated: a wrong/no answer scores 0


def test_task_timeout_ends_only_the_slow_task():
    class Slow(SleepBackend):
        async def generate(self, req: Request):
            await asyncio.sleep(5.0 if req.messages[1]["content"] == "task 0" else 0.0)
            return GenerationResult("<answer>1</answer>", None, None, "stop", 10, 3)

    t0 = time.monotonic()
    trajs = AgentRunner(Slow([], 0), task_timeout_s=0.3).run([TimedTask(i, []) for i in range(3)])
    assert time.monotonic() - t0 < 2.0
    assert [t.stop_reason for t in trajs] == ["timeout", "done", "done"]
    assert [t.reward for t in trajs] == [0.0, 1.0, 0.0]  # a timed-out task is still scored (TimedTask: i % 2)


def test_pooled_env_task_math_through_runner():
    class Solver(SleepBackend):  # answers from the question text (a + b etc.) via the env's own reference
        async def generate(self, req: Request):
            answer = {m["content"]: a for m, a in self.answers}.get(req.messages[1]["content"], "0")
            return GenerationResult(f"<answer>{answer}</answer>", None, None, "stop", 10, 3)

    refs = [envs.make("math", "test", seed=s) for s in range(6)]
    backend = Solver([], 0)
    backend.answers = [(r.reset()[1], r.problem.answer if s % 2 == 0 else "nope") for s, r in enumerate(refs)]
    with EnvPool(n_workers=2, step_timeout_s=10) as pool:
        trajs = AgentRunner(backend).run([PooledEnvTask(pool, "math", "test", seed=s) for s in range(6)])
        assert pool.stats["steps"] == 6
    assert [t.success for t in trajs] == [s % 2 == 0 for s in range(6)]
    assert [t.reward for t in trajs] == [1.0 if s % 2 == 0 else 0.1 for s in range(6)]  # 0.1: well-formed, wrong


def test_parse_completion_turns_structured_tool_calls_into_text():
    data = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5},
    }
    g = _parse_completion(data)
    from envs.tools import parse_tool_calls

    [call] = parse_tool_calls(g.text)
    assert (call.name, call.arguments) == ("calculator", {"expression": "2+2"})
    assert (g.prompt_tokens, g.completion_tokens, g.token_ids, g.logprobs) == (12, 5, None, None)


# ---------------------------------------------------------------------------------------------- real models


def _tool_use_and_math_tasks(n_math: int = 4, n_tool: int = 4) -> list[EnvTask]:
    return [EnvTask.make("math", "test", seed=s) for s in range(n_math)] + [
        EnvTask.make("tool_use", "test", seed=s) for s in range(n_tool)
    ]


def test_engine_backend_is_continuous_and_token_in_token_out(engine, tok):
    backend = EngineBackend(engine, tok, version=engine.version)
    runner = AgentRunner(backend, tok=tok, max_parallel_agents=None, max_tokens_per_turn=24, max_total_tokens=480)
    tasks = _tool_use_and_math_tasks()
    trajs = runner.run(tasks, sample_seed=3)
    # one engine step serves many agents: far fewer steps than (requests x tokens)
    assert backend.requests == sum(t.turns for t in trajs)
    assert backend.engine_steps < sum(t.completion_tokens for t in trajs)
    for t, task in zip(trajs, tasks):
        assert t.stop_reason in ("done", "max_turns", "max_tokens"), (t.stop_reason, t.error)
        assert len(t.ids) == len(t.loss_mask) == len(t.logprobs)
        assert t.ids[: t.prompt_len] == prompt_ids(tok, t.messages[:2], task.tools or None)
        assert sum(t.loss_mask) == t.completion_tokens  # every sampled token, nothing else, is trained on
        assert all(lp <= 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if m)


def test_continuous_dispatch_is_deterministic_for_fixed_seeds(engine, tok):
    """Env steps of random duration change how the engine's batches form; per-request seeds keep the samples."""
    import random

    class Jittery(EnvTask):
        async def step(self, action):
            await asyncio.sleep(random.random() * 0.05)
            return await super().step(action)

    def run_once(seed):
        tasks = [Jittery(envs.make("tool_use", "test", seed=s), f"t{s}") for s in range(6)]
        runner = AgentRunner(
            EngineBackend(engine, tok), tok=tok, max_parallel_agents=None, max_tokens_per_turn=32, max_total_tokens=480
        )
        return runner.run(tasks, sample_seed=seed)

    a, b = run_once(11), run_once(11)
    assert [(t.ids, t.loss_mask, t.reward, t.messages) for t in a] == [
        (t.ids, t.loss_mask, t.reward, t.messages) for t in b
    ]
    # logprobs: the same tokens scored in differently formed batches differ in the last float bits (measured ≤ 3e-6)
    assert max(abs(x - y) for s, t in zip(a, b) for x, y in zip(s.logprobs, t.logprobs)) < 1e-4
    assert [t.ids for t in a] != [t.ids for t in run_once(12)]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """`vllm serve` on the tiny model, on 127.0.0.1, for this module."""
    model = _model_dir()
    if model is None:
        pytest.skip("no tiny model directory")
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    with local_vllm_server(model, startup_timeout_s=120, log_path=str(log)) as url:
        yield url, model


@pytest.mark.slow
def test_engine_and_server_give_identical_trajectories_at_temperature_0(vllm_server, engine, tok, tmp_path):
    """The same runner, the same weights, greedy: the colocated engine and a local `vllm serve` produce the same
    token ids, logprobs (within fp32 noise), messages and rewards, multi-turn tool use included."""
    url, model = vllm_server
    server = OpenAIBackend(url, model=None, logprobs=True, token_ids=True)  # model: the server's first

    def run(backend):
        runner = AgentRunner(
            backend, tok=tok, max_parallel_agents=8, max_tokens_per_turn=24, temperature=0.0, max_total_tokens=480
        )
        return runner.run(_tool_use_and_math_tasks())

    local, served = run(EngineBackend(engine, tok)), run(server)
    assert server.model == model and server.tool_choice == "none"  # tools reached a parser-less server
    for a, b in zip(local, served):
        assert b.stop_reason in ("done", "max_turns", "max_tokens"), (b.stop_reason, b.error)
        assert a.ids == b.ids and a.loss_mask == b.loss_mask
        assert a.messages == b.messages and a.reward == b.reward and a.stop_reason == b.stop_reason
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-3
        assert a.prompt_tokens == b.prompt_tokens  # the server rendered exactly the prompt the trainer would
    rows = load_jsonl(save_jsonl(served, tmp_path / "http.jsonl"))
    assert len(rows) == 8 and json.dumps(rows)
    print("http eval:", summarize(served))


class ScriptBackend:
    """Replies with the next scripted action, the same script for every episode."""

    def __init__(self, actions: list[str]):
        self.actions = actions

    async def aclose(self) -> None:
        pass

    async def generate(self, req: Request) -> GenerationResult:
        k = sum(m["role"] == "assistant" for m in req.messages)
        return GenerationResult(self.actions[k], None, None, "stop", 10, 3)


@pytest.mark.parametrize("pooled", [False, True])
def test_runner_records_the_state_before_each_action(pooled):
    """GiGPO's anchors: state_keys[k] is the env's key before action k, the same key for the same state ("look"
    changes nothing), read from the env inside a pool worker too."""
    env = envs.make("alfworld_lite", split="test", seed=1)
    first = env.state_key()
    recep = env.layout.receptacles[0]
    actions = ["look", f"go to {recep}", "inventory"]
    keys = [first]
    for a in actions:
        keys.append(env.step(a).info["state_key"])
    with EnvPool(n_workers=1) as pool:
        task = (
            PooledEnvTask(pool, "alfworld_lite", "test", seed=1) if pooled else EnvTask.make("alfworld_lite", "test", 1)
        )
        [t] = AgentRunner(ScriptBackend(actions), max_turns=3).run([task])
    assert t.stop_reason == "max_turns" and t.turns == 3
    assert t.state_keys == keys[:3]
    assert t.state_keys[0] == t.state_keys[1] != t.state_keys[2]  # "look" stays in the same state


def test_runner_keys_states_by_observation_without_env_keys():
    tasks, experts = _tool_tasks(1)
    [t] = AgentRunner(ExpertBackend(experts)).run(tasks)
    user = [m for m in t.messages if m["role"] != "assistant"]
    assert len(t.state_keys) == t.turns and t.state_keys[0] == user[1]["content"]  # the opening question
