"""The bundled models by name: `--model.path tiny` (or tiny-agent, tiny-tool, tiny-swe) is a folder in
nanosky/assets (or one built into ~/.cache/nanosky by `python -m nanosky.tiny`). Nothing is built here: a training
run or an eval that finds its bundled model missing says so in one line, with the command that builds it, instead
of starting a multi-minute build of its own.
"""

from __future__ import annotations

from pathlib import Path

BUNDLED = {"tiny": "base", "tiny-agent": "agent", "tiny-tool": "tool", "tiny-swe": "swe"}
"""Bundled model name -> its `python -m nanosky.tiny --variant`."""
ASSETS = Path(__file__).resolve().parent / "assets"


class MissingBundledModel(FileNotFoundError):
    """A bundled model that is neither committed nor built."""


def resolve_model_path(path: str) -> str:
    """A model path or hub id as given; a bundled name as its folder: the committed copy, else the one
    `python -m nanosky.tiny` built into ~/.cache/nanosky. Raises `MissingBundledModel` naming that command."""
    if path not in BUNDLED:
        return path
    if (ASSETS / path / "model.safetensors").exists():
        return str(ASSETS / path)
    from nanosky.tiny import built_model

    built = built_model(BUNDLED[path])
    if built is None:
        raise MissingBundledModel(
            f"bundled model {path!r} is missing ({ASSETS / path} has no model.safetensors, and none is built in "
            f"~/.cache/nanosky): build it once with `python -m nanosky.tiny --variant {BUNDLED[path]}`"
        )
    return str(built)
