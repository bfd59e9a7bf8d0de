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

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanosky.config import TrainConfig

CKPT_BYTES_PER_PARAM = 16  # fp32 weights (4) + AdamW moments (8) + the HF export (4)
DATA_ROWS_CHECKED = 1000


class UsageError(Exception, SystemExit):
    """A bad flag or input: run.py prints it as one line and exits with status 2. An Exception, and also a
    SystemExit, as argparse's and tyro's parse errors are: a caller of `parse_args` that stops on those stops on
    this too, and uncaught it prints its line and exits (status 1) without a traceback."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.code = msg


def check(cfg: TrainConfig, world: int | None = None) -> None:
    # the run dir's checks first: they read a few files, where the model's load transformers (seconds)
    check_fresh_run_dir(cfg)
    check_run_dir(cfg.run_dir)
    if cfg.resume:
        check_resume(cfg, int(os.environ.get("WORLD_SIZE", "1")) if world is None else world)
    check_model("--model.path", cfg.model.path)
    check_architecture(cfg)
    check_context(cfg)
    check_chat_template(cfg)
    check_agent(cfg)
    check_env_data(cfg.env, cfg.env_data)
    check_ecosystem_env(cfg)
    check_demonstrations(cfg)
    check_judge(cfg)
    check_disk(cfg)


def check_model(flag: str, path: str) -> None:
    from nanosky.bundled import by_name, resolve_model_path
    from nanosky.gguf import GGUFError

    if by_name(path):  # a bundled or real model by name, or a GGUF file (converted here, once, under a lock)
        try:
            resolve_model_path(path)
        except (FileNotFoundError, GGUFError) as e:  # not built, not installed, or a run with no checkpoint yet
            raise UsageError(f"{flag} {e}") from None
        return
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{flag} {path}: not a directory")
        if not (p / "config.json").is_file():
            raise UsageError(f"{flag} {path}: no config.json in that directory")
        if not _weight_files(p):
            raise UsageError(f"{flag} {path}: no weights in that directory (*.safetensors or pytorch_model*.bin)")
        return
    if path.startswith(("/", ".", "~")) or path.count("/") != 1:
        raise UsageError(f"{flag} {path}: no such directory (and not a hub id of the form org/name)")
    if _hub_cached(path):
        return
    if os.environ.get("HF_HUB_OFFLINE") == "1" or _connect("huggingface.co") is not None:
        raise UsageError(
            f"{flag} {path}: not a local directory, not in the Hugging Face cache, and the hub cannot be reached "
            "(no network); download it elsewhere and pass its directory"
        )


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


def model_folder(path: str) -> str:
    """What the later checks read for `--model.path`: a named model's folder (bundled, real by name, a GGUF file's
    conversion; `check_model` has made it), else the path as given. Never the name itself: a name is not a hub id,
    and asking the hub for it stalls an offline start for a minute of retries."""
    from nanosky.bundled import by_name, resolve_model_path

    if not by_name(path):
        return path
    try:
        return resolve_model_path(path)
    except FileNotFoundError:  # check_model has said so (a bundled model not built, a run with no checkpoint yet)
        return str(Path(path) / "missing")


def check_architecture(cfg: TrainConfig) -> None:
    """Refuse, by name, a local model the engine cannot run here (before a traceback from inside vLLM, or a run on
    an engine that disagrees with the trainer)."""
    p = Path(model_folder(cfg.model.path)).expanduser() / "config.json"
    if not p.is_file():
        return
    import json

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


def check_context(cfg: TrainConfig) -> None:
    """--engine.max-model-len within the model's positions (config.json's max_position_embeddings), before vLLM
    refuses it from inside the engine with a traceback. A config that scales its positions (rope_scaling) is left to
    vLLM, which knows each scaling's rule."""
    import json

    p = Path(model_folder(cfg.model.path)).expanduser() / "config.json"
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


def check_chat_template(cfg: TrainConfig) -> None:
    """The chat template the run will use renders the roles, and appends turns as concat mode needs."""
    from nanosky.rollout.chat import TemplateError, check_template, load_tokenizer

    file = cfg.model.chat_template
    if file and not Path(file).is_file():
        raise UsageError(f"--model.chat-template {file}: no such file")
    try:
        tok = load_tokenizer(model_folder(cfg.model.path), file)
    except Exception:  # noqa: BLE001 - a bundled model not built yet, or a tokenizer only the build can fetch
        return
    # an external agent's calls that a template does not extend append-only become new segments (step-wise rows)
    external = cfg.rollout.agent or cfg.rollout.agent_cmd
    try:
        check_template(tok, "stepwise" if external else cfg.rollout.mode)
    except TemplateError as e:
        raise UsageError(f"--model.path {cfg.model.path}: {e}") from None


