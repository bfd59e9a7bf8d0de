"""Partial rollouts' bookkeeping (nanosky/partial.py) over a scripted backend that stamps every token with the
weights that produced it (its id is 100 + the version), with heavy-tailed lengths so that phases end with episodes
cut mid-reply: versions recorded exactly, staleness within the bound, a group at the bound finished before its step
trains, and over 10 steps every started group trained once (nothing lost, nothing twice)."""

import asyncio
import random
import time

import pytest

from nanosky.agent import AgentRunner, EnvTask, GenerationResult
from nanosky.bundled import resolve_model_path
from nanosky.config import RolloutConfig
from nanosky.partial import Carry
from nanosky.rollout.chat import load_tokenizer
from nanosky.rollout.loop import RankLoop

BASE = 100  # a sampled id is BASE + the version that sampled it


class Ledger:
    """The run's player, with the groups the carry starts recorded in order (the test's ledger: the carry keeps
    none). A group's first episode has index 0."""

    def __init__(self, player):
        self.player, self.started = player, []

    def start_episode(self, task, episode, *, via):
        if episode.index == 0:
            self.started.append(episode.group)
        return self.player.start_episode(task, episode, via=via)

    def __getattr__(self, name):
        return getattr(self.player, name)


class Scripted:
    """EngineBackend's interface for the carry: `generate` samples one token per loop tick under `version`; `pause`
    cuts every reply in flight (it waits for `resume`, then goes on under the new version)."""

    def __init__(self, eos: int, seed: int = 0):
        self.eos, self.rng, self.version = eos, random.Random(seed), 0
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.resumed_prefill_tokens = self.engine_steps = self.batched = 0
        self.busy_s, self.running = 0.0, 0

    async def generate(self, req):
        n = 60 if self.rng.random() < 0.2 else 3  # heavy-tailed: one reply in five is 20x longer
        ids, versions = [], []
        self.running += 1
        try:
            while len(ids) < n:
                if not self.resumed.is_set():  # cut: wait for the next phase, prefilled again from prompt + ids
                    await self.resumed.wait()
                    self.resumed_prefill_tokens += len(req.prompt_ids) + len(ids)
                ids.append(BASE + self.version)
                versions.append(self.version)
                self.engine_steps += 1
                self.batched += self.running
                await asyncio.sleep(0)
        finally:
            self.running -= 1
        ids.append(self.eos)
        versions.append(self.version)
        return GenerationResult("x", ids, [-1.0] * len(ids), "stop", len(req.prompt_ids), len(ids), versions)

    def pause(self) -> int:
        self.resumed.clear()
        return self.running

    def resume(self, version: int) -> None:
        self.version = version
        self.resumed.set()


@pytest.mark.parametrize("K", [1, 2])
def test_ten_steps_of_carries_lose_nothing_train_nothing_twice_and_bound_staleness(K):
    tok = load_tokenizer(resolve_model_path("tiny"))
    cfg = RolloutConfig(prompts_per_step=4, group_size=2, max_staleness=K, oversample=1.5, max_turns=1)
    backend, loop = Scripted(tok.eos_token_id), RankLoop()
    carry = Carry(cfg, backend, world=1, rank=0, player=(ledger := Ledger(AgentRunner.from_config(cfg, backend, tok))))

    def make(env_seed):
        return EnvTask.make("math", "train", seed=env_seed)

    trained, carried = [], []
    try:
        for step in range(1, 11):
            version = step - 1  # the weights the step samples with (one sync per step)
            out = loop.run(carry.phase(make, step, version, seed=0, drain=step == 10))
            trajs, m = out.trajs, out.metrics
            assert len(trajs) == 4 * 2 and len({t.group for t in trajs}) == 4  # this rank's share, whole groups
            carried.append(m["rollout/carried"])
            for t in trajs:
                sampled = [(i, v) for i, v in zip(t.ids, t.token_versions()) if v >= 0]
                assert sampled and all(i == BASE + v for i, v in sampled if i != tok.eos_token_id)  # exact
                assert all(0 <= version - v <= K for _, v in sampled), (step, [v for _, v in sampled])
            assert m["rollout/staleness_max"] <= K
            assert 0.0 <= m["rollout/tail_s"] <= m["rollout/phase_s"]  # the one rule (`tail_s`): a time, never NaN
            # a group at the bound is never left for a later step
            assert all(version - g.version < K for g in carry.groups), [(g.gid, g.version) for g in carry.groups]
            trained += sorted({t.group for t in trajs})
    finally:
        loop.close()
    assert sum(carried) > 0  # episodes were cut and carried
    assert len(trained) == len(set(trained)) == 40  # nothing trained twice
    assert sorted(trained) == sorted(ledger.started) and not carry.groups  # nothing lost: the last step drained


