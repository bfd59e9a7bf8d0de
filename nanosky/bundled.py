"""The bundled models by name: `--model.path tiny` (or tiny-agent, tiny-tool, tiny-swe) is a folder in
nanosky/assets. The recipes that build them (`nanosky.tiny`) are imported only when a folder is missing, so the
training path never loads them.
"""

from __future__ import annotations

from pathlib import Path

BUNDLED = {"tiny": "base", "tiny-agent": "agent", "tiny-tool": "tool", "tiny-swe": "swe"}
"""Bundled model name -> its `python -m nanosky.tiny --variant`."""
ASSETS = Path(__file__).resolve().parent / "assets"


def resolve_model_path(path: str) -> str:
    """A model path or hub id as given; a bundled name as its folder (the committed copy, else built once into
    ~/.cache/nanosky by its recipe, no network)."""
    if path not in BUNDLED:
        return path
    if (ASSETS / path / "model.safetensors").exists():
        return str(ASSETS / path)
    from nanosky.tiny import ensure_tiny_model

    return str(ensure_tiny_model(variant=BUNDLED[path]))
