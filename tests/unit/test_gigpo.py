"""GiGPO's pure functions against hand-computed values (docs/algorithms.md, arXiv 2505.10978)."""

import math

import pytest
import torch

import algos

T_ = torch.tensor


def test_discounted_returns_hand_values():
    assert algos.discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert algos.discounted_returns([1.0, 2.0, 3.0], 1.0) == [6.0, 5.0, 3.0]
    assert algos.discounted_returns([1.0, -1.0], 0.0) == [1.0, -1.0]
    assert algos.discounted_returns([], 0.95) == []


def test_step_group_advantages_mean_norm_and_singletons():
    out = algos.step_group_advantages(T_([1.0, 3.0, 5.0, 2.0]), ["a", "a", "b", "a"], "mean_norm")
    # key a: mean 2 → -1, 1, 0; key b is a singleton: mean 0 → 5
    torch.testing.assert_close(out, T_([-1.0, 1.0, 5.0, 0.0]))


def test_step_group_advantages_mean_std_norm_unbiased_std():
    out = algos.step_group_advantages(T_([1.0, 3.0, 7.0]), [("s", 1), ("s", 1), ("t", 2)], "mean_std_norm")
    std = math.sqrt(2.0)  # unbiased std of (1, 3)
    torch.testing.assert_close(out, T_([-1 / (std + 1e-6), 1 / (std + 1e-6), 7 / (1 + 1e-6)]))
    equal = algos.step_group_advantages(T_([0.3, 0.3, 0.3]), [0, 0, 0], "mean_std_norm")
    assert equal.abs().max() == 0  # all-equal anchor: exactly 0, no rounding noise blown up by eps


def test_step_group_advantages_bad_input():
    with pytest.raises(ValueError, match="mean_std_norm"):
        algos.step_group_advantages(T_([1.0]), ["a"], "std")
    with pytest.raises(ValueError, match="one key each"):
        algos.step_group_advantages(T_([1.0, 2.0]), ["a"], "mean_norm")


def test_gigpo_advantages_hand_example():
    # One prompt group, two episodes. Episode 0: states A → B → C, rewards 0, 0, 1 (success, R = 1).
    # Episode 1: states A → B → B, rewards 0, 0, 0 (R = 0). γ = 0.5, ω = 1, mean_norm.
    rewards = T_([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    episode = T_([0, 0, 0, 1, 1, 1])
    step = T_([0, 1, 2, 0, 1, 2])
    group = T_([7, 7, 7, 7, 7, 7])
    keys = ["A", "B", "C", "A", "B", "B"]
    out = algos.gigpo_advantages(rewards, episode, step, group, keys, gamma=0.5, omega=1.0, mode="mean_norm")
    # Episode level: R = (1, 0), mean 0.5 → +0.5 / −0.5.
    # Q: ep0 (0.25, 0.5, 1), ep1 (0, 0, 0). Anchors: A {0.25, 0} mean .125; B {0.5, 0, 0} mean 1/6; C {1} singleton.
    expected = [0.5 + 0.125, 0.5 + (0.5 - 1 / 6), 0.5 + 1.0, -0.5 - 0.125, -0.5 - 1 / 6, -0.5 - 1 / 6]
    torch.testing.assert_close(out, T_(expected))


def test_gigpo_rows_in_any_order_and_groups_kept_apart():
    # The same state key in two prompt groups is two anchors; rows may come shuffled.
    rewards = T_([1.0, 0.0, 0.0, 1.0])
    episode = T_([0, 1, 2, 3])
    step = T_([0, 0, 0, 0])
    group = T_([0, 0, 1, 1])
    keys = ["s", "s", "s", "s"]
    out = algos.gigpo_advantages(rewards, episode, step, group, keys, gamma=0.95, mode="mean_std_norm")
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # group/anchor of (1, 0): ±0.5 over the unbiased std √0.5
    torch.testing.assert_close(out, T_([2 * a, -2 * a, -2 * a, 2 * a]))
    perm = [3, 1, 0, 2]
    shuffled = algos.gigpo_advantages(rewards[perm], episode[perm], step[perm], group[perm], [keys[i] for i in perm])
    plain = algos.gigpo_advantages(rewards, episode, step, group, keys)
    torch.testing.assert_close(shuffled, plain[perm])


def test_anchor_stats():
    s = algos.anchor_stats(T_([0, 0, 0, 1]), ["a", "a", "b", "a"])
    assert s["anchor_size_mean"] == pytest.approx(4 / 3)
    assert s["anchor_nonsingleton_frac"] == pytest.approx(0.5)


def test_registered_gigpo_paints_each_step_on_its_tokens():
    # The hand example above as a [2, 12] batch: each step's action tokens get A^E + ω·A^S of that step.
    spans = [[(0, 2), (4, 6), (8, 9)], [(1, 3), (5, 7), (9, 12)]]
    steps = algos.StepInfo(spans, [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]], [["A", "B", "C"], ["A", "B", "B"]])
    mask = torch.zeros(2, 12)
    for i, row in enumerate(spans):
        for a, b in row:
            mask[i, a:b] = 1
    fn = algos.get_adv_estimator("gigpo")
    adv, ret = fn(torch.zeros(2, 12), mask, T_([7, 7]), gamma=0.5, steps=steps, omega=2.0, mode="mean_norm")
    per_step = [
        [0.5 + 2 * 0.125, 0.5 + 2 * (0.5 - 1 / 6), 0.5 + 2 * 1.0],
        [-0.5 - 2 * 0.125, -0.5 - 2 / 6, -0.5 - 2 / 6],
    ]
    expected, q = torch.zeros(2, 12), torch.zeros(2, 12)
    for i, row in enumerate(spans):
        for (a, b), v, r in zip(row, per_step[i], algos.discounted_returns(steps.rewards[i], 0.5)):
            expected[i, a:b], q[i, a:b] = v, r
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, q)
    assert adv[mask == 0].abs().max() == 0  # observation tokens get nothing
    with pytest.raises(ValueError, match="needs steps"):
        fn(torch.zeros(2, 12), mask, T_([7, 7]))
    with pytest.raises(ValueError, match="all 2 rows"):
        fn(torch.zeros(2, 12), mask, T_([7, 7]), steps=algos.StepInfo(spans[:1], [[0.0] * 3], [["A"] * 3]))


def test_gigpo_preset_and_config():
    cfg = algos.preset("gigpo")
    assert (cfg.adv_estimator, cfg.gamma, cfg.step_adv_weight, cfg.step_adv_mode) == (
        "gigpo",
        0.95,
        1.0,
        "mean_norm",
    )
    assert algos.registry.ADV_ESTIMATORS.meta("gigpo") == {
        "per_group": True,
        "needs_values": False,
        "needs_steps": True,
        "demos": False,
    }
    with pytest.raises(ValueError, match="step_adv_mode"):
        algos.AlgoConfig(adv_estimator="gigpo", step_adv_mode="std")
    with pytest.raises(ValueError, match="step_adv_weight"):
        algos.AlgoConfig(adv_estimator="gigpo", step_adv_weight=-1.0)
