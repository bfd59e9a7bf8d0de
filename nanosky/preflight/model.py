"""The model's checks: `--model.path` and `--distill.teacher` exist (a folder with a config and weights, a run, a GGUF, a
name, a cached hub id), the CPU engine can run the architecture, the context fits its positions, the chat template
renders and appends, and a teacher tokenizes as the student does."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanosky.config import TrainConfig

from nanosky.preflight.errors import UsageError


def check_model(flag: str, path: str) -> str:
    """The model's folder, resolved (a name, a GGUF file: converted here, once, under a lock; a run: its export), or
    the path as given where it is a folder or a hub id; what the later checks and the run load."""
    from nanosky.bundled import resolve_model_path
    from nanosky.gguf import GGUFError

    try:
        folder = resolve_model_path(path)
    except (FileNotFoundError, GGUFError) as e:  # not built, not installed, or a run with no checkpoint yet
        raise UsageError(f"{flag} {e}") from None
    if folder != path:  # a name, a GGUF file or a run: its folder was made or found
        return folder
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{flag} {path}: not a directory")
        if not (p / "config.json").is_file():
            raise UsageError(f"{flag} {path}: no config.json in that directory")
        if not _weight_files(p):
            raise UsageError(f"{flag} {path}: no weights in that directory (*.safetensors or pytorch_model*.bin)")
        return path
    if path.startswith(("/", ".", "~")) or path.count("/") != 1:
        raise UsageError(f"{flag} {path}: no such directory (and not a hub id of the form org/name)")
    if _hub_cached(path):
        return path
    if os.environ.get("HF_HUB_OFFLINE") == "1" or _connect("huggingface.co") is not None:
        raise UsageError(
            f"{flag} {path}: not a local directory, not in the Hugging Face cache, and the hub cannot be reached "
            "(no network); download it elsewhere and pass its directory"
        )
    return path


GDN = "its Gated DeltaNet linear-attention layers"
BF16_ONLY_ON_CPU = {kind: GDN for kind in ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")}
"""Architectures vLLM 0.32's CPU build runs only in bf16, by `model_type` (its CPU GDN kernel asserts "requires BF16");
the CPU engine computes in fp32, where a correct engine matches the trainer to ~1e-6."""


NOT_ON_CPU = {
    "mla": "its multi-head latent attention does not match transformers' on vLLM's CPU build (the AMX backend takes "
    "bf16 weights only; the reference backend parts from transformers after the first position, by up to 2.7 nats "
    "on a 2-layer model)",
    "apertus": "vLLM keeps its xIELU activation's learned alphas in bf16 while the CPU engine computes in fp32 (1.3e-3 "
    "off on a 2-layer model, and more as training moves them)",
    "gpt_oss": "vLLM's CPU engine takes no weight sync for it (its attention sinks and routed experts log 'Failed to "
    "load weights', and the engine keeps serving the old ones)",
}
"""Architectures the CPU engine cannot serve as the trainer computes them, whatever the dtype: MLA (DeepSeek-V2/V3,
Kimi: any config with `kv_lora_rank`), Apertus and GPT-OSS. Measured with vLLM 0.32 (tests/integration/test_families.py's
REFUSED); on CUDA the calibrated build probe decides."""


def cpu_refusal(conf: dict, dtype: str) -> str | None:
    """Why the CPU engine cannot run this model config (config.json as a dict) in `dtype`, or None."""
    kind = conf.get("model_type", "")
    if kind in BF16_ONLY_ON_CPU and dtype != "bfloat16":
        return (
            f"vLLM's CPU build runs {BF16_ONLY_ON_CPU[kind]} only in bf16, and the engine here computes in {dtype} "
            "(--precision bf16 runs engine and trainer in bf16)"
        )
    if conf.get("kv_lora_rank"):
        return NOT_ON_CPU["mla"]
    return NOT_ON_CPU.get(kind)


def check_architecture(cfg: TrainConfig, folder: str) -> None:
    """Refuse, by name, a local model the engine cannot run here (before a traceback from inside vLLM, or a run on
    an engine that disagrees with the trainer). `folder`: the model's, as `check_model` resolved it."""
    p = Path(folder).expanduser() / "config.json"
    if not p.is_file():
        return

    import torch

    if torch.cuda.is_available():
        return
    conf = json.loads(p.read_text())
    from nanosky.precision import decide, engine_dtype

    dtype = engine_dtype(cfg.engine.dtype, decide(cfg.precision, "cpu"))  # on the CPU (CUDA returned above)
    why = cpu_refusal(conf, dtype)
    if why:
        arch = (conf.get("architectures") or [conf.get("model_type", "this model")])[0]
        raise UsageError(f"--model.path {cfg.model.path}: {arch} is not supported on the CPU: {why}; train it on a GPU")


