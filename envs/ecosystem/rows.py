"""Rows from a local file, read through `datasets`, with their columns recognised as the anchors write them.

    rows = read_rows("train.parquet")                    # every row, as the file holds it (dicts)
    task = to_task(row, prompt_key=None, answer_key=None)   # Task(prompt=[messages], answer, source, columns)
    train, test = held_out(tasks, 0.1)                   # by a hash of each prompt: the same split on every run

Layouts: verl (`prompt` a chat list, `reward_model.ground_truth`, `data_source`, `extra_info`), TRL (`prompt` a
string or chat list, any other columns), GSM8K raw (`question`, `answer` ending in "#### N"), MATH (`problem`,
`solution` with \\boxed{}), TRL's conversational `messages` (the last turn, an assistant's, is the reply). A row's
demonstration, which `--algo sft` trains on, is its `completion` (TRL), `extra_info.answer` (verl's GSM8K rows),
`response`, `solution` (MATH) or a GSM8K `answer`. `prompt_key` / `answer_key` / `solution_key` name other columns
(a dotted key reads inside a struct: `reward_model.ground_truth`). Files: parquet, jsonl / json, csv, or a folder written by `Dataset.save_to_disk`
(a `DatasetDict`'s "test" split serves the test split).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.ecosystem import require

PROMPT_KEYS = ("prompt", "question", "problem", "query", "instruction")
ANSWER_KEYS = ("reward_model.ground_truth", "answer", "solution", "ground_truth", "final_answer", "target")
# a row's demonstration for --algo sft, in this order: TRL's prompt-completion, verl's GSM8K rows (the full solution
# beside reward_model's bare number), an SFT file's response, MATH's solution; GSM8K's `answer` only when it holds a
# worked solution ("... #### N"): a bare gold answer is not a demonstration unless named (--env-kwargs.solution-key)
SOLUTION_KEYS = ("completion", "extra_info.answer", "response", "solution")
BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


class DataError(ValueError):
    """A file or a row that cannot serve: one line naming the file, the column, and what was found."""


@dataclass(frozen=True)
class Task:
    prompt: list[dict]  # the opening chat messages
    answer: str | None  # the ground truth as the file writes it (None: no answer column)
    source: str  # the row's data_source, else the layout ("verl", "trl", "gsm8k", "math")
    columns: dict[str, Any] = field(default_factory=dict)  # the row as read, for reward functions and extras
    raw_prompt: Any = None  # the prompt as the file holds it (a string or a chat list: TRL passes it so)
    solution: str | None = None  # the row's demonstration, the reply SFT trains on (None: the row has none)


def _builder(p: Path) -> str:
    suffix = "".join(p.suffixes[-1:]).lower()
    if suffix not in BUILDERS:
        raise DataError(
            f"{p}: unknown file type {suffix or '(none)'}; expected {', '.join(BUILDERS)} or a "
            "folder written by Dataset.save_to_disk"
        )
    return BUILDERS[suffix]


@functools.lru_cache(maxsize=8)
def read_rows(path: str, split: str = "train") -> tuple[dict, ...]:
    """Every row of `path` as a dict (cached per process: env workers read a file once). A saved `DatasetDict`
    gives its `split` ("train" or "test"), else its only split."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{path}: no such file or folder")
    ds_lib = require("datasets")
    ds_lib.disable_progress_bars()
    ds_lib.logging.set_verbosity_error()
    try:
        if p.is_dir():
            ds = ds_lib.load_from_disk(str(p))
            if isinstance(ds, ds_lib.DatasetDict):
                if split not in ds and len(ds) != 1:
                    raise DataError(f"{path}: a DatasetDict without a {split!r} split (it has {', '.join(ds)})")
                ds = ds[split] if split in ds else next(iter(ds.values()))
        else:
            ds = ds_lib.load_dataset(_builder(p), data_files=str(p), split="train", keep_in_memory=True)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - pyarrow / json errors: one line naming the file
        raise DataError(
            f"{path}: cannot be read as {'a saved dataset' if p.is_dir() else _builder(p)} "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        ) from None
    if len(ds) == 0:
        raise DataError(f"{path}: the file has no rows")
    return tuple(ds)


def _get(row: dict, key: str):
    """row[key], reading a dotted key inside structs ("reward_model.ground_truth"); KeyError when absent."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def _has(row: dict, key: str) -> bool:
    try:
        _get(row, key)
        return True
    except KeyError:
        return False


def columns_of(row: dict) -> str:
    return ", ".join(row) or "(none)"


def named(row: dict, key: str, flag: str) -> str:
    """A column the user named (`--env-kwargs.<flag>`): it must be in the row (one line naming what was found)."""
    if not _has(row, key):
        raise DataError(f"no column {key!r} (--env-kwargs.{flag}); columns found: {columns_of(row)}")
    return key


def prompt_key_of(row: dict, prompt_key: str | None) -> str:
    if prompt_key is not None:
        return named(row, prompt_key, "prompt-key")
    if key := next((k for k in PROMPT_KEYS if k in row), None):
        return key
    raise DataError(
        f"no prompt column (looked for {', '.join(PROMPT_KEYS)}; name yours with "
        f"--env-kwargs.prompt-key); columns found: {columns_of(row)}"
    )


def answer_key_of(row: dict, answer_key: str | None) -> str | None:
    if answer_key is not None:
        return named(row, answer_key, "answer-key")
    return next((k for k in ANSWER_KEYS if _has(row, k)), None)


def chat(value, key: str) -> list[dict]:
    """A prompt cell as chat messages: a string is one user turn; a chat list is kept (role and content)."""
    if isinstance(value, str) and value.strip():
        return [{"role": "user", "content": value}]
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return [
            {"role": str(m["role"]), "content": "" if m.get("content") is None else str(m["content"])} for m in value
        ]
    raise DataError(
        f"column {key!r}: expected a string or a chat list of {{role, content}}, got "
        f"{type(value).__name__} {str(value)[:80]!r}"
    )


def layout(row: dict, pkey: str, akey: str | None) -> str:
    if "data_source" in row and isinstance(row["data_source"], str) and row["data_source"]:
        return row["data_source"]
    if akey == "answer" and isinstance(row.get("answer"), str) and "####" in row["answer"]:
        return "gsm8k"
    if pkey == "problem" and akey == "solution":
        return "math"
    return "verl" if akey == "reward_model.ground_truth" else "trl"


def reply(value, key: str) -> str:
    """A solution cell as the assistant's reply: a string, or TRL's conversational completion (a chat list of one
    assistant turn)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], dict):
        m = value[0]
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"].strip():
            return m["content"]
    raise DataError(
        f"column {key!r}: expected a reply string or one assistant turn [{{role: assistant, content}}], got "
        f"{type(value).__name__} {str(value)[:80]!r}"
    )


