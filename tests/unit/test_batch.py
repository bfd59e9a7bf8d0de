import pytest
import torch

import algos
from nanosky.agent.trajectory import Trajectory
from nanosky.train.batch import balanced_split, signal_groups, split_groups, to_batch


def test_balanced_split_equal_counts_and_even_tokens():
    lengths = [100, 10, 90, 20, 80, 30, 70, 40]
    parts = balanced_split(lengths, 2)
    assert sorted(i for p in parts for i in p) == list(range(8))
    assert [len(p) for p in parts] == [4, 4]
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert abs(loads[0] - loads[1]) <= 20


def test_balanced_split_beats_contiguous_split_on_sorted_lengths():
    lengths = list(range(100, 0, -1))
    parts = balanced_split(lengths, 4)
    loads = [sum(lengths[i] for i in p) for p in parts]
    contiguous = [sum(lengths[i : i + 25]) for i in range(0, 100, 25)]
    assert max(loads) - min(loads) < (max(contiguous) - min(contiguous)) / 10


def test_to_batch_aligns_masks_with_next_token():
    t = Trajectory(ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0, 0, -0.5, -0.25], prompt_len=2, reward=1.0)
    u = Trajectory(ids=[5, 6, 9], loss_mask=[0, 0, 1], logprobs=[0, 0, -1.0], prompt_len=2, reward=0.0, group=1)
    b = to_batch([t, u], pad_id=0, device="cpu")
    assert b.input_ids.tolist() == [[5, 6, 7, 8], [5, 6, 9, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    # position t predicts ids[t+1]: mask/logprobs shift left by one
    assert b.loss_mask.tolist() == [[0, 1, 1], [0, 1, 0]]
    assert torch.allclose(b.rollout_logprobs, torch.tensor([[0, -0.5, -0.25], [0, -1.0, 0]]))
    assert b.rewards.tolist() == [1.0, 0.0] and b.group_index.tolist() == [0, 1]


def test_split_groups_keeps_groups_whole_and_rows_equal():
    lengths = [30, 30, 5, 5, 20, 20, 10, 10]  # 4 groups of 2, group totals 60, 10, 40, 20
    trajs = [
        Trajectory(ids=[1] * n, loss_mask=[1] * n, logprobs=[0.0] * n, group=i // 2) for i, n in enumerate(lengths)
    ]
    parts = split_groups(trajs, 2)
    assert sorted(i for p in parts for i in p) == list(range(8)) and [len(p) for p in parts] == [4, 4]
    for p in parts:  # each group's two members sit on the same rank
        assert all(sum(trajs[j].group == trajs[i].group for j in p) == 2 for i in p)
    assert sorted(sum(lengths[i] for i in p) for p in parts) == [
        60,
        70,
    ]  # {60, 10} and {40, 20}, not 100 vs 30
    with pytest.raises(ValueError, match="evenly"):
        split_groups(trajs[:6], 2)  # 3 groups over 2 ranks


def test_the_split_balances_the_groups_the_update_trains_on():
    lengths = [30, 30, 5, 5, 20, 20, 10, 10]  # group totals 60, 10, 40, 20
    rewards = [1, 0, 1, 0, 1, 1, 0, 0]  # groups 0 and 1 carry a signal; 2 and 3 do not (equal rewards)
    trajs = [
        Trajectory(ids=[1] * n, loss_mask=[1] * n, logprobs=[0.0] * n, group=i // 2, reward=float(r))
        for i, (n, r) in enumerate(zip(lengths, rewards))
    ]
    cfg = algos.AlgoConfig()
    assert signal_groups(trajs, cfg) == {0, 1}
    # by length alone, groups 0 and 1 share a rank ({60, 10} and {40, 20}): one rank trains all the rows
    assert any({0, 1, 2, 3} <= set(p) for p in split_groups(trajs, 2))
    parts = split_groups(trajs, 2, signal_groups(trajs, cfg))
    assert [len(p) for p in parts] == [4, 4]
    assert sorted(sorted({trajs[i].group for i in p} & {0, 1}) for p in parts) == [[0], [1]]
    # where the advantage is not known before the split, no group is left out of the balance
    assert signal_groups(trajs, algos.AlgoConfig(adv_estimator="gigpo")) is None
    assert signal_groups(trajs, algos.AlgoConfig(kl_in_reward=True, kl_coef=0.1)) is None
    assert signal_groups(trajs, algos.AlgoConfig(adv_estimator="reinforce_pp")) is None
    assert signal_groups(trajs, algos.AlgoConfig(adv_estimator="rloo")) == {0, 1}