def check_agent(cfg: TrainConfig) -> None:
    """--rollout.agent imports and names a function; --rollout.agent-cmd's program exists."""
    import shlex

    from nanosky.endpoint.harness import AgentError, load_agent

    if cfg.rollout.agent:
        try:
            load_agent(cfg.rollout.agent)
        except AgentError as e:
            raise UsageError(f"--rollout.agent {e}") from None
    if cmd := cfg.rollout.agent_cmd:
        try:
            program = shlex.split(cmd)[0] if cmd.strip() else ""
        except ValueError as e:
            raise UsageError(f"--rollout.agent-cmd {cmd!r}: {e}") from None
        if not program or (shutil.which(program) is None and not os.path.isfile(program)):
            raise UsageError(f"--rollout.agent-cmd {cmd!r}: no program {program!r} on PATH or in the working directory")


def check_env_data(env: str, path: str | None) -> None:
    """The file exists and its first rows parse and fit the env's schema (text_math: GSM8K rows)."""
    if path is None:
        if env in DATA_ENVS:
            raise UsageError(
                f"--env {env} needs a data file: --env-data FILE (parquet, jsonl, json, csv or a "
                "folder written by Dataset.save_to_disk)"
            )
        return
    if env in DATA_ENVS:
        if not Path(path).expanduser().exists():
            raise UsageError(f"--env-data {path}: no such file or folder")
        return  # read and checked row by row by check_ecosystem_env
    if env != "math":
        raise UsageError(f"--env-data: env {env!r} takes no data file (math, dataset and skyrl_gym read one)")
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--env-data {path}: no such file")
    bad, n = [], 0
    with p.open(encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            n += 1
            if why := _gsm8k_row_error(line):
                bad.append(f"line {lineno}: {why}")
            if n >= DATA_ROWS_CHECKED:
                break
    if n == 0:
        raise UsageError(f"--env-data {path}: the file has no rows")
    if len(bad) == n:
        raise UsageError(f"--env-data {path}: no valid row among the first {n} ({'; '.join(bad[:3])})")
    if bad:
        shown = "; ".join(bad[:5]) + (f"; … {len(bad) - 5} more" if len(bad) > 5 else "")
        raise UsageError(f"--env-data {path}: {len(bad)} bad row(s) among the first {n}: {shown}")


def _gsm8k_row_error(line: str) -> str | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return f"not JSON ({e.msg})"
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row["question"].strip():
        return 'no "question" string'
    if not isinstance(row.get("answer"), str) or "####" not in row["answer"]:
        return 'no "answer" string with "#### <final answer>"'
    if not row["answer"].rsplit("####", 1)[1].strip():
        return 'empty final answer after "####"'
    return None


DATA_ENVS = ("dataset", "skyrl_gym")
ECOSYSTEM_ENVS = (*DATA_ENVS, "reasoning_gym", "textarena")


def check_demonstrations(cfg: TrainConfig) -> None:
    """SFT (`--algo sft`) trains on the env's own expert: an env without one is refused by name, before any model
    loads, with the envs that have one."""
    import envs

    if cfg.demonstrations and not envs.has_expert(cfg.env):
        having = ", ".join(n for n in envs.env_names() if envs.has_expert(n))
        raise UsageError(
            f"--algo sft: env {cfg.env!r} has no scripted expert to demonstrate it (Env.expert_action); "
            f"envs with one: {having}"
        )


def check_ecosystem_env(cfg: TrainConfig) -> None:
    """An ecosystem env (envs/ecosystem/) builds one train and one test episode from the run's env kwargs: a missing
    package (naming the extra), file or column, an unknown env class, task or game, a bad reward function or an
    unknown kwarg is one line here, not a traceback at step 1."""
    if cfg.env not in ECOSYSTEM_ENVS:
        return
    import envs

    try:
        for split in ("train", "test"):
            envs.make(cfg.env, split=split, seed=0, **cfg.env_args()).close()
    except (ValueError, ImportError, TypeError, KeyError) as e:
        msg = " ".join(str(e).split())
        raise UsageError(msg if msg.startswith(("--", cfg.env)) else f"--env {cfg.env}: {msg}") from None
    if cfg.env in DATA_ENVS:
        check_prompt_lengths(cfg)


def check_prompt_lengths(cfg: TrainConfig) -> None:
    """A data file none of whose first rows' prompts leaves room for a reply under --rollout.max-total-tokens is
    refused (every episode would be skipped); rows that do not fit are skipped at run time, counted in
    `rollout/prompt_too_long`."""
    import envs
    from nanosky.rollout.chat import load_tokenizer, prompt_ids

    try:
        tok = load_tokenizer(model_folder(cfg.model.path), cfg.model.chat_template)
    except Exception:  # noqa: BLE001 - a bundled model not built yet: the run's own load says so
        return
    limit, lengths, seed, n = cfg.rollout.max_total_tokens, [], 0, 1
    while seed < min(n, DATA_ROWS_CHECKED):  # the train rows in order (seed i is row i)
        env = envs.make(cfg.env, split="train", seed=seed, **cfg.env_args())
        n, seed = env.n_rows, seed + 1
        lengths.append(len(prompt_ids(tok, env.reset(), [t.schema for t in env.tools] or None)))
        env.close()
        if lengths[-1] < limit:
            return
    raise UsageError(
        f"--env-data {cfg.env_data}: none of the first {len(lengths)} rows' prompts fits "
        f"--rollout.max-total-tokens {limit} (the shortest takes {min(lengths)} tokens with the chat "
        "template); raise it, with --engine.max-model-len"
    )


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


def check_disk(cfg: TrainConfig, free_bytes: int | None = None) -> None:
    """Room for keep_ckpts checkpoints, plus the one being written before the oldest is pruned."""
    need = (cfg.log.keep_ckpts + 1) * CKPT_BYTES_PER_PARAM * _param_estimate(model_folder(cfg.model.path))
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


def _weight_files(p: Path) -> list[Path]:
    return [*p.glob("*.safetensors"), *p.glob("pytorch_model*.bin")]


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - a malformed id is "not cached"
        return False


def check_judge(cfg: TrainConfig) -> None:
    """--reward.judge-url: a server answers there (any HTTP status: it may want a key), before a run whose every group
    would be masked; `self`: a judgement of a whole group fits its token budget, and the budget the context."""
    r = cfg.reward
    if not _has_checker(cfg.env) and (r.judge == "off" or not r.judge_only):
        raise UsageError(
            f"--env {cfg.env} has no checker: its reward is always 0, so only a judge can score it. Train it "
            "with --reward.judge group --reward.judge-url URL|self --reward.judge-only"
        )
    if r.judge == "off":
        return
    from nanosky.judge import SEPARATOR_SLACK
    from nanosky.judge.prompt import JudgeError, bounded_schema

    try:  # one judgement of a whole group must fit the budget, whoever judges (a server may add spaces)
        bounded_schema(
            cfg.rollout.group_size if r.judge == "group" else None,
            r.judge_max_tokens,
            slack=0 if r.judge_url == "self" else SEPARATOR_SLACK,
        )
    except JudgeError as e:
        raise UsageError(str(e)) from None
    if r.judge_url == "self":
        if r.judge_max_tokens >= cfg.engine.max_model_len:
            raise UsageError(
                f"--reward.judge-max-tokens {r.judge_max_tokens} leaves no room for the judge's prompt in "
                f"--engine.max-model-len {cfg.engine.max_model_len}"
            )
        return
    from urllib.parse import urlparse

    u = urlparse(r.judge_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(
            f"--reward.judge-url {r.judge_url}: not an http(s) URL (e.g. http://127.0.0.1:8001/v1) or self"
        )
    if e := _connect(u.hostname, u.port or (443 if u.scheme == "https" else 80), timeout_s=5):
        raise UsageError(f"--reward.judge-url {r.judge_url}: no server answers there ({e})")


def _has_checker(env: str) -> bool:
    import envs

    try:
        return envs.has_checker(env)
    except KeyError:  # an unknown env is check_env's to report
        return True


def _connect(host: str, port: int = 443, timeout_s: float = 3.0) -> OSError | None:
    """Why a TCP connection to host:port fails, or None where it opens."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except OSError as e:
        return e
