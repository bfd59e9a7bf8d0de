"""The self-judge (`--reward.judge-url self`, `Judge.engine` in nanosky/judge/__init__.py) on the real engine and the bundled tiny
model: at temperature 0 under the strict schema every answer parses on the first call, in group and pointwise mode,
the same again when asked again; each score lands on the trajectory its id or prompt names, with the weight version
that judged it; a prompt too long for the answer's room masks its group with the reason."""

import asyncio
import json

import pytest

from nanosky.agent import EngineBackend
from nanosky.agent.trajectory import Trajectory
from nanosky.config.reward import RewardConfig
from nanosky.judge import Judge, judge_groups, rewards

RUBRIC = "Score each attempt from 0 (bad) to 1 (good)."
TASKS = ["What is 2 + 3?", "Name a colour.", "Write a haiku about rain.", "Say hello in French."]
REPLIES = ["<answer>5</answer>", "blue", "I think it is 6", "Bonjour!", "¿qué? ünïcödé 🙂", ""]


class Spy:
    """Wraps the judge's backend: records each (messages, answer) and forwards the request as it came (the strict
    schema with it)."""

    def __init__(self, backend):
        self.backend, self.seen = backend, []

    async def generate(self, req):
        out = await self.backend.generate(req)
        self.seen.append((req.messages, out.text))
        return out

    async def aclose(self):
        await self.backend.aclose()


def _groups(n: int):
    return [
        ([{"role": "user", "content": q}], [REPLIES[(g + k) % len(REPLIES)] for k in range(n)])
        for g, q in enumerate(TASKS)
    ]


@pytest.fixture()
def backend(engine, tok):
    b = EngineBackend(engine, tok)
    b.version = engine.version
    return b


@pytest.mark.parametrize("mode", ["group", "pointwise"])
def test_every_answer_parses_first_time_and_again_the_same(backend, mode):
    judge = Judge.engine(backend, max_tokens=200)
    judge.backend = spy = Spy(backend)
    got = asyncio.run(judge_groups(judge, _groups(2), mode, RUBRIC))
    assert all(v.scores is not None for v in got), [v.error for v in got]
    assert [v.calls for v in got] == [1 if mode == "group" else 2] * len(TASKS)  # no retry was needed
    for _, answer in spy.seen:  # plain JSON, no tolerant parse needed; ids in place
        obj = json.loads(answer)
        if mode == "group":
            assert [e["trajectory_id"] for e in obj["scores"]] == [0, 1]
        assert all(0 <= e["score"] <= 1 for e in obj.get("scores", [obj]))
    again = asyncio.run(judge_groups(Judge.engine(backend, max_tokens=200), _groups(2), mode, RUBRIC))
    assert [v.scores for v in again] == [v.scores for v in got]  # temperature 0


@pytest.mark.parametrize("mode", ["group", "pointwise"])
def test_scores_land_on_the_trajectories_they_judge(backend, tmp_path, dist_info, mode):
    rubric = tmp_path / "rubric.txt"
    rubric.write_text(RUBRIC)
    trajs = [
        Trajectory(
            ids=[1, 2],
            loss_mask=[0, 1],
            logprobs=[0.0, -1.0],
            group=g,
            messages=[{"role": "user", "content": q}, {"role": "assistant", "content": f"{REPLIES[k]} #{g}.{k}"}],
        )
        for g, q in enumerate(TASKS)
        for k in range(2)
    ]
    cfg = RewardConfig(judge=mode, judge_url="self", judge_only=True, rubric=str(rubric), judge_max_tokens=200)
    judging = rewards.Judging(cfg, backend)
    judging.judge.backend = spy = Spy(backend)  # the run's judge, spied on: which answer came for which prompt
    m = judging.step(trajs, asyncio.run)
    assert m["judge/errors"] == 0.0
    for t in trajs:
        prompt, answer = next((msgs, a) for msgs, a in spy.seen if t.messages[-1]["content"] in msgs[-1]["content"])
        k = int(t.messages[-1]["content"].rsplit(".", 1)[1])
        want = json.loads(answer)["scores"][k]["score"] if mode == "group" else json.loads(answer)["score"]
        assert t.info["judge"]["score"] == pytest.approx(want) and t.reward == t.info["judge"]["score"]
        assert t.info["judge"]["weight_version"] == backend.version


def test_a_prompt_with_no_room_for_the_answer_masks_its_group(backend):
    long_task = [{"role": "user", "content": "word " * 400}]
    groups = [(long_task, ["a", "b"]), _groups(2)[0]]
    got = asyncio.run(judge_groups(Judge.engine(backend, max_tokens=200), groups, "group", RUBRIC))
    assert got[0].scores is None and "leaves" in got[0].error and "--engine.max-model-len 512" in got[0].error
    assert got[1].scores is not None  # the other group is judged
