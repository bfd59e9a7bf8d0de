"""Which losses may skip zero-advantage rows exactly (`skips_exactly`), how the update's metrics are reduced, and
the mismatch split by the weights that sampled each token; the 2-rank gradient checks are in
tests/e2e/test_update_ranks.py."""

import os

from spawn import ROOT

from nanosky.agent.trajectory import Trajectory

SCRIPT = os.path.join(ROOT, "tests", "scripts", "update_step.py")


def test_skip_applies_only_where_it_is_exact(monkeypatch):
    import algos
    from algos.registry import POLICY_LOSSES
    from nanosky.train.update import OptimConfig, skips_exactly

    on = OptimConfig()
    assert skips_exactly(on, algos.preset("grpo"))
    assert skips_exactly(on, algos.preset("gspo")) and skips_exactly(on, algos.preset("cispo"))
    assert not skips_exactly(OptimConfig(skip_zero_adv=False), algos.preset("grpo"))
    assert not skips_exactly(on, algos.preset("grpo", entropy_coef=0.01))  # the bonus reaches A = 0 rows
    assert not skips_exactly(on, algos.preset("grpo", kl_coef=0.1))  # so does a KL loss term
    assert skips_exactly(on, algos.preset("grpo", kl_coef=0.1, kl_in_reward=True))  # ... but not KL in the reward

    # the test's loss lives in a copy of the registry that is put back after the test (no global left behind)
    monkeypatch.setattr(POLICY_LOSSES, "_fns", dict(POLICY_LOSSES._fns))
    monkeypatch.setattr(POLICY_LOSSES, "_meta", dict(POLICY_LOSSES._meta))

    @algos.register_policy_loss("test_own_term")
    def own(log_prob, old_log_prob, advantages, response_mask, cfg=None, weights=None):
        return (log_prob * response_mask).sum(), {}

    assert not skips_exactly(on, algos.preset("grpo", policy_loss="test_own_term"))


def test_the_update_means_are_token_weighted_and_an_all_masked_micro_batch_adds_nothing(dist_info):
    """`MicroMeans`: per-token means (is_weight_mean, is_masked_frac, mismatch_*) are summed over micro-batches
    weighted by their valid tokens and divided once; a micro-batch with no valid token (its per-token values NaN, as
    under --optim.no-skip-zero-adv) leaves them as they were; maxima are maxima; what nothing defined is absent."""
    import math

    from nanosky.train.update import MicroMeans

    nan = math.nan
    means = MicroMeans()
    means.add({"is_weight_mean": 1.0, "mismatch/mismatch_abs_max": 0.5, "pg_loss": 2.0, "odd": nan}, {"valid": 3})
    means.add({"is_weight_mean": nan, "mismatch/mismatch_abs_max": nan, "pg_loss": 0.0, "odd": nan}, {"valid": 0})
    means.add({"is_weight_mean": 2.0, "mismatch/mismatch_abs_max": 0.25, "pg_loss": 4.0, "odd": nan}, {"valid": 1})
    means.add({"is_weight_mean": 9.0, "mismatch/mismatch_abs_max": 9.0, "pg_loss": 9.0, "odd": 9.0}, {"valid": 5}, True)
    out, extra = means.reduce([7.0, 8.0])
    assert out["is_weight_mean"] == (1.0 * 3 + 2.0 * 1) / 4  # 1.25, where a mean of means would give 1.5 (or NaN)
    assert out["mismatch/mismatch_abs_max"] == 0.5
    assert out["pg_loss"] == (2.0 + 0.0 + 4.0) / 3  # a micro-batch mean: each defined micro-batch counts once
    assert "odd" not in out  # defined by no micro-batch (the blank pass's value is not counted): absent, not 0
    assert extra == [7.0, 8.0] and means.n_micro == 3


