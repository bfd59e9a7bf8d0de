"""On-policy distillation's trainer side: the teacher, loaded where a KL reference is held (frozen, sharded like the
policy), scores the tokens the student sampled; its per-token log-ratio becomes the batch's advantage
(`algos.teacher_advantages`). The sampling, the env pool, the update and the checkpoints are the RL run's own."""

from __future__ import annotations

import algos
from nanosky import dist
from nanosky.config.model import OptimConfig
from nanosky.dist import DistInfo
from nanosky.precision import Precision
from nanosky.train.batch import Batch
from nanosky.train.policy import load_model
from nanosky.train.update import forward_logprobs


def load_teacher(path: str, info: DistInfo, *, precision: Precision):
    """The teacher from its resolved folder, frozen: any size, another architecture too (its tokenizer is the
    student's: `preflight.check_teacher`). Nothing of it is checkpointed; a resume loads it again from the path."""
    return load_model(path, info, trainable=False, precision=precision)


def teacher_signal(teacher, policy, batch: Batch, optim: OptimConfig, reward_weight: float) -> dict[str, float]:
    """Replace this rank's advantages with the teacher's per-token log-ratio (plus `reward_weight` times the env
    reward's, already on `batch`). The student's log-probs come from the trainer's forward, the teacher's path
    exactly, not the engine's sampling log-probs: a teacher that is the student then gives 0 on every token, and
    the update's behaviour policy (`old_logprobs`) is that same forward (r = 1). Returns `distill/*` over all ranks:
    the reverse KL per token, KL(π_S ‖ π_T), NaN where no token was sampled."""
    teacher_lp = forward_logprobs(teacher, batch, optim)  # [B, L-1]
    batch.old_logprobs = forward_logprobs(policy, batch, optim)  # [B, L-1]
    kl_sum, n = dist.all_reduce_sum(list(algos.reverse_kl_sums(teacher_lp, batch.old_logprobs, batch.loss_mask)))
    batch.advantages = algos.teacher_advantages(
        teacher_lp, batch.old_logprobs, batch.loss_mask, env_advantages=batch.advantages, reward_weight=reward_weight
    )
    return {"distill/reverse_kl": kl_sum / n if n else float("nan")}