def test_the_tail_is_one_rule_for_both_kinds_of_phase():
    """`rollout/tail_s`: the phase's time with fewer than a quarter of its episodes running; 0.0 when the phase ended
    first (a partial-rollout phase cut them), NaN over no episode."""
    import math

    from nanosky.agent.player import tail_s

    assert tail_s([8.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], 8, wall=10.0) == 3.0  # after the 7th end, 1 of 8 runs
    assert tail_s([1.0, 2.0, 3.0, 4.0], 4, wall=5.0) == 1.0  # of 4, fewer than 1 runs only once all have ended
    assert tail_s([1.0, 2.0, 3.0], 4, wall=5.0) == 0.0  # one still ran when the phase ended
    assert tail_s([1.0, 2.0, 3.0, 4.0, 5.0], 8, wall=6.0) == 0.0  # 3 of 8 still running when the phase ended
    assert tail_s([1.0, 2.0, 3.0, 9.0], 4, wall=5.0) == 0.0  # an end after the phase's is not within it
    assert math.isnan(tail_s([], 0, wall=5.0))


def test_a_draining_step_starts_only_its_share_and_finishes_everything():
    tok = load_tokenizer(resolve_model_path("tiny"))
    cfg = RolloutConfig(prompts_per_step=4, group_size=2, max_staleness=3, oversample=1.5, max_turns=1)
    backend, loop = Scripted(tok.eos_token_id, seed=3), RankLoop()
    carry = Carry(cfg, backend, world=1, rank=0, player=(ledger := Ledger(AgentRunner.from_config(cfg, backend, tok))))
    try:
        loop.run(carry.phase(lambda s: EnvTask.make("math", "train", seed=s), 1, 0, seed=0))
        left = len(carry.groups)
        assert left == 2  # 6 started, 4 trained
        trajs = loop.run(carry.phase(lambda s: EnvTask.make("math", "train", seed=s), 2, 1, seed=0, drain=True)).trajs
        assert len({t.group for t in trajs}) == 4 and not carry.groups and len(ledger.started) == 6 + 4 - left
    finally:
        loop.close()


@pytest.mark.parametrize(
    "args, field",
    [
        (["--rollout.oversample", "1.5"], "needs --rollout.max-staleness >= 1"),
        (["--rollout.max-staleness", "1", "--rollout.oversample", "2"], "[1, 2)"),
        (["--rollout.max-staleness", "-1"], "--rollout.max-staleness must be >= 0"),
        (["--rollout.max-staleness", "1", "--algo", "dapo"], "dynamic-sampling"),
        (["--rollout.max-staleness", "1", "--algorithm.rollout-is-cap", "1"], "rollout-is-cap"),
    ],
)
def test_what_partial_rollouts_do_not_take_is_refused_at_start_up(args, field):
    from nanosky.cli import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(args, console=False)
    assert field in str(e.value), str(e.value)


async def _two_calls(client, task):
    """An external agent whose second call edits its history: two segments, one call each."""
    r = await client.chat.completions.create(model="policy", messages=task.messages)
    again = [*task.messages, {"role": "assistant", "content": r.choices[0].message.content}]
    await client.chat.completions.create(model="policy", messages=[*again[1:], {"role": "user", "content": "and?"}])
    return 0.5