def _row(gaps: list[float], versions: list[int]) -> Trajectory:
    """A row of a 3-token prompt and one response token per gap, sampled with log p = -gap (the update's old log p
    is 0: each token's |Δlogp| is its gap) by the weights `versions` (empty: not known)."""
    n = len(gaps)
    return Trajectory(
        ids=[10, 11, 12] + [20 + i for i in range(n)],
        loss_mask=[0, 0, 0] + [1] * n,
        logprobs=[0.0, 0.0, 0.0] + [-g for g in gaps],
        versions=[-1, -1, -1] + versions if versions else [],
    )


def test_the_mismatch_is_split_by_the_weights_that_sampled_each_token(tiny_path, dist_info):
    """`mismatch/fresh_*` are over the tokens sampled at the update's version, `mismatch/stale_*` over those sampled
    earlier (a carried episode's first tokens), each on its own tokens and token-weighted over micro-batches (one row
    each here); a token of unknown version is in neither, only in `mismatch_*`. A step with no stale token logs
    `stale_*` as NaN; an update not told its version logs no split."""
    import math

    import pytest
    import torch
    from cpu import FP32

    import algos
    from nanosky.train.batch import to_batch
    from nanosky.train.policy import load_model
    from nanosky.train.update import BY_ORIGIN, OptimConfig, PolicyUpdate

    fresh_row = _row([0.001, 0.002, 0.003, 0.004], [3, 3, 3, 3])
    carried = _row([0.3, 0.5, 0.005, 0.006, 0.007], [2, 2, 3, 3, 3])  # cut after 2 tokens, resumed under version 3
    unknown = _row([9.0, 9.0], [])  # a player that does not stamp versions
    old_row = _row([0.2, 0.4, 0.6], [1, 1, 1])  # finished two versions ago, trained now
    fresh = [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007]
    stale = [0.3, 0.5, 0.2, 0.4, 0.6]

    def k3(gaps):  # exp(old - rollout) - (old - rollout) - 1, averaged over the tokens
        return sum(math.exp(g) - g - 1 for g in gaps) / len(gaps)

    model = load_model(tiny_path, dist_info, precision=FP32)
    update = PolicyUpdate(OptimConfig(micro_batch_size=1), algos.preset("grpo"), model)

    def run(rows, version):
        batch = to_batch(rows, 0, "cpu")
        batch.old_logprobs = torch.zeros_like(batch.loss_mask)
        batch.advantages = batch.loss_mask.clone()
        return update(batch, version=version)

    m = run([fresh_row, carried, unknown, old_row], version=3)
    assert m["mismatch/fresh_abs_mean"] == pytest.approx(sum(fresh) / len(fresh))  # not a mean of row means
    assert m["mismatch/fresh_abs_max"] == pytest.approx(0.007)
    assert m["mismatch/fresh_k3"] == pytest.approx(k3(fresh), rel=1e-2)  # fp32 cancels in exp(g) - g - 1
    assert m["mismatch/stale_abs_mean"] == pytest.approx(sum(stale) / len(stale))
    assert m["mismatch/stale_abs_max"] == pytest.approx(0.6)
    assert m["mismatch/stale_k3"] == pytest.approx(k3(stale), rel=1e-5)
    assert 0.001 <= m["mismatch/fresh_abs_p99"] <= 0.007 and 0.2 <= m["mismatch/stale_abs_p99"] <= 0.6
    everything = fresh + stale + [9.0, 9.0]  # the one mixed number: the unknown row's gap dominates it
    assert m["mismatch/mismatch_abs_max"] == pytest.approx(9.0)
    assert m["mismatch/mismatch_abs_mean"] == pytest.approx(sum(everything) / len(everything))

    m = run([fresh_row, unknown], version=3)  # nothing carried: no stale token on any rank
    assert all(math.isnan(m[k]) for k in BY_ORIGIN if "/stale_" in k), m
    assert m["mismatch/fresh_abs_max"] == pytest.approx(0.004) and m["mismatch/mismatch_abs_max"] == pytest.approx(9)

    m = run([fresh_row, old_row], version=None)
    assert not any(k in m for k in BY_ORIGIN) and m["mismatch/mismatch_abs_max"] == pytest.approx(0.6)
