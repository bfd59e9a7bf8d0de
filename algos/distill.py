"""On-policy distillation: the student samples, a teacher scores the sampled tokens, and the per-token log-ratio
log π_T(y_t) − log π_S(y_t) is the advantage (Agarwal et al., GKD, arXiv 2306.13649; Gu et al., MiniLLM; Thinking
Machines' on-policy distillation recipe). Its mean over the student's own samples is minus the reverse KL,
KL(π_S ‖ π_T) = E_{y~π_S}[log π_S(y) − log π_T(y)], so the policy gradient of these advantages descends the reverse
KL: mode-seeking, and dense (every token gets its own signal, where an outcome reward gives one per episode)."""

from __future__ import annotations

import torch
from torch import Tensor


def teacher_advantages(
    teacher_logprobs: Tensor,
    student_logprobs: Tensor,
    response_mask: Tensor,
    env_advantages: Tensor | None = None,
    reward_weight: float = 0.0,
) -> Tensor:
    """A_t = m_t · (log π_T(y_t) − log π_S(y_t)) + w · A^env_t.  All [B, T].

    The log-ratio is a constant of the update (no gradient flows into either model through it); `env_advantages`
    (the run's estimator on the env's reward, e.g. GRPO's) mixes the task's own signal in at weight w. Where the
    teacher is the student, every advantage is exactly 0: no signal, no update."""
    m = response_mask.to(teacher_logprobs.dtype)
    adv = (teacher_logprobs - student_logprobs).detach() * m
    if reward_weight and env_advantages is not None:
        adv = adv + reward_weight * env_advantages * m
    return adv


@torch.no_grad()
def reverse_kl_sums(teacher_logprobs: Tensor, student_logprobs: Tensor, response_mask: Tensor) -> tuple[float, float]:
    """(Σ_t m_t (log π_S − log π_T), Σ_t m_t) over the batch: the sample estimate of KL(π_S ‖ π_T) per token, as a
    sum and a count so that ranks add them before dividing (a mean over zero tokens is then NaN, never 0)."""
    m = response_mask.to(teacher_logprobs.dtype)
    return float(((student_logprobs - teacher_logprobs) * m).sum()), float(m.sum())
