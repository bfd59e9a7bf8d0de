"""The reward-shaping functions the trainer used to inline, now pure in algos/: DAPO's group filter and KL in the
reward, against hand-computed values, and the trajectory-level wrappers in nanosky.collect."""

import math

import pytest
import torch

import algos
from nanosky.agent.trajectory import Trajectory
from nanosky.collect import filter_groups


def test_group_has_signal_keeps_groups_whose_rewards_differ():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.3, 0.3 + 1e-9])
    groups = torch.tensor([7, 7, 7, 2, 2, 2, 9, 9])
    keep = algos.group_has_signal(rewards, groups)
    # group 7 differs; group 2 is all equal; group 9 differs by 1e-9 only: equal at 6 decimals
    assert keep.tolist() == [True, True, True, False, False, False, False, False]
    assert algos.group_has_signal(torch.tensor([0.0]), torch.tensor([0])).tolist() == [False]  # a singleton
    assert algos.group_has_signal(torch.tensor([0.1, 0.2]), torch.tensor([3, 3]), decimals=0).tolist() == [False] * 2


def test_filter_groups_returns_whole_groups_in_order():
    def t(group, reward):
        return Trajectory(ids=[1, 2], loss_mask=[0, 1], group=group, reward=reward)

    trajs = [t(0, 1.0), t(1, 0.0), t(0, 0.0), t(1, 0.0), t(2, 1.0), t(2, 0.5)]
    kept, dropped = filter_groups(trajs)
    assert [(x.group, x.reward) for x in kept] == [(0, 1.0), (0, 0.0), (2, 1.0), (2, 0.5)]
    assert [(x.group, x.reward) for x in dropped] == [(1, 0.0), (1, 0.0)]
    assert filter_groups([]) == ([], [])


def test_kl_in_reward_subtracts_k1_on_response_tokens_only():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.25, 1.0]]))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    out = algos.kl_in_reward(rewards, lp, ref, mask, coef=0.1)
    # k1 = lp - ref = [log 2, 0, log 0.5]; the first token is masked out
    expected = [0.0, 0.0, 1.0 - 0.1 * math.log(0.5)]
    assert out[0].tolist() == pytest.approx(expected)
    k3 = algos.kl_in_reward(rewards, lp, ref, mask, coef=1.0, kind="k3")
    assert k3[0, 2].item() == pytest.approx(1.0 - (2.0 + math.log(0.5) - 1.0))  # exp(-d) + d - 1, d = log 0.5
