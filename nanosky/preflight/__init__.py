"""Start-up checks, run before anything heavy is built (no model, no engine, no process group): each failure is one
line that names the flag, and run.py exits with status 2 and no traceback.

    preflight.check(cfg)   # raises UsageError("--model.path /x: no such directory")

Checked: the model path (a local directory holds a config and weights; a hub id is cached or the hub is reachable),
its chat template (renders the roles; appends turns without rewriting earlier ones in concat mode),
`--env-data` (exists, parses, rows fit the env's schema, bad rows named by line), `--resume` (a complete, compatible
checkpoint), the run dir (writable, and no earlier run in it unless resumed or `--log.overwrite`) and the disk (room
for `keep_ckpts` checkpoints).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanosky import process
from nanosky.bundled import Folders
from nanosky.preflight.data import (
    check_agent,
    check_demonstrations,
    check_ecosystem_env,
    check_env_data,
)
from nanosky.preflight.errors import UsageError
from nanosky.preflight.judge import check_judge
from nanosky.preflight.model import (
    bf16_warning,
    check_architecture,
    check_chat_template,
    check_context,
    check_model,
    check_teacher,
)
from nanosky.preflight.run_dir import check_disk, check_fresh_run_dir, check_resume, check_run_dir, move_aside

__all__ = [  # what callers outside use, and `check`'s parts
    "UsageError",
    "bf16_warning",
    "check",
    "check_agent",
    "check_architecture",
    "check_chat_template",
    "check_context",
    "check_demonstrations",
    "check_disk",
    "check_ecosystem_env",
    "check_env_data",
    "check_fresh_run_dir",
    "check_judge",
    "check_model",
    "check_resume",
    "check_run_dir",
    "check_teacher",
    "move_aside",
]

if TYPE_CHECKING:
    from nanosky.config import TrainConfig


def check(cfg: TrainConfig, world: int | None = None) -> Folders:
    """Every check, in order; returns the run's model folders, resolved once here (what the trainer loads)."""
    # the run dir's checks first: they read a few files, where the model's load transformers (seconds)
    check_fresh_run_dir(cfg)
    check_run_dir(cfg.run_dir)
    if cfg.resume:
        check_resume(cfg, process.launch().world if world is None else world)
    folder = check_model("--model.path", cfg.model.path)
    check_architecture(cfg, folder)
    check_context(cfg, folder)
    check_chat_template(cfg, folder)
    check_agent(cfg)
    check_env_data(cfg.env, cfg.env_data)
    check_ecosystem_env(cfg, folder)
    check_demonstrations(cfg)
    teacher = check_teacher(cfg, folder)
    check_judge(cfg)
    check_disk(cfg, folder)
    return Folders(folder, teacher)
