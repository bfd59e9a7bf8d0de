"""Tests for algos/config.py: AlgoConfig validation, presets, the tyro CLI, and that each preset's pieces run."""

import pytest
import torch
import tyro

import algos
from algos import AlgoConfig

PRESET_NAMES = [
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "ppo",
    "dapo",
    "gspo",
    "sapo",
    "cispo",
    "gigpo",
    "sft",
    "distill",
]


def test_presets_exist_and_construct():
    assert sorted(algos.PRESETS) == sorted(PRESET_NAMES)
    for name in PRESET_NAMES:
        cfg = algos.preset(name)
        assert isinstance(cfg, AlgoConfig) and cfg is not algos.PRESETS[name]


def test_preset_contents_follow_algos_md():
    p = algos.preset
    assert (p("grpo").adv_estimator, p("grpo").policy_loss, p("grpo").loss_agg_mode) == (
        "grpo",
        "ppo",
        "token-mean",
    )
    assert p("grpo").kl_coef == 0 and not p("grpo").needs_ref and not p("grpo").needs_critic
    assert p("dr_grpo").adv_estimator == "dr_grpo" and p("dr_grpo").loss_agg_mode == "seq-mean-token-sum-norm"
    assert p("rloo").adv_estimator == "rloo"
    assert p("reinforce_pp").kl_in_reward and p("reinforce_pp").needs_ref
    ppo = p("ppo")
    assert ppo.adv_estimator == "gae" and ppo.needs_critic and (ppo.gamma, ppo.lam) == (1.0, 1.0)
    dapo = p("dapo")
    assert (dapo.clip_low, dapo.clip_high, dapo.loss_agg_mode, dapo.kl_coef) == (0.2, 0.28, "token-mean", 0.0)
    assert dapo.dynamic_sampling and dapo.overlong_cache_len > 0 and dapo.policy_loss == "ppo"
    gspo = p("gspo")
    assert (gspo.policy_loss, gspo.clip_low, gspo.clip_high) == ("gspo", 3e-4, 4e-4)
    assert gspo.loss_agg_mode == "seq-mean-token-mean"
    sapo = p("sapo")
    assert (sapo.policy_loss, sapo.loss_agg_mode, sapo.tau_pos, sapo.tau_neg) == (
        "sapo",
        "seq-mean-token-mean",
        1.0,
        1.05,
    )
    assert p("cispo").policy_loss == "cispo" and p("cispo").loss_agg_mode == "token-mean"


def test_preset_overrides_and_bad_name():
    cfg = algos.preset("grpo", kl_coef=0.04, loss_agg_mode="seq-mean-token-mean")
    assert cfg.kl_coef == 0.04 and cfg.needs_ref and cfg.loss_agg_mode == "seq-mean-token-mean"
    assert algos.PRESETS["grpo"].kl_coef == 0  # the preset itself is untouched
    with pytest.raises(KeyError) as e:
        algos.preset("grpo2")
    assert all(n in str(e.value) for n in PRESET_NAMES)
    with pytest.raises(ValueError, match="clip_high"):
        algos.preset("dapo", clip_high=-0.1)  # overrides are validated too


@pytest.mark.parametrize(
    "field,value",
    [
        ("clip_low", -0.1),
        ("clip_high", -0.2),
        ("dual_clip_c", 0.5),
        ("tau_pos", 0.0),
        ("tau_neg", -1.0),
        ("cispo_clip_low", -0.1),
        ("cispo_clip_high", -0.1),
        ("norm_const", 0),
        ("kl_coef", -0.001),
        ("kl_kind", "k4"),
        ("gamma", 1.1),
        ("lam", -0.1),
        ("max_gen_rounds", 0),
        ("overlong_cache_len", -1),
        ("rollout_correction", "token"),
        ("rollout_is_cap", 1.0),
        ("ppo_epochs", 0),
        ("mini_batches", 0),
        ("entropy_coef", -0.01),
        ("value_clip", 0.0),
        ("critic_lr", 0.0),
        ("critic_warmup_steps", -1),
        ("vf_coef", -1.0),
        ("adv_estimator", "grpoo"),
        ("policy_loss", "ppo2"),
        ("loss_agg_mode", "token-sum"),
    ],
)
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        AlgoConfig(**{field: value})


def test_bad_registry_name_lists_valid_names():
    with pytest.raises(ValueError) as e:
        AlgoConfig(policy_loss="nope")
    assert all(n in str(e.value) for n in algos.policy_loss_names())


