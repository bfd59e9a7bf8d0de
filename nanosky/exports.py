"""Where a run keeps the models it trained: `RUN/checkpoints/latest` names the newest complete checkpoint, and each
`checkpoints/step_N/export/` is an HF folder (what `--model.path`, `--distill.teacher` and the evals' `--ckpt`
load). The checkpoints' own files and their atomic save are `nanosky/train/checkpoint_io.py`; this is the layout
that readers of a run need, below everything that reads one.

    find_export("runs/math-sft-s0")          # -> runs/math-sft-s0/checkpoints/step_000050/export
"""

from __future__ import annotations

import os
from pathlib import Path

LATEST = "latest"
"""The file in `checkpoints/` naming the newest complete checkpoint."""


def read_latest(root: str) -> str | None:
    """The checkpoint `root/latest` names (its directory's name), or None."""
    try:
        with open(os.path.join(root, LATEST)) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def in_run(path: str) -> bool:
    """A run dir (its `checkpoints/`) or one of its checkpoints (its `export/`)."""
    p = Path(path).expanduser()
    return (p / "checkpoints").is_dir() or (p / "export" / "config.json").is_file()


def find_export(path: str) -> str:
    """The HF model folder a user means by `path`: the folder itself (it holds config.json), a checkpoint
    (`checkpoints/step_N`: its `export/`), or a run dir (its latest checkpoint's `export/`). Raises
    FileNotFoundError with one line that says what it found instead."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"{path}: no such directory")
    if (p / "config.json").is_file() and not (p / "checkpoints").is_dir():  # a run dir has its own config.json
        return str(p)
    if (p / "export" / "config.json").is_file():
        return str(p / "export")
    root = p / "checkpoints"
    if root.is_dir():
        latest = read_latest(str(root))
        steps = sorted(c.name for c in root.glob("step_*") if (c / "export" / "config.json").is_file())
        name = latest if latest in steps else (steps[-1] if steps else None)
        if name is None:
            raise FileNotFoundError(f"{path}: a run dir with no complete checkpoint in checkpoints/ yet")
        return str(root / name / "export")
    seen = sorted(x.name + "/" * x.is_dir() for x in p.iterdir())
    shown = ", ".join(seen[:6]) + (f", … ({len(seen)} entries)" if len(seen) > 6 else "") if seen else "nothing"
    raise FileNotFoundError(
        f"{path}: not a model folder (config.json), a checkpoint (export/) or a run dir (checkpoints/); "
        f"it holds {shown}"
    )
