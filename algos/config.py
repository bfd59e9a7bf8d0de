"""`AlgoConfig`: which advantage estimator, policy loss, aggregation, KL, filters and critic a run uses; `PRESETS`.

`--algo NAME` picks a preset (`preset(name, **overrides)`), every field stays overridable on the command line
(tyro turns the field docstrings below into `--help`). Definitions: docs/algorithms.md.
The built-in estimators and losses that PRESETS names are registered by `algos/__init__.py`, which Python runs
before this module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from algos.agg import AGG_MODES
from algos.correction import CORRECTIONS
from algos.gigpo import GIGPO_MODES
from algos.kl import KL_KINDS
from algos.registry import ADV_ESTIMATORS, POLICY_LOSSES, UnknownNameError


@dataclass(kw_only=True)
class AlgoConfig:
    """RL algorithm: advantage estimator + policy loss + aggregation + KL + sampling filters + critic."""

    name: str = "grpo"
    """The preset this config started from (`--algo NAME` sets the whole config; names the run dir's {algo})."""
    adv_estimator: str = "grpo"
    """Advantage estimator, a registry name: grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae, or one
    added with @algos.register_adv_estimator in a module named by --plugins."""
    policy_loss: str = "ppo"
    """Policy loss, a registry name: ppo, gspo, sapo, cispo, or one added with @algos.register_policy_loss in a module
    named by --plugins."""
    loss_agg_mode: str = "token-mean"
    """How per-token losses are reduced over the global mini-batch: token-mean, seq-mean-token-mean,
    seq-mean-token-sum, seq-mean-token-sum-norm."""
    clip_low: float = 0.2
    """Ratio clipped below at 1 - clip_low (ppo, gspo); >= 1 = no lower clip."""
    clip_high: float = 0.2
    """Ratio clipped above at 1 + clip_high (ppo, gspo); DAPO's clip-higher is 0.28."""
    dual_clip_c: float | None = None
    """Dual-clip constant c > 1 for ppo (caps the loss at -c*A when A < 0); None = off."""
    tau_pos: float = 1.0
    """SAPO gate temperature for positive advantages."""
    tau_neg: float = 1.05
    """SAPO gate temperature for non-positive advantages."""
    cispo_clip_low: float = 1.0
    """CISPO IS weight lower bound 1 - cispo_clip_low (1.0 = unbounded below, as in MiniMax-M1)."""
    cispo_clip_high: float = 0.28
    """CISPO IS weight upper bound 1 + cispo_clip_high."""
    norm_const: int | None = None
    """Constant C of seq-mean-token-sum-norm (and of the KL / entropy terms in that mode); None = the padded length T
    in the pure loss functions, and the max response length in training (set once by `TrainConfig.finalize`)."""
    kl_coef: float = 0.0
    """KL coefficient beta against the reference model; 0 = off (no reference model is loaded)."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator for the KL loss term."""
    kl_in_reward: bool = False
    """Subtract beta*k1 from the token rewards instead of adding a KL loss term."""
    track_ref_kl: bool = False
    """Load the reference model even when kl_coef = 0, only to log train/kl (drift from the start policy)."""
    gamma: float = 1.0
    """Discount for reinforce_pp and gae (per token) and gigpo (per step; its preset uses 0.95)."""
    lam: float = 1.0
    """GAE lambda."""
    step_adv_weight: float = 1.0
    """GiGPO's ω: weight of the step-level (anchor-state) advantage added to the episode-level one."""
    step_adv_mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"
    """GiGPO's normalisation F of both levels: 1 (mean_norm) or the group's std (mean_std_norm)."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal and generate more until the batch is full (DAPO)."""
    max_gen_rounds: int = 3
    """Upper bound on generation rounds per step with dynamic sampling (1 = no extra rounds)."""
    overlong_cache_len: int = 0
    """DAPO soft overlong punishment band in tokens before the max response length; 0 = off."""
    rollout_correction: Literal["auto", "off", "tis", "mis", "seq-tis", "seq-mis"] = "auto"
    """Off-policy correction, one name: each token's loss weighted by the behaviour ratio rho = pi_old / mu (pi_old:
    the trainer's log-probs as the update starts, the proximal policy the clip is taken around; mu: the engine's, at
    sampling). tis = min(rho, cap) per token (TIS); mis = 0 outside [1/cap, cap], else 1, per token (MIS); seq-tis /
    seq-mis: the same on each sequence's rho (the product over its tokens), for all of its tokens; off. auto = tis
    with partial rollouts (--rollout.max-staleness > 0), else off. The mismatch is logged either way."""
    rollout_is_cap: float = 2.0
    """The cap C of every correction (rho above C is truncated to C, or masked)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    mini_batches: int = 1
    """Optimizer steps per epoch (the global batch is split into this many mini-batches)."""
    neg_adv_scale: float = 1.0
    """Negative advantages are multiplied by this after the estimator (`algos.scale_negative`): 1 = unchanged; 0 =
    learn only from better-than-average samples (RAFT-like); in between, failures are down-weighted. Rows left
    with no non-zero advantage are skipped by the update (`--optim.skip-zero-adv`)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (loss -= coef * entropy); 0 = off."""
    value_clip: float | None = 0.5
    """PPO value clipping range around the old values; None = unclipped."""
    critic_lr: float = 1e-5
    """Critic learning rate (gae only)."""
    critic_warmup_steps: int = 0
    """Steps that train only the critic before the policy starts updating (gae only)."""
    vf_coef: float = 1.0
    """Value loss coefficient (the critic has its own optimizer, so with Adam this mostly interacts with grad
    clipping)."""

    def __post_init__(self) -> None:
        _check_name("adv_estimator", self.adv_estimator, ADV_ESTIMATORS.names())
        _check_name("policy_loss", self.policy_loss, POLICY_LOSSES.names())
        _check_name("loss_agg_mode", self.loss_agg_mode, AGG_MODES)
        _check_name("kl_kind", self.kl_kind, KL_KINDS)
        _check_name("step_adv_mode", self.step_adv_mode, GIGPO_MODES)
        _check_name("rollout_correction", self.rollout_correction, CORRECTIONS)
        checks = {
            "clip_low": self.clip_low >= 0,
            "clip_high": self.clip_high >= 0,
            "dual_clip_c": self.dual_clip_c is None or self.dual_clip_c > 1,
            "tau_pos": self.tau_pos > 0,
            "tau_neg": self.tau_neg > 0,
            "cispo_clip_low": self.cispo_clip_low >= 0,
            "cispo_clip_high": self.cispo_clip_high >= 0,
            "norm_const": self.norm_const is None or self.norm_const > 0,
            "kl_coef": self.kl_coef >= 0,
            "gamma": 0 <= self.gamma <= 1,
            "lam": 0 <= self.lam <= 1,
            "step_adv_weight": self.step_adv_weight >= 0,
            "max_gen_rounds": self.max_gen_rounds >= 1,
            "overlong_cache_len": self.overlong_cache_len >= 0,
            "rollout_is_cap": self.rollout_is_cap > 1,
            "ppo_epochs": self.ppo_epochs >= 1,
            "mini_batches": self.mini_batches >= 1,
            "entropy_coef": self.entropy_coef >= 0,
            "neg_adv_scale": self.neg_adv_scale >= 0,
            "value_clip": self.value_clip is None or self.value_clip > 0,
            "critic_lr": self.critic_lr > 0,
            "critic_warmup_steps": self.critic_warmup_steps >= 0,
            "vf_coef": self.vf_coef >= 0,
        }
        for field, ok in checks.items():
            if not ok:
                raise ValueError(f"AlgoConfig.{field}: invalid value {getattr(self, field)!r}")

    @property
    def needs_critic(self) -> bool:
        return ADV_ESTIMATORS.meta(self.adv_estimator).get("needs_values", False)

    @property
    def needs_ref(self) -> bool:
        return self.kl_coef > 0 or self.track_ref_kl


def _check_name(field: str, value: object, valid: list[str] | tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"AlgoConfig.{field}: unknown value {value!r}; valid: {', '.join(valid)}")


PRESETS: dict[str, AlgoConfig] = {
    # token-mean rather than the GRPO paper's seq-mean-token-mean: per-sequence averaging gives each token of a
    # long answer less weight, so wrong long answers are under-penalised and lengths drift up (Dr. GRPO, DAPO);
    # token-mean is verl's default. KL is off as in DAPO/Dr. GRPO; set kl_coef (e.g. 0.001) to turn it on.
    "grpo": AlgoConfig(adv_estimator="grpo", policy_loss="ppo", loss_agg_mode="token-mean"),
    # No std division and a constant normaliser: removes GRPO's length and difficulty biases (arXiv 2503.20783).
    "dr_grpo": AlgoConfig(adv_estimator="dr_grpo", policy_loss="ppo", loss_agg_mode="seq-mean-token-sum-norm"),
    "rloo": AlgoConfig(adv_estimator="rloo", policy_loss="ppo", loss_agg_mode="token-mean"),
    # REINFORCE++ puts a token-level k1 KL into the rewards; that is what makes its reward-to-go differ per token.
    "reinforce_pp": AlgoConfig(
        adv_estimator="reinforce_pp",
        policy_loss="ppo",
        loss_agg_mode="token-mean",
        kl_coef=0.001,
        kl_in_reward=True,
    ),
    "ppo": AlgoConfig(adv_estimator="gae", policy_loss="ppo", loss_agg_mode="token-mean"),
    # The tiny CPU runs generate a few hundred tokens at most, so the overlong band is 32 tokens, not the paper's
    # 4096 of 20480; it must stay below the rollout's max response length.
    "dapo": AlgoConfig(
        adv_estimator="grpo",
        policy_loss="ppo",
        loss_agg_mode="token-mean",
        clip_low=0.2,
        clip_high=0.28,
        dynamic_sampling=True,
        overlong_cache_len=32,
    ),
    "gspo": AlgoConfig(
        adv_estimator="grpo",
        policy_loss="gspo",
        loss_agg_mode="seq-mean-token-mean",
        clip_low=3e-4,
        clip_high=4e-4,
    ),
    "sapo": AlgoConfig(
        adv_estimator="grpo",
        policy_loss="sapo",
        loss_agg_mode="seq-mean-token-mean",
        tau_pos=1.0,
        tau_neg=1.05,
    ),
    "cispo": AlgoConfig(adv_estimator="grpo", policy_loss="cispo", loss_agg_mode="token-mean"),
    # GiGPO (arXiv 2505.10978): episode-level group advantage + step-level advantage over anchor states, γ = 0.95
    # over steps, mean_norm (no std division), as verl-agent's defaults.
    "gigpo": AlgoConfig(adv_estimator="gigpo", policy_loss="ppo", loss_agg_mode="token-mean", gamma=0.95),
    # SFT in the same loop: the env's expert's episodes (a player that replays them), every assistant token at
    # advantage 1 under a plain NLL; token-mean over the demonstrations' tokens, as TRL's SFTTrainer
    "sft": AlgoConfig(adv_estimator="demo", policy_loss="nll", loss_agg_mode="token-mean"),
    # On-policy distillation's preset (`--distill.teacher` is the switch): the advantage is the teacher's per-token
    # log-ratio (algos/distill.py), plus `--distill.reward-weight` times this estimator's on the env's reward; PPO's
    # clip at r = 1 is the plain policy gradient of one on-policy pass
    "distill": AlgoConfig(adv_estimator="grpo", policy_loss="ppo", loss_agg_mode="token-mean"),
}

for _name, _cfg in PRESETS.items():
    _cfg.name = _name


def preset(name: str, **overrides: object) -> AlgoConfig:
    """A copy of `PRESETS[name]` with `overrides` applied (validated again)."""
    if name not in PRESETS:
        raise UnknownNameError(f"unknown algo preset {name!r}; valid names: {', '.join(sorted(PRESETS))}")
    return dataclasses.replace(PRESETS[name], **({"name": name} | overrides))
