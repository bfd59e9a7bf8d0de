"""nanosky.train.step_credit: the steps inside concatenated multi-turn trajectories (spans, rewards, state keys)."""

import pytest
import torch

import algos
from nanosky.agent.trajectory import Trajectory
from nanosky.train.batch import to_batch
from nanosky.train.step_credit import action_spans, anchor_metrics, step_info


def _traj(mask, turn_rewards, keys, reward, group=0):
    n = len(mask)
    return Trajectory(
        ids=list(range(10, 10 + n)),
        loss_mask=mask,
        logprobs=[0.0] * n,
        reward=reward,
        turn_rewards=turn_rewards,
        state_keys=keys,
        group=group,
    )


def test_action_spans():
    assert action_spans([0, 0, 1, 1, 0, 1, 0, 0, 1]) == [(2, 4), (5, 6), (8, 9)]
    assert action_spans([0, 0]) == [] and action_spans([1, 1]) == [(0, 2)]


def test_step_info_lines_up_with_the_batch_and_rewards_sum_to_the_outcome():
    # prompt (3) | turn 1 (2) | obs (2) | turn 2 (3) | obs (1) | turn 3 cut before its env step (1)
    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1]
    t = _traj(mask, [0.25, 0.0], ["s0", "s1"], reward=1.0, group=3)
    info = step_info([t])
    assert info.spans == [[(2, 4), (6, 9), (10, 11)]]
    batch = to_batch([t], 0, "cpu")
    for a, b in info.spans[0]:  # position p of the [B, L-1] tensors scores token p+1: the spans are policy tokens
        assert batch.loss_mask[0, a:b].sum() == b - a
    assert batch.loss_mask.sum() == sum(b - a for a, b in info.spans[0])
    # The unstepped turn is a step of its own with its own key; the final verdict's remainder lands on the last step.
    assert info.rewards == [[0.25, 0.0, 0.75]] and sum(info.rewards[0]) == pytest.approx(t.reward)
    assert info.state_keys[0][:2] == ["s0", "s1"] and info.state_keys[0][2] not in ("s0", "s1")


def test_anchor_metrics_counts_shared_states():
    a = _traj([0, 1, 0, 1], [0.0, 1.0], ["A", "B"], reward=1.0, group=0)
    b = _traj([0, 1, 0, 1], [0.0, 0.0], ["A", "C"], reward=0.0, group=0)
    c = _traj([0, 1], [0.0], ["A"], reward=0.0, group=1)  # same key, other group: its own anchor
    m = anchor_metrics(step_info([a, b, c]), [0, 0, 1], gamma=1.0, mode="mean_norm")
    assert m["gigpo/anchor_size_mean"] == pytest.approx(5 / 4)  # anchors {A: 2}, {B}, {C}, {A (group 1)}
    assert m["gigpo/anchor_nonsingleton_frac"] == pytest.approx(2 / 5)
    # A^S: A anchor Q = (1, 0) → ±0.5; singletons B (1) and C (0) and group-1 A (0) keep their Q
    expected = torch.tensor([0.5, 1.0, -0.5, 0.0, 0.0], dtype=torch.float64).std()
    assert m["gigpo/step_adv_std"] == pytest.approx(float(expected))
    assert set(anchor_metrics(algos.StepInfo([], [], []), [], 1.0, "mean_norm")) == set(m)


def test_overlong_penalty_reads_the_longest_turn_not_the_episode():
    from nanosky.collect import overlong_penalty

    short_turns = _traj([0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1], [], [], reward=1.0)  # 9 policy tokens, turns of 3
    long_turn = _traj([0, 1, 1, 1, 1, 1, 0, 1], [], [], reward=1.0)  # a turn of 5 = max_new_tokens
    overlong_penalty([short_turns, long_turn], max_len=5, cache_len=2)  # the band starts at 3 tokens
    assert short_turns.reward == 1.0 and long_turn.reward == pytest.approx(0.0)
