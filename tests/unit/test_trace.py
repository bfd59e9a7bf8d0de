"""The step's token trace (`nanosky.trace`): whole groups, per-token values aligned with the ids, a token budget."""

import torch

from nanosky import trace
from nanosky.agent.trajectory import Trajectory
from nanosky.train.batch import to_batch
from nanosky.train.tracer import Tracer, pick


def _tracer(rows, kept=None) -> Tracer:
    t = Tracer()
    t.rows, t.kept = rows, kept or {}
    return t


def _batch():
    # groups 7 (3 rows), 5 (2 rows), then a padding row; prompts of 3 tokens, 2-3 sampled ones
    trajs = (
        [
            Trajectory(
                ids=[1, 2, 3, 10 + i, 20 + i], loss_mask=[0, 0, 0, 1, 1], logprobs=[0, 0, 0, -0.5, -0.25], group=7
            )
            for i in range(3)
        ]
        + [
            Trajectory(
                ids=[4, 5, 6, 30 + i, 40 + i, 50],
                loss_mask=[0, 0, 0, 1, 0, 1],
                logprobs=[0, 0, 0, -1.0, 0, -2.0],
                group=5,
            )
            for i in range(2)
        ]
        + [None]
    )
    b = to_batch(trajs, 0, "cpu")
    b.advantages = torch.arange(len(trajs), dtype=torch.float32)[:, None].expand_as(b.loss_mask).clone()
    return trajs, b


def test_pick_keeps_whole_groups_and_skips_padding_rows():
    _, b = _batch()
    assert pick(b, 1) == [0, 1, 2] and pick(b, 3) == [0, 1, 2]
    assert pick(b, 4) == [0, 1, 2, 3, 4] and pick(b, 100) == [0, 1, 2, 3, 4]
    assert pick(b, 0) == []


def test_the_tracer_picks_episodes_rows_on_rank_0_only():
    _, b = _batch()
    t = Tracer(n=3, on=True)
    t.begin(b)
    assert t.rows == [0, 1, 2] and t.kept == {}
    b.layout = "stepwise"  # rows are turns, spread over ranks: nothing to trace
    t.begin(b)
    assert t.rows == []
    off = Tracer(n=3, on=False)
    b.layout = "concat"
    off.begin(b)
    assert off.rows == []


def test_token_fields_align_with_the_ids():
    trajs, b = _batch()
    lp = torch.tensor([0.0, 0.0, -0.9, -1.1, 0.0])  # [T]: position t predicts token t + 1
    ent = torch.tensor([0.0, 0.0, 0.3, 0.0, 0.7])
    got, f = trace.sample(trajs, trajs, b, _tracer([3, 4], {3: (lp, ent)}), n=1, max_tokens=100)
    assert got == trajs[3:5]
    x = f[0]
    assert x["ids"] == trajs[3].ids and x["mask"] == trajs[3].loss_mask
    assert x["lp"] == [None, None, None, -1.0, None, -2.0]  # the engine's, on sampled tokens only
    assert x["lp_train"] == [None, None, None, -0.9, None, 0.0]
    assert x["ent"] == [None, None, None, 0.3, None, 0.7]
    assert x["adv"] == [None, None, None, 3.0, None, 3.0]
    assert f[1]["lp_train"] == [None] * 6 and f[1]["adv"][3] == 4.0  # not traced by the update: no trainer values
    _, f = trace.sample(trajs, trajs, b, _tracer([3, 4]), n=1, max_tokens=11)
    assert f[0] is not None and f[1] is None  # the budget: 6 + 6 tokens > 11


def test_sample_without_traced_rows_takes_the_first_whole_groups():
    trajs, b = _batch()
    real = [t for t in trajs if t is not None]
    got, fields = trace.sample(real[3:] + real[:3], None, b, _tracer([]), n=1, max_tokens=100)
    assert [t.group for t in got] == [5, 5]  # step-wise rows: the episodes carry the engine's side only
    assert fields[0]["lp"] == [None, None, None, -1.0, None, -2.0] and fields[0]["adv"] == [None] * 6
    assert fields[1]["ids"] == real[4].ids and fields[1]["lp_train"] == [None] * 6
    assert trace.sample(real[3:], None, b, _tracer([]), n=1, max_tokens=7)[1][1] is None  # past the token budget
    got, fields = trace.sample(real, real, b, _tracer([0, 1, 2]), n=1, max_tokens=100)
    assert got == real[:3] and all(f is not None for f in fields)


def test_a_stepwise_episode_carries_each_turns_advantage():
    """Step-wise rows are turns: each turn's advantage (GiGPO's differ by step) lands in its episode's turn_log and
    colours that turn's sampled tokens."""
    from nanosky.train.stepwise import log_turn_advantages

    ep = Trajectory(
        ids=[1, 2, 10, 11, 3, 12],
        loss_mask=[0, 0, 1, 1, 0, 1],
        logprobs=[0, 0, -1, -1, 0, -1],
        turn_log=[{"reward": 0.0}, {"reward": 1.0}],
    )
    rows = [Trajectory(info={"episode": 0, "step": k}) for k in (0, 1)]
    log_turn_advantages([ep], rows, [0.25, -0.5])
    assert [x["advantage"] for x in ep.turn_log] == [0.25, -0.5]
    assert trace.rollout_fields(ep)["adv"] == [None, None, 0.25, 0.25, None, -0.5]
    odd = Trajectory(ids=[1, 10], loss_mask=[0, 1], logprobs=[0, -1], turn_log=[{}, {}])  # 2 calls, 1 segment
    log_turn_advantages([odd], rows[:1], [0.5])
    assert "advantage" not in odd.turn_log[0] and trace.rollout_fields(odd)["adv"] == [None, None]