def test_an_external_agents_episodes_are_carried_their_calls_held_between_phases_and_not_timed_out(tmp_path):
    """`--rollout.agent` with K = 1: a call cut at a phase's end is answered in the next phase under the new weights
    (each id stamped with its version); a call made between phases waits for the next one; the training between
    phases (here 1.5 s of sleep) does not count against the agent's 1 s timeout."""
    from nanosky.endpoint.harness import Harness
    from nanosky.endpoint.server import Sampling

    tok = load_tokenizer(resolve_model_path("tiny"))
    cfg = RolloutConfig(prompts_per_step=4, group_size=2, max_staleness=1, oversample=1.5)
    backend, loop = Scripted(tok.eos_token_id, seed=1), RankLoop()
    harness = Harness(backend, tok, Sampling(max_tokens=64, max_total_tokens=2048), agent=_two_calls, timeout_s=1.0)
    carry = Carry(cfg, backend, world=1, rank=0, player=(ledger := Ledger(harness)))
    trained, spans = [], 0
    try:
        for step in range(1, 7):
            version = step - 1
            out = loop.run(carry.phase(lambda s: EnvTask.make("math", "train", seed=s), step, version, 0, step == 6))
            trajs, m = out.trajs, out.metrics
            assert len({t.group for t in trajs}) == 4 and all(t.stop_reason == "done" for t in trajs), [
                (t.stop_reason, t.error) for t in trajs
            ]
            for t in trajs:
                assert t.info["agent"]["segments"] == 2 and len(t.steps) == 2
                sampled = [(i, v) for i, v in zip(t.ids, t.versions) if v >= 0]
                assert sampled and all(i == BASE + v for i, v in sampled if i != tok.eos_token_id)  # exact
                calls = t.info["agent"]["versions"]  # each call's: its first token's
                assert calls == sorted(calls) and all(0 <= version - v <= 1 for v in calls), (version, calls)
                spans += len(set(calls)) > 1
            # token-weighted over both segments' sampled ids, each stamped exactly
            lag = []
            for t in trajs:
                for st in t.steps:
                    sampled = [(i, v) for i, v, on in zip(st.ids, st.versions, st.loss_mask) if on]
                    assert all(v >= 0 and (i == tok.eos_token_id or i == BASE + v) for i, v in sampled)
                    lag += [version - v for _, v in sampled]
            assert m["rollout/staleness_mean"] == pytest.approx(sum(lag) / len(lag), abs=1e-12)
            assert m["rollout/staleness_max"] == max(lag)
            trained += sorted({t.group for t in trajs})
            time.sleep(1.5)  # the training between phases: the agents' clock stops
    finally:
        loop.run(harness.aclose())
        loop.close()
    assert spans > 0  # an episode's two calls were answered by two versions of the weights
    assert len(trained) == len(set(trained)) == 24 and sorted(trained) == sorted(ledger.started)


def test_an_agents_clock_leaves_out_the_time_held():
    from nanosky.endpoint.harness import within

    async def main(held):
        return await within(asyncio.sleep(0.3, "done"), 0.2, held)

    loop = RankLoop()
    try:
        assert loop.run(main(lambda: time.monotonic())) == "done"  # all of it held: never runs out
        with pytest.raises(TimeoutError):
            loop.run(main(lambda: 0.0))
    finally:
        loop.close()


class TwoTurns:
    """An env whose episodes take two turns: the first reply gets an observation, the second ends it."""

    max_turns, tools, checker = 2, [], True

    def __init__(self, seed: int):
        self.seed, self.turn = seed, 0

    def reset(self):
        return [{"role": "user", "content": f"task {self.seed}"}]

    def step(self, action):
        from envs.base import StepResult

        self.turn += 1
        if self.turn == 1:
            return StepResult([{"role": "user", "content": "go on"}], 0.0, False)
        return StepResult([], float(self.seed % 2), True)

    def state_key(self):
        return None

    def action_choices(self):
        return None

    def action_grammar(self):
        return None

    def close(self):
        pass


class Short(Scripted):
    """Every reply 3 tokens: a held episode's first reply is sampled within its phase."""

    async def generate(self, req):
        self.rng.random = lambda: 1.0
        return await super().generate(req)


def test_held_groups_are_carried_mid_episode_on_any_machine():
    """`--debug.hold-extra-groups`: the groups a phase starts beyond its share send their first requests and hold
    the rest until the phase ends, so they are carried across the update, cut after their first turn, each episode
    over two versions. (Without the hold, whether they finish within the phase is scheduling: nothing to assert.)"""
    from nanosky.agent import EnvTask

    tok = load_tokenizer(resolve_model_path("tiny"))
    cfg = RolloutConfig(prompts_per_step=4, group_size=2, max_staleness=1, oversample=1.5)
    backend, loop = Short(tok.eos_token_id), RankLoop()
    ledger = Ledger(AgentRunner.from_config(cfg, backend, tok))
    carry = Carry(cfg, backend, world=1, rank=0, player=ledger, hold=True)
    try:
        one = loop.run(carry.phase(lambda s: EnvTask(TwoTurns(s)), 1, 0, seed=0))
        two = loop.run(carry.phase(lambda s: EnvTask(TwoTurns(s)), 2, 1, seed=0))
        first, second, m2 = one.trajs, two.trajs, two.metrics
    finally:
        loop.close()
    held = {ledger.started[k] for k in (4, 5)}  # step 1's groups beyond its share of 4
    assert {t.group for t in first}.isdisjoint(held)
    assert m2["rollout/carried"] == 2 * 2  # both held groups, both episodes each, carried into step 2
    spanned = [t for t in second if t.group in held]  # trained first at step 2 (oldest first)
    assert len(spanned) == 4 and all(sorted(set(t.sampled_versions())) == [0, 1] for t in spanned)
