"""The env's and its data's checks: `--env-data` parses and fits the env's schema (bad rows named by line), an
ecosystem env builds its episodes, `--algo sft` has an expert, an agent imports, prompts fit the context."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanosky.config import TrainConfig

from nanosky.preflight.errors import UsageError

DATA_ROWS_CHECKED = 1000


def check_agent(cfg: TrainConfig) -> None:
    """--rollout.agent imports and names a function; --rollout.agent-cmd's program exists."""
    import shlex

    if cfg.rollout.agent:
        from nanosky.endpoint.harness import AgentError, load_agent  # ~0.5 s of imports a run without one skips

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
    loads, with the envs that have one; an env whose kwargs rule it out (a file without solutions, a game without a
    scripted player) says why, in one line."""
    if not cfg.demonstrations:
        return
    import envs

    kind = envs.env_class(cfg.env)
    if not kind.has_expert():
        having = ", ".join(n for n in envs.env_names() if envs.has_expert(n))
        raise UsageError(
            f"--algo sft: env {cfg.env!r} has no scripted expert to demonstrate it (Env.expert_action); "
            f"envs with one: {having}"
        )
    try:
        why = kind.expert_refusal(**cfg.env_args())
    except ValueError as e:  # the kwargs do not build (a bad file): what check_ecosystem_env says
        why = str(e)
    if why:
        raise UsageError(f"--algo sft: {' '.join(why.split())}")


def check_ecosystem_env(cfg: TrainConfig, folder: str) -> None:
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
        check_prompt_lengths(cfg, folder)


def check_prompt_lengths(cfg: TrainConfig, folder: str) -> None:
    """A data file none of whose first rows' prompts leaves room for a reply under --rollout.max-total-tokens is
    refused (every episode would be skipped); rows that do not fit are skipped at run time, counted in
    `rollout/prompt_too_long`."""
    import envs
    from nanosky.rollout.chat import load_tokenizer, prompt_ids

    try:
        tok = load_tokenizer(folder, cfg.model.chat_template)
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
