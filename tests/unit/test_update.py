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
