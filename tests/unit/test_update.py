"""Which losses may skip zero-advantage rows exactly (`skips_exactly`); the 2-rank gradient checks are in
tests/e2e/test_update_ranks.py."""

import os

from spawn import ROOT

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
    means.add({"is_weight_mean": 1.0, "mismatch/mismatch_abs_max": 0.5, "pg_loss": 2.0, "odd": nan}, n_valid=3)
    means.add({"is_weight_mean": nan, "mismatch/mismatch_abs_max": nan, "pg_loss": 0.0, "odd": nan}, n_valid=0)
    means.add({"is_weight_mean": 2.0, "mismatch/mismatch_abs_max": 0.25, "pg_loss": 4.0, "odd": nan}, n_valid=1)
    means.add({"is_weight_mean": 9.0, "mismatch/mismatch_abs_max": 9.0, "pg_loss": 9.0, "odd": 9.0}, 5, blank=True)
    out, extra = means.reduce([7.0, 8.0])
    assert out["is_weight_mean"] == (1.0 * 3 + 2.0 * 1) / 4  # 1.25, where a mean of means would give 1.5 (or NaN)
    assert out["mismatch/mismatch_abs_max"] == 0.5
    assert out["pg_loss"] == (2.0 + 0.0 + 4.0) / 3  # a micro-batch mean: each defined micro-batch counts once
    assert "odd" not in out  # defined by no micro-batch (the blank pass's value is not counted): absent, not 0
    assert extra == [7.0, 8.0] and means.n_micro == 3
