"""Tests for algos/: every function against hand-computed values, gradient properties, micro-batch invariance."""

import dataclasses
import math

import pytest
import torch

import algos
from algos import AlgoConfig

LOSSES = ["ppo", "gspo", "sapo", "cispo"]
T_ = torch.tensor


def d64(x):
    return torch.tensor(x, dtype=torch.float64)


# ---------------------------------------------------------------- aggregation


def test_agg_loss_modes_hand_values():
    L = d64([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = T_([[1, 1, 0], [1, 0, 0]])
    assert algos.agg_loss(L, m, "token-mean").item() == pytest.approx(7 / 3)
    assert algos.agg_loss(L, m, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4.0) / 2)
    assert algos.agg_loss(L, m, "seq-mean-token-sum").item() == pytest.approx((3.0 + 4.0) / 2)
    # Σ L·m / (B·C), B = 2 rows: Dr. GRPO keeps the 1/G mean over responses (verl >= 0.5, TRL's dr_grpo)
    assert algos.agg_loss(L, m, "seq-mean-token-sum-norm").item() == pytest.approx(7 / (2 * 3))  # C = T = 3
    assert algos.agg_loss(L, m, "seq-mean-token-sum-norm", norm_const=2).item() == pytest.approx(7 / (2 * 2))
    L4 = d64([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    m4 = T_([[1, 1], [1, 0], [0, 0], [1, 1]])  # a fully masked row still counts in B
    assert algos.agg_loss(L4, m4, "seq-mean-token-sum-norm", norm_const=5).item() == pytest.approx(21 / (4 * 5))


@pytest.mark.parametrize("mode", algos.AGG_MODES)
def test_agg_loss_fully_masked_rows_no_nan(mode):
    L = d64([[1.0, 3.0], [float("inf"), float("nan")]])  # garbage on the padding row must not leak
    m = T_([[1, 1], [0, 0]])
    out = algos.agg_loss(L, m, mode)
    # seq-mean-token-sum-norm: Σ L·m / (B·C) = 4 / (2·2)
    expected = {"token-mean": 2.0, "seq-mean-token-mean": 1.0, "seq-mean-token-sum": 2.0}.get(mode, 1.0)
    assert out.item() == pytest.approx(expected)
    assert algos.agg_loss(L, torch.zeros_like(m), mode).item() == 0.0


def test_agg_loss_bad_mode_lists_modes():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        algos.agg_loss(torch.zeros(1, 2), torch.ones(1, 2), "token-sum")


def test_agg_scale_values():
    mb = T_([[1, 1, 0], [1, 0, 0]])
    assert algos.agg_scale("token-mean", mb, 12, 8) == pytest.approx(3 / 12)
    assert algos.agg_scale("seq-mean-token-mean", mb, 12, 8) == pytest.approx(2 / 8)
    assert algos.agg_scale("seq-mean-token-sum", mb, T_(12), T_(8)) == pytest.approx(2 / 8)
    assert algos.agg_scale("seq-mean-token-sum-norm", mb, 12, 8) == pytest.approx(2 / 8)
    assert algos.agg_scale("token-mean", torch.zeros(2, 3), 0, 2) == 0.0


def _toy_policy(seed=0, B=8, T=6, V=5, D=4):
    """A linear 'policy' over fixed features, so gradients w.r.t. W are exact and cheap."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    W = torch.randn(D, V, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lengths = T_([6, 1, 3, 0, 5, 2, 6, 4])  # includes a fully masked row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    mask[0, 2] = 0  # an env token in the middle of a response

    def log_prob(rows):
        lp = torch.log_softmax(feats[rows] @ W, -1)  # [b, T, V]
        return lp.gather(-1, tokens[rows, :, None]).squeeze(-1)  # [b, T]

    with torch.no_grad():
        old = log_prob(slice(None)) + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, T, generator=g, dtype=torch.float64) * mask
    return W, log_prob, old, adv, mask


@pytest.mark.parametrize("loss_name", LOSSES)
@pytest.mark.parametrize("mode", algos.AGG_MODES)
def test_gradient_invariant_to_micro_batching(loss_name, mode):
    W, log_prob, old, adv, mask = _toy_policy()
    cfg = AlgoConfig(loss_agg_mode=mode, clip_low=0.1, clip_high=0.1, dual_clip_c=3.0, norm_const=6)
    fn = algos.get_policy_loss(loss_name)
    B = mask.shape[0]
    global_tokens, global_seqs = mask.sum(), B
    grads = []
    for n_mb in (1, 2, 4):
        W.grad = None
        for rows in torch.arange(B).chunk(n_mb):
            loss, _ = fn(log_prob(rows), old[rows], adv[rows], mask[rows], cfg)
            (loss * algos.agg_scale(mode, mask[rows], global_tokens, global_seqs)).backward()
        grads.append(W.grad.clone())
    assert grads[0].abs().sum() > 0
    for g in grads[1:]:
        torch.testing.assert_close(g, grads[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", algos.AGG_MODES)
def test_value_loss_invariant_to_micro_batching(mode):
    g = torch.Generator().manual_seed(1)
    mask = T_([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]])
    v = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    old, ret = (
        torch.randn(4, 3, generator=g, dtype=torch.float64),
        torch.randn(4, 3, generator=g, dtype=torch.float64),
    )
    full, _ = algos.value_loss(v, old, ret, mask, clip=0.2, mode=mode)
    (g_full,) = torch.autograd.grad(full, v)
    total = sum(
        algos.value_loss(v[r], old[r], ret[r], mask[r], clip=0.2, mode=mode)[0]
        * algos.agg_scale(mode, mask[r], mask.sum(), 4)
        for r in torch.arange(4).chunk(2)
    )
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(torch.autograd.grad(total, v)[0], g_full)


# ---------------------------------------------------------------- KL and entropy


def test_kl_penalty_hand_values():
    lp, ref = d64([[0.0, -1.0]]), d64([[-1.0, 0.0]])  # d = [1, -1]
    torch.testing.assert_close(algos.kl_penalty(lp, ref, "k1"), d64([[1.0, -1.0]]))
    torch.testing.assert_close(algos.kl_penalty(lp, ref, "k2"), d64([[0.5, 0.5]]))
    torch.testing.assert_close(algos.kl_penalty(lp, ref, "k3"), d64([[math.exp(-1), math.e - 2]]))
    assert algos.kl_penalty(lp, lp, "k3").abs().max() == 0


def test_kl_k3_clamps_and_bad_kind():
    k3 = algos.kl_penalty(d64([[50.0, -50.0, 5.0]]), torch.zeros(1, 3, dtype=torch.float64), "k3")
    # d = 50 → clamp 20 → e^-20 + 19 → clamp 10; d = -50 → e^20 - 21 → 10; d = 5 → e^-5 + 4.
    torch.testing.assert_close(k3, d64([[10.0, 10.0, math.exp(-5) + 4]]))
    with pytest.raises(ValueError, match="k3"):
        algos.kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_entropy_from_logits():
    assert algos.entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4))
    assert algos.entropy_from_logits(T_([0.0, 0.0, float("-inf")])).item() == pytest.approx(math.log(2))
    peaked = algos.entropy_from_logits(T_([[1e4, 0.0, -1e4]]))
    assert torch.isfinite(peaked).all() and peaked.item() == pytest.approx(0.0, abs=1e-6)
    logits = torch.randn(2, 3, 7, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(algos.entropy_from_logits(logits), -(p * p.log()).sum(-1))


# ---------------------------------------------------------------- rewards and advantages


def test_scalar_to_token_rewards():
    mask = T_([[1, 1, 0], [0, 1, 1], [0, 0, 0], [1, 0, 1]])
    out = algos.scalar_to_token_rewards(T_([1.0, 2.0, 3.0, 4.0]), mask)
    torch.testing.assert_close(out, T_([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.0, 0.0, 4.0]]))


def test_overlong_penalty():
    out = algos.overlong_penalty(T_([3, 6, 7, 8, 10, 12]), max_len=10, cache_len=4)  # band starts at 6
    torch.testing.assert_close(out, T_([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    assert out.dtype.is_floating_point
    assert algos.overlong_penalty(T_([3, 12]), 10, 0).abs().sum() == 0  # 0 = off
    with pytest.raises(ValueError, match="cache_len"):
        algos.overlong_penalty(T_([3]), 10, 10)


# 4 groups: sizes 4, 1 (singleton), 2 (all equal), deliberately interleaved and non-contiguous ids.
REWARDS = T_([1.0, 0.0, 2.0, 1.0, 3.0, 1.0, 3.0])
GROUPS = T_([7, 7, 5, 7, 9, 7, 9])
MASK = T_([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1], [1, 0, 1], [1, 1, 0]])


def _run_outcome(name):
    adv, ret = algos.get_adv_estimator(name)(algos.scalar_to_token_rewards(REWARDS, MASK), MASK, GROUPS)
    assert adv.shape == ret.shape == MASK.shape
    # constant over each row's valid tokens, zero elsewhere
    assert (adv[MASK == 0] == 0).all() and (ret[MASK == 0] == 0).all()
    per_seq = (adv * MASK).sum(-1) / MASK.sum(-1)
    torch.testing.assert_close(adv, per_seq[:, None] * MASK)
    torch.testing.assert_close(ret, REWARDS[:, None] * MASK)
    return per_seq


def test_grpo_hand_values():
    # group 7 = [1, 0, 1, 1]: mean 0.75, unbiased std 0.5; group 5 is a singleton: mean 0, std 1;
    # group 9 = [3, 3]: std 0 → advantage 0.
    per_seq = _run_outcome("grpo")
    s = 0.5 + 1e-6
    torch.testing.assert_close(per_seq, T_([0.25 / s, -0.75 / s, 2.0 / (1 + 1e-6), 0.25 / s, 0.0, 0.25 / s, 0.0]))


def test_dr_grpo_hand_values():
    per_seq = _run_outcome("dr_grpo")
    torch.testing.assert_close(per_seq, T_([0.25, -0.75, 2.0, 0.25, 0.0, 0.25, 0.0]))


def test_rloo_hand_values():
    # leave-one-out: 1 - mean(0, 1, 1) = 1/3, 0 - mean(1, 1, 1) = -1; singleton → 0 (no baseline exists).
    per_seq = _run_outcome("rloo")
    torch.testing.assert_close(per_seq, T_([1 / 3, -1.0, 0.0, 1 / 3, 0.0, 1 / 3, 0.0]))


def test_reinforce_pp_reward_to_go_skips_masked_tokens():
    rewards = d64([[1.0, 0.0, 2.0, 5.0], [0.0, 0.0, 0.0, 0.0], [0.0, 7.0, 1.0, 0.0]])
    mask = T_([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 0]])  # row 2: an env token in the middle (its reward ignored)
    adv, ret = algos.get_adv_estimator("reinforce_pp")(rewards, mask, T_([0, 0, 1]), gamma=0.5)
    expected_ret = d64([[1 + 0.5 * 0 + 0.25 * 2, 0 + 0.5 * 2, 2, 0], [0, 0, 0, 0], [0 + 0.5 * 1, 0, 1, 0]])
    torch.testing.assert_close(ret, expected_ret)
    vals = expected_ret[mask.bool()]
    expected_adv = torch.zeros_like(rewards)
    expected_adv[mask.bool()] = (vals - vals.mean()) / (vals.std() + 1e-8)
    torch.testing.assert_close(adv, expected_adv)


def test_reinforce_pp_baseline_hand_values():
    rewards = d64([1.0, 0.0, 1.0, 1.0])
    mask = T_([[1, 1], [1, 0], [1, 1], [0, 1]])
    adv, _ = algos.get_adv_estimator("reinforce_pp_baseline")(
        algos.scalar_to_token_rewards(rewards, mask), mask, T_([0, 0, 1, 1])
    )
    centred = d64([[0.5, 0.5], [-0.5, 0.0], [0.0, 0.0], [0.0, 0.0]])  # group 1 is all equal → 0
    vals = centred[mask.bool()]
    expected = torch.zeros_like(centred)
    expected[mask.bool()] = (vals - vals.mean()) / (vals.std() + 1e-8)
    torch.testing.assert_close(adv, expected)


def test_gae_hand_values_gamma_lam_one():
    # δ = [0.1, 0.1, 0.3], A = [0.5, 0.4, 0.3], returns = A + V = [1, 1, 1]; whiten([.5, .4, .3]) = [1, 0, -1].
    adv, ret = algos.get_adv_estimator("gae")(
        d64([[0.0, 0.0, 1.0]]), T_([[1, 1, 1]]), T_([0]), values=d64([[0.5, 0.6, 0.7]])
    )
    torch.testing.assert_close(ret, d64([[1.0, 1.0, 1.0]]))
    torch.testing.assert_close(adv, d64([[1.0, 0.0, -1.0]]), atol=1e-6, rtol=0)


def test_gae_skips_env_tokens():
    # valid tokens t = 0, 2, 3 with V = 1, 2, 3, rewards 0, 0, 1; γ = 0.9, λ = 0.5:
    # A3 = 1 - 3 = -2; A2 = (0.9·3 - 2) + 0.45·(-2) = -0.2; A0 = (0.9·2 - 1) + 0.45·(-0.2) = 0.71.
    rewards, mask = d64([[0.0, 9.0, 0.0, 1.0]]), T_([[1, 0, 1, 1]])
    values = d64([[1.0, float("nan"), 2.0, 3.0]])  # the env token's value is garbage and must not matter
    adv, ret = algos.get_adv_estimator("gae")(rewards, mask, T_([0]), values=values, gamma=0.9, lam=0.5)
    torch.testing.assert_close(ret, d64([[1.71, 0.0, 1.8, 1.0]]))
    raw = d64([0.71, -0.2, -2.0])
    expected = torch.zeros(1, 4, dtype=torch.float64)
    expected[0, [0, 2, 3]] = (raw - raw.mean()) / (raw.std() + 1e-8)
    torch.testing.assert_close(adv, expected)


def test_gae_requires_values():
    with pytest.raises(ValueError, match="values"):
        algos.get_adv_estimator("gae")(torch.zeros(1, 2), torch.ones(1, 2), T_([0]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"])
def test_estimators_zero_off_mask_and_all_equal(name):
    mask = T_([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    rewards = algos.scalar_to_token_rewards(T_([1.0, 1.0, 1.0, 1.0]), mask)  # all equal, one empty row
    values = torch.full((4, 3), 0.5) if name == "gae" else None
    adv, ret = algos.get_adv_estimator(name)(rewards, mask, T_([0, 0, 1, 1]), values=values)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    if name in ("grpo", "dr_grpo", "rloo"):  # (the reinforce_pp* variants re-centre over the whole batch)
        assert adv[0:2].abs().max() < 1e-6  # group 0 has all-equal rewards → no signal


def test_scale_negative_scales_only_negative_advantages():
    mask = T_([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    rewards = algos.scalar_to_token_rewards(T_([1.0, 0.0, 0.0]), mask)  # one success, two failures
    adv, _ = algos.get_adv_estimator("dr_grpo")(rewards, mask, T_([0, 0, 0]))
    assert adv[0, 0] == pytest.approx(2 / 3) and adv[1, 0] == pytest.approx(-1 / 3)
    half, zero = algos.scale_negative(adv, 0.5), algos.scale_negative(adv, 0.0)
    assert torch.equal(algos.scale_negative(adv, 1.0), adv)
    assert torch.allclose(half, torch.where(adv < 0, adv / 2, adv)) and torch.equal(half[0], adv[0])
    # failures carry nothing: their rows are skipped by the update
    assert torch.equal(zero[0], adv[0]) and (zero[1:] == 0).all()
    assert (half[mask == 0] == 0).all()
    with pytest.raises(ValueError, match="scale"):
        algos.scale_negative(adv, -1.0)
    with pytest.raises(ValueError, match="neg_adv_scale"):
        algos.preset("grpo", neg_adv_scale=-0.5)


# ---------------------------------------------------------------- policy losses


def _lp(log_ratios, requires_grad=True):
    """log_prob, old_log_prob with the given log-ratios (old fixed at -1)."""
    old = torch.full_like(d64(log_ratios), -1.0)
    lp = (old + d64(log_ratios)).requires_grad_(requires_grad)
    return lp, old


def test_ppo_hand_values_and_metrics():
    r = [0.5, 1.5, 1.5, 0.5]
    lp, old = _lp([[math.log(x) for x in r]])
    adv, mask = d64([[1.0, 1.0, -1.0, -1.0]]), T_([[1, 1, 1, 1]])
    loss, metrics = algos.get_policy_loss("ppo")(lp, old, adv, mask, AlgoConfig())
    # per token: max(-0.5, -0.8) = -0.5; max(-1.5, -1.2) = -1.2 (clipped); 1.5; max(0.5, 0.8) = 0.8 (clipped)
    assert loss.item() == pytest.approx((-0.5 - 1.2 + 1.5 + 0.8) / 4)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["ppo_kl"] == pytest.approx(-2 * (math.log(0.5) + math.log(1.5)) / 4)
    assert all(isinstance(v, float) for v in metrics.values())
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad[0, 1] == 0 and grad[0, 3] == 0  # clipped tokens carry no gradient
    assert grad[0, 0].item() == pytest.approx(-0.5 / 4) and grad[0, 2].item() == pytest.approx(1.5 / 4)


def test_ppo_asymmetric_clip_higher():
    lp, old = _lp([[math.log(1.25), math.log(1.25)]])
    cfg = AlgoConfig(clip_low=0.2, clip_high=0.28)
    loss, metrics = algos.get_policy_loss("ppo")(lp, old, d64([[1.0, 1.0]]), T_([[1, 1]]), cfg)
    assert loss.item() == pytest.approx(-1.25) and metrics["clip_frac"] == 0.0  # 1.25 < 1.28: not clipped


def test_dual_clip_bounds_loss_for_negative_advantages():
    lp, old = _lp([[10.0, 3.0, 0.0, 10.0]])
    adv, mask = d64([[-1.0, -2.0, -1.0, 1.0]]), T_([[1, 1, 1, 1]])
    plain, _ = algos.get_policy_loss("ppo")(lp, old, adv, mask, AlgoConfig(loss_agg_mode="seq-mean-token-sum"))
    assert plain.item() > 2e4  # unbounded without the dual clip (r = e^10 with A < 0)
    cfg = AlgoConfig(dual_clip_c=3.0, loss_agg_mode="seq-mean-token-sum")
    loss, metrics = algos.get_policy_loss("ppo")(lp, old, adv, mask, cfg)
    # A=-1, r=e^10 → 3; A=-2, r=e^3 → 6; A=-1, r=1 → 1 (below the cap); A=+1, r=e^10 → clipped -1.2 (untouched)
    assert loss.item() == pytest.approx(3.0 + 6.0 + 1.0 - 1.2)
    assert metrics["dual_clip_frac"] == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad[0, 0] == 0 and grad[0, 1] == 0


def test_gspo_token_forward_equals_sequence_ratio():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    lp = (old + 0.2 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    mask = T_([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0]])
    log_s = ((lp - old) * mask).sum(-1) / mask.sum(-1)  # [B]
    s = torch.exp(log_s).detach()
    torch.testing.assert_close(algos.gspo_token_log_ratio(lp, old, mask), log_s[:, None].expand(3, 4).detach())
    cfg = AlgoConfig(clip_low=10.0, clip_high=10.0, loss_agg_mode="seq-mean-token-mean")  # no clipping
    loss, metrics = algos.get_policy_loss("gspo")(lp, old, torch.ones(3, 4, dtype=torch.float64) * mask, mask, cfg)
    assert loss.item() == pytest.approx(-s.mean().item())  # L = -mean_i s_i·A_i, A = 1
    assert metrics["ratio_mean"] == pytest.approx(((s[:, None] * mask).sum() / mask.sum()).item())
    # gradient per token: d/dlogπ_t of -(1/B)(1/|y_i|) Σ_t s_i·A = -s_i / (B·|y_i|)
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, -(s / (3 * mask.sum(-1)))[:, None] * mask)


def test_gspo_paper_clip_range_clips_whole_sequence():
    lp, old = _lp([[0.01, 0.01], [0.0, 0.0]])
    cfg = AlgoConfig(clip_low=3e-4, clip_high=4e-4, loss_agg_mode="seq-mean-token-mean")
    loss, metrics = algos.get_policy_loss("gspo")(lp, old, d64([[1.0, 1.0], [1.0, 1.0]]), T_([[1, 1], [1, 1]]), cfg)
    assert metrics["clip_frac"] == pytest.approx(0.5)  # s = e^0.01 > 1.0004 clipped; s = 1 not
    (grad,) = torch.autograd.grad(loss, lp)
    assert (grad[0] == 0).all() and (grad[1] != 0).all()


@pytest.mark.parametrize("mode", algos.AGG_MODES)
def test_sapo_on_policy_gradient_equals_policy_gradient(mode):
    W, log_prob, _, adv, mask = _toy_policy(seed=3)
    cfg = AlgoConfig(loss_agg_mode=mode)
    lp = log_prob(slice(None))
    loss, metrics = algos.get_policy_loss("sapo")(lp, lp.detach(), adv, mask, cfg)  # r = 1
    (g_sapo,) = torch.autograd.grad(loss, W)
    pg = algos.agg_loss(-adv * log_prob(slice(None)), mask, mode)
    (g_pg,) = torch.autograd.grad(pg, W)
    torch.testing.assert_close(g_sapo, g_pg)
    assert metrics["gate_weight_mean"] == pytest.approx(1.0) and metrics["clip_frac"] == 0.0


def test_sapo_hand_values_and_soft_decay():
    # r = 2, A = +1 (τ = 1): L = -σ(1)·4; dL/dlogπ = -4σ(1)(1-σ(1))·r.  r = 2, A = -1 (τ = 1.05): L = σ(1.05)·4/1.05.
    lp, old = _lp([[math.log(2.0), math.log(2.0), 0.0]])
    adv, mask = d64([[1.0, -1.0, 1.0]]), T_([[1, 1, 1]])
    loss, _ = algos.get_policy_loss("sapo")(lp, old, adv, mask, AlgoConfig(loss_agg_mode="seq-mean-token-sum"))
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert loss.item() == pytest.approx(-4 * sig(1.0) + 4 * sig(1.05) / 1.05 - 2.0)
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad[0, 0].item() == pytest.approx(-4 * sig(1.0) * (1 - sig(1.0)) * 2.0)
    assert grad[0, 2].item() == pytest.approx(-1.0)  # on-policy token: plain -A
    assert abs(grad[0, 0].item()) < 2.0  # the off-policy weight 4σ(1-σ) < 1 damps the r = 2 gradient


def test_cispo_keeps_gradient_on_clipped_tokens():
    lp, old = _lp([[math.log(2.0), math.log(0.1), 0.0]])
    adv, mask = d64([[1.0, 1.0, -1.0]]), T_([[1, 1, 1]])
    loss, metrics = algos.get_policy_loss("cispo")(lp, old, adv, mask, AlgoConfig())
    lpv = lp.detach()[0]
    # weights: min(2, 1.28) = 1.28; 0.1 (no lower bound with cispo_clip_low = 1); 1
    assert loss.item() == pytest.approx((-1.28 * lpv[0] - 0.1 * lpv[1] + 1.0 * lpv[2]).item() / 3)
    assert metrics["clip_frac"] == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, d64([[-1.28 / 3, -0.1 / 3, 1 / 3]]))
    lp2, old2 = _lp([[math.log(2.0)]])
    ppo, _ = algos.get_policy_loss("ppo")(lp2, old2, d64([[1.0]]), T_([[1]]), AlgoConfig())
    assert torch.autograd.grad(ppo, lp2)[0].item() == 0.0  # PPO drops exactly this token's gradient


@pytest.mark.parametrize("name", LOSSES)
def test_losses_extreme_ratios_finite(name):
    lp, old = _lp([[100.0, -100.0, 30.0, 0.0]])
    adv, mask = d64([[-1.0, 1.0, 1.0, -1.0]]), T_([[1, 1, 1, 0]])
    loss, metrics = algos.get_policy_loss(name)(lp, old, adv, mask, AlgoConfig())
    (grad,) = torch.autograd.grad(loss, lp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert grad[0, 3] == 0  # masked token
    assert {"clip_frac", "ratio_mean", "ppo_kl"} <= set(metrics)
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", LOSSES)
def test_losses_apply_detached_weights(name):
    W, log_prob, old, adv, mask = _toy_policy(seed=5)
    weights = torch.rand(mask.shape, dtype=torch.float64, requires_grad=True)
    cfg = AlgoConfig(loss_agg_mode="seq-mean-token-sum")
    fn = algos.get_policy_loss(name)
    weighted, _ = fn(log_prob(slice(None)), old, adv, mask, cfg, weights=weights)
    zero, _ = fn(log_prob(slice(None)), old, adv, mask, cfg, weights=torch.zeros_like(weights))
    unweighted, _ = fn(log_prob(slice(None)), old, adv, mask, cfg)
    assert zero.item() == 0.0 and weighted.item() != pytest.approx(unweighted.item())
    weighted.backward()
    assert weights.grad is None  # weights are constants


def test_policy_loss_respects_agg_mode():
    lp, old = _lp([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv, mask = d64([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]]), T_([[1, 1, 1], [1, 0, 0]])
    fn = algos.get_policy_loss("ppo")
    token_mean, _ = fn(lp, old, adv, mask, AlgoConfig(loss_agg_mode="token-mean"))
    seq_mean, _ = fn(lp, old, adv, mask, AlgoConfig(loss_agg_mode="seq-mean-token-mean"))
    assert token_mean.item() == pytest.approx(-7 / 4) and seq_mean.item() == pytest.approx(-(1 + 4) / 2)


# ---------------------------------------------------------------- value loss


def test_value_loss_hand_values():
    v = d64([[1.0, 2.0]]).requires_grad_()
    old, ret, mask = d64([[0.5, 2.0]]), d64([[2.0, 1.0]]), T_([[1, 1]])
    # token 0: V_clip = 0.5 + 0.2 = 0.7 → ½·max(1, 1.69) = 0.845 (clipped branch); token 1: ½·1 = 0.5
    loss, metrics = algos.value_loss(v, old, ret, mask, clip=0.2)
    assert loss.item() == pytest.approx((0.845 + 0.5) / 2)
    assert metrics["value_clip_frac"] == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(loss, v)
    torch.testing.assert_close(grad, d64([[0.0, 0.5]]))  # clipped branch has no gradient w.r.t. V
    unclipped, m2 = algos.value_loss(v, old, ret, mask, clip=None)
    assert unclipped.item() == pytest.approx(0.5) and m2["value_clip_frac"] == 0.0


def test_explained_variance():
    ret, mask = d64([[1.0, 2.0, 3.0, 100.0]]), T_([[1, 1, 1, 0]])
    assert algos.explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert algos.explained_variance(torch.full_like(ret, 2.0), ret, mask) == pytest.approx(0.0)
    # residual [1, 0, -1] has the same variance as R → 0; residual halved → 1 - 1/4
    assert algos.explained_variance(d64([[1.5, 2.0, 2.5, 0.0]]), ret, mask) == pytest.approx(0.75)
    assert math.isnan(algos.explained_variance(ret, torch.ones_like(ret), mask))


# ---------------------------------------------------------------- rollout correction


def test_rollout_correction_token_level():
    rollout = d64([[0.0, 0.0, 0.0, 0.0]])
    old = d64([[math.log(0.5), math.log(3.0), math.log(1.5), 50.0]])  # last position is padding
    mask = T_([[1, 1, 1, 0]])
    w, metrics = algos.rollout_correction(old, rollout, mask, "token", "truncate", 2.0)
    torch.testing.assert_close(w, d64([[0.5, 2.0, 1.5, 0.0]]))
    assert metrics["frac_corrected"] == pytest.approx(1 / 3)
    w, metrics = algos.rollout_correction(old, rollout, mask, "token", "mask", 2.0)
    torch.testing.assert_close(w, d64([[1.0, 0.0, 1.0, 0.0]]))
    assert not w.requires_grad


def test_rollout_correction_sequence_level():
    l2 = math.log(2.0)
    old = d64([[l2, l2], [l2, -l2], [0.0, 5.0], [0.0, 0.0]])  # 5.0 sits on padding and must be ignored
    rollout, mask = torch.zeros(4, 2, dtype=torch.float64), T_([[1, 1], [1, 1], [1, 0], [0, 0]])
    # ρ_seq = 4 (> C), 1, 1; the last row is empty
    w, metrics = algos.rollout_correction(old, rollout, mask, "sequence", "truncate", 2.0)
    torch.testing.assert_close(w, d64([[2.0, 2.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    assert metrics["frac_corrected"] == pytest.approx(1 / 3)  # 1 of 3 non-empty sequences (2 of 5 tokens)
    w, _ = algos.rollout_correction(old, rollout, mask, "sequence", "mask", 2.0)
    torch.testing.assert_close(w, d64([[0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    w, metrics = algos.rollout_correction(old, rollout, mask, "none", "mask", 2.0)
    torch.testing.assert_close(w, mask.double())
    assert metrics["frac_corrected"] == 0.0


def test_off_policy_correction_rules_tis_mis_off_and_auto():
    """--algorithm.rollout-correction, one name and one cap: tis truncates at the cap, mis masks outside
    [1/cap, cap], off is none, and auto is tis only when the data are off-policy (partial rollouts)."""
    cfg = algos.AlgoConfig(rollout_is_cap=2.0)
    assert algos.correction_rule(cfg, off_policy=True) == ("token", "truncate", 2.0, 0.0)
    assert algos.correction_rule(cfg, off_policy=False) is None  # auto, on-policy: off
    tis, mis = (dataclasses.replace(cfg, rollout_correction=c) for c in ("tis", "mis"))
    assert algos.correction_rule(mis, off_policy=False) == ("token", "mask", 2.0, 0.5)
    assert algos.correction_rule(dataclasses.replace(cfg, rollout_correction="off"), off_policy=True) is None
    rollout = d64([[0.0] * 5])
    old = d64([[math.log(0.25), math.log(0.6), 0.0, math.log(1.9), math.log(3.0)]])  # rho = 0.25, 0.6, 1, 1.9, 3
    mask = T_([[1, 1, 1, 1, 1]])
    w, _ = algos.rollout_correction(old, rollout, mask, *algos.correction_rule(tis, False))
    torch.testing.assert_close(w, d64([[0.25, 0.6, 1.0, 1.9, 2.0]]))
    w, m = algos.rollout_correction(old, rollout, mask, *algos.correction_rule(mis, False))
    torch.testing.assert_close(w, d64([[0.0, 1.0, 1.0, 1.0, 0.0]]))  # 0.25 < 1/2 and 3 > 2 are masked
    assert m["frac_corrected"] == pytest.approx(2 / 5)


def test_sequence_corrections_weigh_each_sequence_by_its_product_ratio():
    """seq-tis / seq-mis: rho is the product over a sequence's tokens, its weight every token's, under the one cap."""
    cfg = algos.AlgoConfig(rollout_is_cap=2.0)
    seq_tis, seq_mis = (dataclasses.replace(cfg, rollout_correction=c) for c in ("seq-tis", "seq-mis"))
    assert algos.correction_rule(seq_tis, off_policy=False) == ("sequence", "truncate", 2.0, 0.0)
    assert algos.correction_rule(seq_mis, off_policy=True) == ("sequence", "mask", 2.0, 0.5)
    ln = math.log
    rollout = d64([[0.0] * 3] * 3)
    old = d64([[ln(1.2), ln(1.2), 0.0], [ln(1.5), ln(1.5), ln(1.5)], [ln(0.5), ln(0.8), 0.0]])  # rho 1.44, 3.375, 0.4
    mask = T_([[1, 1, 0], [1, 1, 1], [1, 1, 1]])
    w, _ = algos.rollout_correction(old, rollout, mask, *algos.correction_rule(seq_tis, False))
    torch.testing.assert_close(w, d64([[1.44, 1.44, 0.0], [2.0, 2.0, 2.0], [0.4, 0.4, 0.4]]))
    w, m = algos.rollout_correction(old, rollout, mask, *algos.correction_rule(seq_mis, False))
    torch.testing.assert_close(w, d64([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    assert m["frac_corrected"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("rule", ["tis", "mis", "seq-tis", "seq-mis"])
def test_with_mu_equal_to_the_proximal_policy_the_corrected_loss_is_the_plain_loss(rule):
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(3, 6, generator=g, dtype=torch.float64).requires_grad_()
    old, adv = (lp.detach() + 0.1 * torch.randn(3, 6, generator=g, dtype=torch.float64)), torch.randn(3, 6)
    mask = T_([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    cfg = dataclasses.replace(algos.AlgoConfig(), rollout_correction=rule)
    w, _ = algos.rollout_correction(old, old, mask, *algos.correction_rule(cfg, True))  # mu = pi_prox
    torch.testing.assert_close(w, mask.double())  # every weight 1
    loss_fn = algos.get_policy_loss("ppo")
    plain, _ = loss_fn(lp, old, adv, mask, cfg)
    weighted, _ = loss_fn(lp, old, adv, mask, cfg, weights=w)
    torch.testing.assert_close(weighted, plain)


def test_rollout_correction_bad_args():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="sequence"):
        algos.rollout_correction(z, z, z, "batch", "mask", 2.0)
    with pytest.raises(ValueError, match="truncate"):
        algos.rollout_correction(z, z, z, "token", "clip", 2.0)


def test_mismatch_metrics():
    diffs = torch.linspace(0, 1, 101, dtype=torch.float64)  # |Δlogp| = 0, 0.01, …, 1
    old = torch.cat([diffs, d64([50.0])])[None]  # + one padding position with a huge difference
    rollout = torch.zeros_like(old)
    mask = torch.cat([torch.ones(101), torch.zeros(1)])[None].long()
    m = algos.mismatch_metrics(old, rollout, mask)
    assert m["mismatch_abs_mean"] == pytest.approx(0.5)
    assert m["mismatch_abs_max"] == pytest.approx(1.0)
    assert m["mismatch_abs_p99"] == pytest.approx(0.99)
    assert m["mismatch_k3"] == pytest.approx((torch.exp(diffs) - diffs - 1).mean().item())
    empty = algos.mismatch_metrics(old, rollout, torch.zeros_like(mask))
    assert set(empty) == set(m) and all(math.isnan(v) for v in empty.values())  # over nothing: NaN, not 0


def test_mismatch_by_origin_splits_the_tokens_by_the_weights_that_sampled_them():
    """fresh: sampled by the weights of the old log-probs (lag 0), stale: by older ones (lag > 0), each half's
    `mismatch_metrics` on its own valid tokens; an unknown version (lag < 0) and a masked token are in neither."""
    gap = d64([[0.01, 0.02, 0.5, 0.7, 3.0, 9.0]])  # |Δlogp| per token
    lag = torch.tensor([[0, 0, 1, 2, -1, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    old, rollout = torch.zeros_like(gap), -gap
    m, n = algos.mismatch_by_origin(old, rollout, mask, lag)
    assert n == {"fresh": 2, "stale": 2}
    for origin, on in (("fresh", [1, 1, 0, 0, 0, 0]), ("stale", [0, 0, 1, 1, 0, 0])):
        alone = algos.mismatch_metrics(old, rollout, torch.tensor([on]))
        assert {k.removeprefix(origin + "_"): v for k, v in m.items() if k.startswith(origin)} == {
            k.removeprefix("mismatch_"): v for k, v in alone.items()
        }
    assert m["fresh_abs_max"] == pytest.approx(0.02) and m["stale_abs_mean"] == pytest.approx(0.6)
    m, n = algos.mismatch_by_origin(old, rollout, mask, torch.zeros_like(lag))  # a synchronous step
    assert n == {"fresh": 5, "stale": 0} and m["fresh_abs_max"] == pytest.approx(3.0)
    assert all(math.isnan(v) for k, v in m.items() if k.startswith("stale_"))  # none of a kind: NaN, not 0


# ---------------------------------------------------------------- registry


def test_registry_errors_list_valid_names():
    with pytest.raises(KeyError) as e:
        algos.get_policy_loss("ppo2")
    assert all(n in str(e.value) for n in ["ppo", "gspo", "sapo", "cispo"])
    with pytest.raises(ValueError) as e:
        algos.get_adv_estimator("grpoo")
    assert all(n in str(e.value) for n in ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"])


def test_user_registration_via_decorator():
    @algos.register_policy_loss("test_pg")
    def plain_pg(log_prob, old_log_prob, advantages, response_mask, cfg, weights=None):
        return algos.agg_loss(-advantages * log_prob, response_mask, cfg.loss_agg_mode), {"clip_frac": 0.0}

    @algos.register_adv_estimator("test_raw")
    def raw(token_rewards, response_mask, group_index, values=None, gamma=1.0, lam=1.0):
        return token_rewards * response_mask, token_rewards * response_mask

    assert "test_pg" in algos.policy_loss_names() and "test_raw" in algos.adv_estimator_names()
    assert algos.get_policy_loss("test_pg") is plain_pg
    adv, _ = algos.get_adv_estimator("test_raw")(T_([[1.0, 2.0]]), T_([[1, 0]]), T_([0]))
    loss, _ = algos.get_policy_loss("test_pg")(T_([[-1.0, -1.0]]), None, adv, T_([[1, 0]]), AlgoConfig())
    assert loss.item() == pytest.approx(1.0)


def test_sft_is_the_rl_step_with_advantage_1_and_the_nll():
    """`--algo sft`: the `demo` estimator puts advantage 1 on every demonstrated token (whatever the reward) and 0
    elsewhere; the `nll` loss is then the mean negative log-likelihood of those tokens (token-mean), its gradient
    the NLL's, with no ratio: the old log-probs do not enter."""
    cfg = algos.preset("sft")
    assert (cfg.adv_estimator, cfg.policy_loss, cfg.loss_agg_mode) == ("demo", "nll", "token-mean")
    mask = T_([[0, 1, 1, 0], [1, 1, 1, 1]])
    rewards = d64([[0.0, 0.0, 0.3, 0.0], [0.0, 0.0, 0.0, -1.0]])
    adv, ret = algos.get_adv_estimator("demo")(rewards, mask, T_([0, 1]))
    torch.testing.assert_close(adv, mask.double())
    torch.testing.assert_close(ret, d64([[0.0, 0.3, 0.3, 0.0], [-1.0] * 4]))
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(2, 4, generator=g, dtype=torch.float64)).requires_grad_()
    loss, m = algos.get_policy_loss("nll")(lp, lp.detach() + 5.0, adv, mask, cfg)  # old far away: no effect
    nll = -(lp * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, nll)
    assert m["nll"] == pytest.approx(float(nll))
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad, -mask.double() / mask.sum())  # 0 on the unmasked tokens
    assert (
        algos.registry.ADV_ESTIMATORS.meta("demo")["demos"] and not algos.registry.ADV_ESTIMATORS.meta("grpo")["demos"]
    )
