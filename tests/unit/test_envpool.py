"""EnvPool: envs in spawned workers; a hung / dying / raising env costs one trajectory, counted, and the pool goes
on; steps on different workers overlap; envs that shared a replaced worker are rebuilt by replay."""

import asyncio
import time

import helpers_envs  # noqa: F401 - registers "pool_test" (workers import it by the factory's module)
import pytest

import envs
from envs.base import StepResult
from nanosky.rollout.envpool import EnvFailure, EnvPool, InProcessPool, make_pool

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def pool():
    p = EnvPool(n_workers=2, step_timeout_s=TIMEOUT)
    yield p
    p.shutdown()


def _counts(p) -> dict:
    return dict(p.stats)


def test_math_through_pool_matches_in_process(pool):
    handles = [pool.make("math", "test", seed=s) for s in range(4)]
    assert pool.tools(handles[0]) == [] and pool.max_turns(handles[0]) == 1
    msgs = pool.reset(handles)
    outs = pool.step([(h, "<answer>12</answer>") for h in handles])
    for s, m, out in zip(range(4), msgs, outs):
        ref = envs.make("math", split="test", seed=s)
        assert m == ref.reset()
        want = ref.step("<answer>12</answer>")
        assert isinstance(out, StepResult) and (out.reward, out.done, out.info) == (
            want.reward,
            want.done,
            want.info,
        )
    for h in handles:
        pool.close(h)
    assert isinstance(pool.reset([handles[0]])[0], EnvFailure)  # closed handles fail, they do not raise


def test_tool_use_through_pool_exposes_tools_and_runs_them(pool):
    ref = envs.make("tool_use", split="test", seed=0)
    h = pool.make("tool_use", "test", seed=0)
    assert pool.tools(h) == [t.schema for t in ref.tools] and pool.max_turns(h) == ref.max_turns
    expert = ref.expert_conversation()
    assert pool.reset([h])[0] == expert[:2]
    [res] = pool.step([(h, expert[2]["content"])])  # the expert's tool call, executed in the worker
    assert res.observations == [expert[3]] and not res.done and res.info["tool_calls"] == 1
    [res] = pool.step([(h, expert[4]["content"])])
    assert res.done and res.reward == 1.0 and res.info["success"]
    pool.close(h)


@pytest.mark.parametrize(
    "action, reason",
    [("hang", "timeout"), ("die", "died"), ("raise", "boom"), ("unpicklable", "could not be sent")],
)
def test_misbehaving_env_costs_only_its_trajectory(pool, action, reason):
    before = _counts(pool)
    bad, good = pool.make("pool_test", seed=1), pool.make("pool_test", seed=2)
    pool.reset([bad, good])
    t0 = time.monotonic()
    out_bad, out_good = pool.step([(bad, action), (good, "ok")])
    assert time.monotonic() - t0 < TIMEOUT + 5
    assert isinstance(out_bad, EnvFailure) and reason in out_bad.reason and out_bad.handle == bad
    assert isinstance(out_good, StepResult) and out_good.observations[0]["content"] == "1:ok"
    # the lost env stays lost; its neighbour carries on (replayed if it shared the replaced worker)
    assert isinstance(pool.step([(bad, "ok")])[0], EnvFailure)
    assert pool.step([(good, "again")])[0].observations[0]["content"] == "2:again"
    after = _counts(pool)
    assert after["failed"] - before["failed"] == 1
    restarted = action in ("hang", "die")
    assert after["worker_restarts"] - before["worker_restarts"] == int(restarted)
    assert after["timeouts"] - before["timeouts"] == int(action == "hang")
    # and the pool still takes new envs
    h = pool.make("math", "train", seed=7)
    assert isinstance(pool.reset([h])[0], list)
    for x in (bad, good, h):
        pool.close(x)


def test_envs_sharing_a_replaced_worker_are_replayed():
    with EnvPool(n_workers=1, step_timeout_s=TIMEOUT) as p:
        a, b, c = (
            p.make("pool_test", seed=1),
            p.make("pool_test", seed=2),
            p.make("pool_test", seed=3, nondeterministic=True),
        )
        p.reset([a, b, c])
        first = p.step([(a, "x"), (a, "y"), (c, "x")])
        pid = first[0].info["pid"]
        assert isinstance(p.step([(b, "die")])[0], EnvFailure)
        out_a, out_c = p.step([(a, "z"), (c, "z")])
        assert out_a.observations[0]["content"] == "3:z" and out_a.info["pid"] != pid  # state rebuilt elsewhere
        assert isinstance(out_c, EnvFailure) and "diverged" in out_c.reason  # never silently different
        assert (p.stats["failed"], p.stats["worker_restarts"], p.stats["replayed"]) == (2, 1, 1)


def test_steps_overlap_across_workers(pool):
    n, sleep = 4, 0.6
    hs = [pool.make("pool_test", seed=i) for i in range(n)]
    pool.reset(hs)
    assert len({pool._records[h].worker for h in hs}) == 2  # spread over both workers
    t0 = time.monotonic()
    outs = pool.step([(h, f"sleep:{sleep}") for h in hs])
    elapsed = time.monotonic() - t0
    assert all(isinstance(o, StepResult) for o in outs)
    assert sleep * n / 2 * 0.9 < elapsed < sleep * n * 0.8, elapsed  # ~n/2 x sleep, clearly less than serial
    for h in hs:
        pool.close(h)


def test_step_async_is_awaitable_and_non_blocking():
    # its own pool, with room for a 3 s step: wide margins on both sides on a loaded box
    p = EnvPool(n_workers=1, step_timeout_s=60)
    h = p.make("pool_test", seed=5)
    p.reset([h])

    async def main():
        fut = p.step_async(h, "sleep:3")
        pending = not fut.done()  # returned while the worker sleeps: a blocking submit would hand back a done future
        return pending, await asyncio.wrap_future(fut)

    try:
        pending, res = asyncio.run(main())
        assert pending and res.observations[0]["content"] == "1:sleep:3"
    finally:
        p.shutdown()


def test_make_errors_raise_in_the_caller(pool):
    with pytest.raises(KeyError):
        pool.make("no_such_env")
    with pytest.raises(ValueError, match="split"):
        pool.make("math", "dev", seed=0)  # math makes train, validation and test


def test_shutdown_with_a_hung_step_returns_promptly():
    p = EnvPool(n_workers=1, step_timeout_s=60)
    h = p.make("pool_test")
    p.reset([h])
    fut = p.step_async(h, "hang")
    time.sleep(0.3)
    t0 = time.monotonic()
    p.shutdown()
    assert time.monotonic() - t0 < 10
    assert isinstance(fut.result(timeout=5), EnvFailure)
    assert not any(w.proc.is_alive() for w in p._workers)


def test_in_process_pool_same_interface():
    p = make_pool(0)
    assert isinstance(p, InProcessPool)
    h, bad = p.make("math", "test", seed=3), p.make("pool_test", seed=1)
    assert p.reset([h])[0] == envs.make("math", split="test", seed=3).reset()
    assert p.max_turns(bad) == 5 and p.tools(h) == []
    p.reset([bad])
    out = p.step([(h, "<answer>1</answer>"), (bad, "raise")])
    assert isinstance(out[0], StepResult) and isinstance(out[1], EnvFailure) and "boom" in out[1].reason
    assert p.stats["failed"] == 1
    lost = p.step([(bad, "ok")])[0]  # a lost env fails again, it does not raise
    assert isinstance(lost, EnvFailure) and lost.handle == bad
