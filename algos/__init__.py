"""RL algorithms as pure functions over `(B, T)` tensors, looked up by name.

    import algos
    adv, returns = algos.get_adv_estimator("grpo")(token_rewards, response_mask, group_index)
    loss, metrics = algos.get_policy_loss("sapo")(log_prob, old_log_prob, adv, response_mask, cfg)

Modules: agg (loss aggregation), advantages, gigpo (step-level credit for multi-step agents), policy_losses, value,
kl (KL + entropy), correction (rollout correction), distill (on-policy distillation's teacher advantages), rewards (reward shaping), registry, config (AlgoConfig, the one
config every loss and estimator reads, + presets). Definitions: docs/algorithms.md.
Importing `algos` registers every built-in, so worker processes see the same registry.
"""

from algos import advantages as _advantages, policy_losses as _policy_losses  # noqa: F401, I001  (register the built-ins before config's PRESETS)
from algos.advantages import scale_negative
from algos.agg import AGG_MODES, agg_loss, agg_scale
from algos.config import PRESETS, AlgoConfig, preset
from algos.correction import ORIGINS, correction_rule, mismatch_by_origin, mismatch_metrics, rollout_correction
from algos.distill import reverse_kl_sums, teacher_advantages
from algos.gigpo import (
    GIGPO_MODES,
    StepInfo,
    anchor_stats,
    discounted_returns,
    gigpo_advantages,
    step_group_advantages,
)
from algos.kl import entropy_from_logits, kl_penalty
from algos.policy_losses import gspo_token_log_ratio
from algos.registry import (
    UnknownNameError,
    adv_estimator_names,
    get_adv_estimator,
    get_policy_loss,
    policy_loss_names,
    register_adv_estimator,
    register_policy_loss,
)
from algos.rewards import group_has_signal, kl_in_reward, overlong_penalty, scalar_to_token_rewards
from algos.stats import masked_mean, masked_whiten
from algos.value import explained_variance, value_loss

__all__ = [
    "AGG_MODES",
    "GIGPO_MODES",
    "ORIGINS",
    "PRESETS",
    "AlgoConfig",
    "StepInfo",
    "UnknownNameError",
    "adv_estimator_names",
    "agg_loss",
    "agg_scale",
    "anchor_stats",
    "discounted_returns",
    "entropy_from_logits",
    "explained_variance",
    "get_adv_estimator",
    "get_policy_loss",
    "group_has_signal",
    "kl_in_reward",
    "gigpo_advantages",
    "gspo_token_log_ratio",
    "kl_penalty",
    "masked_mean",
    "masked_whiten",
    "mismatch_by_origin",
    "mismatch_metrics",
    "overlong_penalty",
    "policy_loss_names",
    "preset",
    "register_adv_estimator",
    "register_policy_loss",
    "reverse_kl_sums",
    "rollout_correction",
    "correction_rule",
    "scalar_to_token_rewards",
    "scale_negative",
    "step_group_advantages",
    "teacher_advantages",
    "value_loss",
]