def test_user_registered_names_are_accepted():
    @algos.register_adv_estimator("test_cfg_adv")
    def my_adv(token_rewards, response_mask, group_index, values=None, gamma=1.0, lam=1.0):
        return token_rewards, token_rewards

    cfg = AlgoConfig(adv_estimator="test_cfg_adv")
    assert algos.get_adv_estimator(cfg.adv_estimator) is my_adv and not cfg.needs_critic


def test_losses_read_algo_config_directly():
    """No copied loss config: the losses take the run's AlgoConfig, and the old alias is gone."""
    import algos.policy_losses

    assert not hasattr(algos, "PolicyLossConfig") and not hasattr(algos.policy_losses, "PolicyLossConfig")
    lp = torch.log(torch.tensor([[0.5, 0.5]]))
    old = lp - 1.0  # ratio e ≈ 2.72: clipped at 1 + clip_high
    adv, mask = torch.ones(1, 2), torch.ones(1, 2)
    loss_a, _ = algos.get_policy_loss("ppo")(lp, old, adv, mask, algos.preset("dapo"))
    loss_b, _ = algos.get_policy_loss("ppo")(lp, old, adv, mask, algos.preset("grpo"))
    assert loss_a.item() == pytest.approx(-1.28) and loss_b.item() == pytest.approx(-1.2)
    assert AlgoConfig(clip_low=10.0).clip_low == 10.0  # >= 1: no lower clip


def test_kw_only():
    with pytest.raises(TypeError):
        AlgoConfig("grpo")  # noqa


def test_tyro_cli_overrides_a_preset_and_shows_docstrings(capsys):
    cfg = tyro.cli(AlgoConfig, args=["--clip-high", "0.3", "--dual-clip-c", "3"], default=algos.preset("dapo"))
    assert cfg.clip_high == 0.3 and cfg.dual_clip_c == 3.0 and cfg.dynamic_sampling
    with pytest.raises(SystemExit):
        tyro.cli(AlgoConfig, args=["--help"])
    assert "SAPO gate temperature" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a name no registry holds
        tyro.cli(AlgoConfig, args=["--policy-loss", "ppo2"])
    assert "cispo, gspo, nll, ppo, sapo" in capsys.readouterr().err


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_each_preset_runs_its_pieces(name):
    """Estimator + policy loss (+ value loss) of every preset on a small batch: finite loss, gradients flow."""
    cfg = algos.preset(name)
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    rewards = algos.scalar_to_token_rewards(torch.tensor([1.0, 0.0, 0.0, 1.0]), mask)
    rewards = rewards + algos.overlong_penalty(mask.sum(-1), max_len=64, cache_len=cfg.overlong_cache_len)[:, None] * 0
    log_prob = (-torch.rand(4, 4, generator=g)).requires_grad_()
    old = log_prob.detach() + 0.01 * torch.randn(4, 4, generator=g)
    if cfg.kl_in_reward:
        rewards = rewards - cfg.kl_coef * algos.kl_penalty(old, old - 0.1, "k1") * mask
    values = torch.randn(4, 4, generator=g, requires_grad=True) if cfg.needs_critic else None
    extra = {}
    if algos.registry.ADV_ESTIMATORS.meta(cfg.adv_estimator)["needs_steps"]:  # one step per row, keys shared
        extra["steps"] = algos.StepInfo([[(0, int(m.sum()))] for m in mask], [[1.0], [0.0], [0.0], [1.0]], [["s"]] * 4)
    adv, ret = algos.get_adv_estimator(cfg.adv_estimator)(
        rewards,
        mask,
        torch.tensor([0, 0, 1, 1]),
        values=None if values is None else values.detach(),
        gamma=cfg.gamma,
        **extra,
    )
    loss, metrics = algos.get_policy_loss(cfg.policy_loss)(log_prob, old, adv, mask, cfg)
    if cfg.needs_ref:
        loss = loss + cfg.kl_coef * algos.agg_loss(
            algos.kl_penalty(log_prob, old, cfg.kl_kind), mask, cfg.loss_agg_mode, cfg.norm_const
        )
    loss.backward()
    clip_or_nll = "nll" if cfg.policy_loss == "nll" else "clip_frac"  # sft's loss has no ratio to clip
    assert torch.isfinite(loss) and log_prob.grad.abs().sum() > 0 and clip_or_nll in metrics
    if cfg.needs_critic:
        vloss, vm = algos.value_loss(values, values.detach(), ret, mask, clip=cfg.value_clip)
        vloss.backward()
        assert values.grad.abs().sum() > 0 and "value_clip_frac" in vm