def bf16_warning(cfg: TrainConfig) -> str | None:
    """The line a run starts with when it asks for bf16 on a CPU that emulates it (`precision.emulation_warning`);
    None on CUDA and wherever bf16 is not asked for or runs in hardware."""
    import torch

    from nanosky.precision import decide, emulation_warning

    if torch.cuda.is_available():
        return None
    return emulation_warning(decide(cfg.precision, "cpu"), cfg.engine.dtype)


def check_context(cfg: TrainConfig, folder: str) -> None:
    """--engine.max-model-len within the model's positions (config.json's max_position_embeddings), before vLLM
    refuses it from inside the engine with a traceback. A config that scales its positions (rope_scaling) is left to
    vLLM, which knows each scaling's rule."""
    p = Path(folder).expanduser() / "config.json"
    if not p.is_file():
        return
    conf = json.loads(p.read_text())
    conf = conf.get("text_config") or conf
    limit = conf.get("max_position_embeddings")
    if isinstance(limit, int) and not conf.get("rope_scaling") and cfg.engine.max_model_len > limit:
        raise UsageError(
            f"--engine.max-model-len {cfg.engine.max_model_len} exceeds the model's context ({limit} positions, "
            f"max_position_embeddings in {p}); set it to at most {limit}, and --rollout.max-total-tokens with it"
        )


def check_chat_template(cfg: TrainConfig, folder: str) -> None:
    """The chat template the run will use renders the roles, and appends turns as concat mode needs."""
    from nanosky.rollout.chat import TemplateError, check_template, load_tokenizer

    file = cfg.model.chat_template
    if file and not Path(file).is_file():
        raise UsageError(f"--model.chat-template {file}: no such file")
    try:
        tok = load_tokenizer(folder, file)
    except Exception:  # noqa: BLE001 - a tokenizer only the build can fetch (a hub id)
        return
    # an external agent's calls that a template does not extend append-only become new segments (step-wise rows)
    external = cfg.rollout.agent or cfg.rollout.agent_cmd
    try:
        check_template(tok, "stepwise" if external else cfg.rollout.mode)
    except TemplateError as e:
        raise UsageError(f"--model.path {cfg.model.path}: {e}") from None


def check_teacher(cfg: TrainConfig, student_folder: str) -> str | None:
    """`--distill.teacher`: the teacher exists (a folder, a run, a GGUF or a name, as `--model.path`) and tokenizes
    as the student does. The teacher scores the student's token ids, so one id must be one string under both;
    another tokenizer is refused in one line, before any model loads. Returns the teacher's folder (None: no
    teacher)."""
    if cfg.distill.teacher is None:
        return None
    folder = check_model("--distill.teacher", cfg.distill.teacher)
    from nanosky.rollout.chat import load_tokenizer

    student = load_tokenizer(student_folder).get_vocab()
    teacher = load_tokenizer(folder).get_vocab()
    if teacher != student:
        moved = sum(teacher.get(t) != i for t, i in student.items())
        raise UsageError(
            f"--distill.teacher {cfg.distill.teacher}: its tokenizer is not the student's ({cfg.model.path}): vocabularies "
            f"of {len(teacher)} and {len(student)} tokens, {moved} of the student's with another id or none; "
            "distillation scores the student's token ids under the teacher, so both need one tokenizer"
        )
    return folder


def _weight_files(p: Path) -> list[Path]:
    return [*p.glob("*.safetensors"), *p.glob("pytorch_model*.bin")]


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - a malformed id is "not cached"
        return False


def _connect(host: str, port: int = 443, timeout_s: float = 3.0) -> OSError | None:
    """Why a TCP connection to host:port fails, or None where it opens."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except OSError as e:
        return e
