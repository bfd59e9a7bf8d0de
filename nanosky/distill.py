"""On-policy distillation, one component (`--distill.teacher PATH`, `--algo distill`): the teacher, loaded where a
KL reference is held (frozen, sharded like the policy), scores the tokens the student sampled; its per-token
log-ratio is the advantage source that stands beside the run's estimator (`algos.teacher_advantages`, plus
`--distill.reward-weight` times the estimator's on the env reward); and the teacher's own held-out accuracy at step
0 is the mark the student is distilled towards. The sampling, the env pool, the update and the checkpoints are the
RL run's own.

    distill = Distillation.load(cfg.distill, folder, info, precision=prec)   # when cfg.distill.on
    distill.heldout(run)                                      # step 0: distill/teacher_* (same-shaped teachers)
    adv, student_lp, metrics = distill.advantages(policy, batch, env_advantages, optim)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import algos
from nanosky import dist
from nanosky.config.distill import DistillConfig
from nanosky.config.model import OptimConfig
from nanosky.sync import sync_weights
from nanosky.train.batch import Batch
from nanosky.train.lora import base_model
from nanosky.train.policy import load_model
from nanosky.train.update import forward_logprobs

if TYPE_CHECKING:
    import torch

    from nanosky.dist import DistInfo
    from nanosky.precision import Precision

# what fixes a model's parameter names and shapes: a teacher that matches these loads into the student's engine
SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
    "num_experts",
    "moe_intermediate_size",
)


def shape_difference(student_config, teacher_config) -> str | None:
    """The first config field where the two models' weights differ in shape, as "key A (student) vs B (teacher)"."""
    for key in SHAPE_KEYS:
        a, b = getattr(student_config, key, None), getattr(teacher_config, key, None)
        if a != b:
            return f"{key} {a} (student) vs {b} (teacher)"
    return None


class Distillation:
    def __init__(self, cfg: DistillConfig, teacher: torch.nn.Module):
        self.cfg, self.teacher = cfg, teacher

    @classmethod
    def load(cls, cfg: DistillConfig, folder: str, info: DistInfo, *, precision: Precision) -> Distillation:
        """The teacher from its resolved folder, frozen: any size, another architecture too (its tokenizer is the
        student's: `preflight.check_teacher`). Nothing of it is checkpointed; a resume loads it again."""
        return cls(cfg, load_model(folder, info, trainable=False, precision=precision))

    def advantages(
        self, policy, batch: Batch, env_advantages: torch.Tensor, optim: OptimConfig
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """This rank's advantages: the teacher's per-token log-ratio, plus `reward_weight` times `env_advantages`
        (the run's estimator on the env reward). Returns them [B, L-1], the student's log-probs [B, L-1] (the
        update's behaviour policy: the trainer's own forward, not the engine's sampling log-probs, so a teacher that
        is the student gives 0 on every token and r = 1), and `distill/*` over all ranks: the reverse KL per token,
        KL(π_S ‖ π_T), NaN where no token was sampled."""
        teacher_lp = forward_logprobs(self.teacher, batch, optim)  # [B, L-1]
        student_lp = forward_logprobs(policy, batch, optim)  # [B, L-1]
        kl_sum, n = dist.all_reduce_sum(list(algos.reverse_kl_sums(teacher_lp, student_lp, batch.loss_mask)))
        adv = algos.teacher_advantages(
            teacher_lp, student_lp, batch.loss_mask, env_advantages=env_advantages, reward_weight=self.cfg.reward_weight
        )
        return adv, student_lp, {"distill/reverse_kl": kl_sum / n if n else float("nan")}

    def heldout(self, run) -> float | None:
        """The teacher's own held-out accuracy at step 0 (`distill/teacher_*`). The run's engine serves the
        student's architecture: a teacher of the same shapes is pushed into it (`run`: the trainer's Run),
        evaluated exactly as the student is (the same episodes and sampling seeds), and the student pushed back,
        both pushes probed: the number is the teacher's, and the run goes on with the student. Returns the
        headline, or None: a dry run without evals, or another architecture (one line names the difference and the
        command that evaluates it)."""
        evaluator = run.evaluator
        if not evaluator.at_start:
            return None
        if why := shape_difference(base_model(run.policy).config, base_model(self.teacher).config):
            run.log.print(
                f"distill: the teacher's held-out accuracy is not computed in-run ({why}; the engine serves the "
                f"student's shapes): `python -m evals.<env> --ckpt {self.cfg.teacher}` gives it"
            )
            return None
        sync_weights(self.teacher, run.engine, run.version, run.probe)  # probed: the engine serves the teacher
        acc = evaluator(0, run.version, prefix="distill/teacher_", label="the teacher's eval", rollouts=False)
        sync_weights(run.policy, run.engine, run.version, run.probe)  # probed: the student again, for its own eval
        return acc
