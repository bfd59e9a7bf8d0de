"""The step's scalars over nothing to measure (nanosky/metrics.py): a rate over no tool call and advantages over no
trained token are NaN, not a reassuring 0; over real items they are their values."""

import math

import torch

from nanosky.agent import Trajectory
from nanosky.metrics import step_metrics
from nanosky.train.batch import to_batch


def _metrics(trajs):
    batch = to_batch(trajs, 0, torch.device("cpu"))
    batch.advantages = torch.where(batch.loss_mask > 0, 0.5, 0.0)
    times = {"step": 1.0, "generate": 0.5, "train": 0.5}
    return step_metrics(trajs, batch, times, {}, envs_failed=0, version=1, n_params=10)


def _traj(mask, tool_calls=0, invalid=0):
    return Trajectory(
        ids=[5, 6, 7, 8],
        loss_mask=mask,
        logprobs=[0.0] * 4,
        prompt_len=2,
        tool_calls=tool_calls,
        invalid_tool_calls=invalid,
    )


def test_a_rate_over_no_item_is_nan_and_over_some_is_its_value(dist_info):
    m = _metrics([_traj([0, 0, 0, 0]), _traj([0, 0, 0, 0])])  # every episode masked out, no tool called
    assert math.isnan(m["tools/invalid_rate"]) and math.isnan(m["train/adv_mean"]) and math.isnan(m["train/adv_std"])
    assert math.isnan(m["train/adv_min"]) and m["train/response_len"] == 0.0
    m = _metrics([_traj([0, 0, 1, 1], tool_calls=3, invalid=1), _traj([0, 0, 1, 0], tool_calls=1)])
    assert m["tools/invalid_rate"] == 0.25 and m["train/adv_mean"] == 0.5 and m["train/adv_std"] == 0.0
