"""The run dir's checks: writable, no earlier run in it unless resumed or `--log.overwrite` (which moves it aside),
a `--resume` checkpoint complete and compatible, and room on the disk for `keep_ckpts` checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanosky.config import TrainConfig

from nanosky.preflight.errors import UsageError
from nanosky.preflight.model import _weight_files

CKPT_BYTES_PER_PARAM = 16  # fp32 weights (4) + AdamW moments (8) + the HF export (4)


def check_run_dir(run_dir: str) -> None:
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir):
            pass
    except OSError as e:
        raise UsageError(f"--log.run-dir {run_dir}: not writable ({e.strerror or e})") from None


def earlier_run(run_dir: str) -> str | None:
    """What of an earlier run `run_dir` holds ("2 checkpoints", "TensorBoard events"), or None."""
    p = Path(run_dir)
    ckpts = [c for c in (p / "checkpoints").glob("step_*") if c.is_dir()]
    if ckpts:
        return f"{len(ckpts)} checkpoint{'s' * (len(ckpts) > 1)}"
    if any(p.glob("events.out.tfevents.*")):
        return "TensorBoard events"
    return None


def check_fresh_run_dir(cfg: TrainConfig) -> None:
    """A fresh run (no --resume) must not mix with an earlier one: its checkpoints would sit beside the new ones,
    `latest` would move back, and TensorBoard would draw both runs as one."""
    if cfg.resume and cfg.log.overwrite:
        raise UsageError("--log.overwrite starts afresh and --resume continues: pass one of them")
    found = None if cfg.resume or cfg.log.overwrite else earlier_run(cfg.run_dir)
    if found:
        raise UsageError(
            f"--log.run-dir {cfg.run_dir} holds an earlier run ({found}): continue it with --resume latest, "
            "start elsewhere with a new --log.run-dir, or pass --log.overwrite to move it to a timestamped "
            "sibling folder"
        )


def move_aside(run_dir: str) -> str | None:
    """--log.overwrite: the earlier run in `run_dir` moves to `run_dir.<YYYYmmdd-HHMMSS>`; returns that path (None
    when there was nothing to move). Run once (rank 0)."""
    if earlier_run(run_dir) is None:
        return None
    import time

    base = f"{run_dir.rstrip('/')}.{time.strftime('%Y%m%d-%H%M%S')}"
    dest, n = base, 1
    while os.path.exists(dest):
        dest, n = f"{base}-{n}", n + 1
    os.rename(run_dir, dest)
    os.makedirs(run_dir)
    return dest


def check_resume(cfg: TrainConfig, world: int) -> None:
    from nanosky.train.checkpointer import resume_checkpoint

    try:
        resume_checkpoint(cfg, world)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e) if str(e).startswith("--resume") else f"--resume {cfg.resume}: {e}") from None


def check_disk(cfg: TrainConfig, folder: str, free_bytes: int | None = None) -> None:
    """Room for keep_ckpts checkpoints, plus the one being written before the oldest is pruned (`folder`: the
    model's, resolved)."""
    need = (cfg.log.keep_ckpts + 1) * CKPT_BYTES_PER_PARAM * _param_estimate(folder)
    free = shutil.disk_usage(cfg.run_dir).free if free_bytes is None else free_bytes
    if need > free:
        raise UsageError(
            f"--log.run-dir {cfg.run_dir}: {free / 2**30:.1f} GiB free, but {cfg.log.keep_ckpts} checkpoints "
            f"(--log.keep-ckpts) need about {need / 2**30:.1f} GiB"
        )


def _param_estimate(path: str) -> int:
    """Parameters from the weight files' size and the config's dtype (0 when the model is not local)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return 0  # a hub model's size is unknown until it is loaded
    try:
        dtype = json.loads((p / "config.json").read_text()).get("torch_dtype") or "float32"
    except (OSError, json.JSONDecodeError):
        dtype = "float32"
    size = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(dtype), 2)
    return sum(f.stat().st_size for f in _weight_files(p)) // size