def solution_of(row: dict, solution_key: str | None) -> str | None:
    """The row's demonstration (`--algo sft`'s target reply), or None when it has none."""
    if solution_key is not None:
        return reply(_get(row, named(row, solution_key, "solution-key")), solution_key)
    if key := next((k for k in SOLUTION_KEYS if _has(row, k)), None):
        try:
            return reply(_get(row, key), key)
        except DataError:  # a column of that name that holds no reply: no demonstration (RL reads the row as ever)
            return None
    answer = row.get("answer")
    return answer if isinstance(answer, str) and "####" in answer else None


def split_messages(row: dict) -> tuple[list[dict], str]:
    """TRL's conversational rows (`messages`, no prompt column): the turns before the last as the prompt, the last,
    an assistant's, as the solution."""
    msgs = chat(row["messages"], "messages")
    if len(msgs) < 2 or msgs[-1]["role"] != "assistant":
        raise DataError("column 'messages': expected a chat ending in an assistant turn (the reply to train on)")
    return msgs[:-1], msgs[-1]["content"]


def to_task(
    row: dict, prompt_key: str | None = None, answer_key: str | None = None, solution_key: str | None = None
) -> Task:
    if prompt_key is None and "messages" in row and not any(k in row for k in PROMPT_KEYS):
        prompt, solution = split_messages(row)
        answer = None if (akey := answer_key_of(row, answer_key)) is None else _get(row, akey)
        solution = solution_of(row, solution_key) if solution_key is not None else solution
        return Task(prompt, None if answer is None else str(answer), "trl", dict(row), prompt, solution)
    pkey = prompt_key_of(row, prompt_key)
    akey = answer_key_of(row, answer_key)
    answer = None if akey is None else _get(row, akey)
    return Task(
        chat(_get(row, pkey), pkey),
        None if answer is None else str(answer),
        layout(row, pkey, akey),
        dict(row),
        _get(row, pkey),
        solution_of(row, solution_key),
    )


def prompt_hash(task: Task) -> float:
    """A number in [0, 1) fixed by the prompt's text: equal prompts always fall on the same side of the split."""
    digest = hashlib.sha1(json.dumps(task.prompt, sort_keys=True).encode()).hexdigest()
    return int(digest[:12], 16) / 16**12


def held_out(tasks: list[Task], fraction: float) -> tuple[list[Task], list[Task]]:
    """(train, test): a task is held out when its prompt's hash is below `fraction`; at least one task on each side
    (a tiny file holds out its lowest hash), and no prompt on both."""
    h = [prompt_hash(t) for t in tasks]
    distinct = sorted(set(h))
    if len(distinct) < 2:
        raise DataError(
            f"{len(tasks)} row(s) with {len(distinct)} distinct prompt(s): a held-out split needs at "
            "least 2 (or pass --env-kwargs.test-data FILE)"
        )
    cut = min(max(fraction, distinct[1]), distinct[-1])  # at least the lowest prompt held out, the highest kept
    train = [t for t, x in zip(tasks, h) if x >= cut]
    test = [t for t, x in zip(tasks, h) if x < cut]
    return train, test


def saved_splits(path: str) -> set[str]:
    """The split names of a folder written by `DatasetDict.save_to_disk` (empty for anything else)."""
    p = Path(path) / "dataset_dict.json"
    return set(json.loads(p.read_text()).get("splits", [])) if p.is_file() else set()


def read_tasks(path: str, which: str, make: Callable[[dict], Task]) -> list[Task]:
    """Every row of `path` (its `which` split) made into a task by `make`; a row that does not read is one line
    naming the file and the row."""
    out = []
    for i, row in enumerate(read_rows(path, which)):
        try:
            out.append(make(row))
        except DataError as e:
            raise DataError(f"{path} row {i}: {e}") from None
    return out


def split_tasks(
    data_path: str, split: str, test_data: str | None, test_fraction: float, make: Callable[[dict], Task]
) -> tuple[Task, ...]:
    """The `split`'s tasks, each row made by `make` (its DataError names the file and the row): with `test_data`,
    that file's rows are the test split and the data file's the train split; a saved DatasetDict with a "test"
    split gives its own; otherwise `held_out` by prompt hash. The caller caches it (an env is made per episode)."""

    def tasks(path: str, which: str) -> list[Task]:
        return read_tasks(path, which, make)

    if test_data is not None:
        return tuple(tasks(test_data, "test") if split == "test" else tasks(data_path, "train"))
    if "test" in saved_splits(data_path):
        return tuple(tasks(data_path, split))
    train, test = held_out(tasks(data_path, "train"), test_fraction)
    return tuple(test if split == "test" else train)
