"""The run's checkpoints: when to save, what goes in, the HF export beside it, and resume.

    ckpt = Checkpointer(cfg, info, tok=tok, policy=policy, update=update, critic=critic, critic_update=critic_update)
    state = ckpt.resume()                       # --resume latest | PATH: weights, optimizer, schedule, RNG, run state
    if ckpt.due(step): ckpt.save(step, version, acc0)    # --log.ckpt-every k (the last step is the run's close)
    ckpt.save_once(step, version, acc0)         # a graceful stop, the close: unless saved already or no step ran

The files and their atomic save are `nanosky/train/checkpoint_io.py`; this module knows the run: which models and
optimizers (the critic's too), which config fields a resume must match, and the export (`step_N/export`, what
`python -m evals.* --ckpt` and vLLM load: an HF model, plus the peft adapter when training LoRA).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from nanosky.train.checkpoint_io import (
    check_compatible,
    load_checkpoint,
    read_state,
    resolve_checkpoint,
    save_checkpoint,
)
from nanosky.train.lora import save_adapter, save_merged

if TYPE_CHECKING:
    import torch

    from nanosky.config import TrainConfig
    from nanosky.dist import DistInfo
    from nanosky.train.critic import Critic, CriticUpdate
    from nanosky.train.update import PolicyUpdate

RESUME_FIELDS = [
    "model.path",
    "world_size",
    "lora.rank",
    "lora.alpha",
    "lora.target_modules",
    "algorithm.name",
    "algorithm.adv_estimator",
    "algorithm.policy_loss",
    "env",
    "seed",
    "rollout.prompts_per_step",
    "rollout.group_size",
]
"""Config fields a resumed run must share with its checkpoint (the others may change, e.g. the LR or the steps)."""


def resume_checkpoint(cfg: TrainConfig, world: int) -> str:
    """The checkpoint `--resume` names; raises FileNotFoundError if there is none, ValueError if its config differs
    in a field that breaks resume (also run by `nanosky.preflight` before anything is built)."""
    path = resolve_checkpoint(os.path.join(cfg.run_dir, "checkpoints"), cfg.resume)
    saved = read_state(path)
    check_compatible(
        saved["config"] | {"world_size": saved["world_size"]},
        dataclasses.asdict(cfg) | {"world_size": world},
        RESUME_FIELDS,
    )
    return path


class Checkpointer:
    def __init__(
        self,
        cfg: TrainConfig,
        info: DistInfo,
        *,
        tok,
        policy: torch.nn.Module,
        update: PolicyUpdate,
        critic: Critic | None = None,
        critic_update: CriticUpdate | None = None,
        export_dtype: torch.dtype | None = None,
    ):
        """`export_dtype`: the HF export's (the checkpoint's, `policy.checkpoint_dtype`); None keeps fp32."""
        self.cfg, self.info, self.tok, self.policy, self.update = cfg, info, tok, policy, update
        self.export_dtype = export_dtype
        self.extras = {}
        if critic is not None:
            self.extras = {
                "extra_models": {"critic": critic},
                "extra_optimizers": {"critic": critic_update.opt},
            }
        self.root = os.path.join(cfg.run_dir, "checkpoints")
        self.last_saved = 0  # the step whose state is on disk (the resumed one, after a resume)
        self.last_path: str | None = None  # its checkpoint directory (None: nothing saved or resumed yet)

    def due(self, step: int) -> bool:
        """`--log.ckpt-every k`: every k steps; the last step's checkpoint is written at the run's close."""
        every = self.cfg.log.ckpt_every
        return bool(every) and step % every == 0 and step != self.cfg.steps

    def drains(self, step: int) -> bool:
        """Whether a checkpoint follows `step` (a due one, or the run's last): partial rollouts then finish every
        episode they started, so the checkpoint holds none in flight."""
        return self.due(step) or step == self.cfg.steps

    def resume(self) -> dict:
        """Restore model, optimizer, schedule and every RNG state; returns the run state (step, version, acc0)."""
        path = resume_checkpoint(self.cfg, self.info.world)
        state = load_checkpoint(
            path, model=self.policy, optimizer=self.update.opt, scheduler=self.update.sched, **self.extras
        )
        self.last_saved, self.last_path = state["step"], path
        return state | {"path": path}

    def save(self, step: int, version: int, acc0: float | None) -> str:
        """An atomic training checkpoint with its HF export in step_N/export; returns the export's path."""
        state = {
            "step": step,
            "version": version,
            "acc0": acc0,
            "config": dataclasses.asdict(self.cfg),
            "world_size": self.info.world,
        }
        path = save_checkpoint(
            self.root,
            step,
            model=self.policy,
            optimizer=self.update.opt,
            scheduler=self.update.sched,
            state=state,
            keep=self.cfg.log.keep_ckpts,
            export=self.export,
            **self.extras,
        )
        self.last_saved, self.last_path = step, path
        return os.path.join(path, "export")

    def save_once(self, step: int, version: int, acc0: float | None) -> str | None:
        """`step`'s checkpoint at a graceful stop or the run's close, unless it is on disk already (the schedule wrote
        it, or a resume loaded it): its export's path. None where no step ran at all (`--steps 0`, an eval of the
        model as loaded: its weights are the input's, and a copy with an optimizer state would be GiBs of nothing)."""
        if step == self.last_saved:
            return os.path.join(self.last_path, "export") if self.last_path else None
        return self.save(step, version, acc0)

    def export(self, d: str) -> None:
        """The policy as an HF model in `d` (LoRA: merged, plus the adapter in d/adapter)."""
        if self.cfg.lora.enabled:
            save_adapter(self.policy, os.path.join(d, "adapter"))
        save_merged(self.policy, self.tok, d, self.export_dtype)  # gathered in turn; rank 0 writes
