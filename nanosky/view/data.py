"""What the viewer page shows, read from a run directory (rollouts.jsonl, TensorBoard events, config.json,
summary.json) or an eval's output folder (examples.jsonl, report.json), tolerant of what a killed or running run
leaves: a truncated last line, a line that is not JSON, no records at all. Everything skipped is said in `notes`.

    data = load("runs/demo-grpo")        # a JSON-able dict: records, scalars, vocab, notes
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

SCALARS = ("train/reward_mean", "train/success_rate", "eval/accuracy", "train/entropy")
"""The TensorBoard tags the steps chart draws, where the run logged them."""
MAX_MIB = 25
MAX_BYTES = MAX_MIB << 20
"""The most record bytes one page embeds: past it, the oldest steps lose their token values first, then whole
steps are thinned evenly (both said in `notes`). A browser opens a page of this size in a few seconds."""


def read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """The records of a JSONL file and notes on the lines skipped (a truncated last line: a run killed mid-write)."""
    if not path.exists():
        return [], []
    lines = path.read_bytes().split(b"\n")
    recs, bad = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad.append(i + 1)
            continue
        if isinstance(rec, dict):
            rec["_bytes"] = len(line)
            recs.append(rec)
        else:
            bad.append(i + 1)
    notes = []
    if bad:
        last = max(i for i, x in enumerate(lines) if x.strip()) + 1  # the last non-empty line
        where = (
            "the last line (truncated: a run stopped mid-write?)"
            if bad == [last]
            else "lines " + ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        )
        notes.append(f"{path.name}: skipped {len(bad)} line(s) that are not JSON records: {where}")
    return recs, notes


def fit(recs: list[dict], max_bytes: int) -> tuple[list[dict], list[str]]:
    """Keep the page under `max_bytes`: drop the oldest token values, then thin whole steps evenly."""
    total = sum(r["_bytes"] for r in recs)
    notes = []
    if total <= max_bytes:
        return recs, notes
    stripped = 0
    for r in sorted((r for r in recs if "tokens" in r), key=lambda r: r.get("step", 0)):
        if total <= max_bytes:
            break
        size = len(json.dumps(r["tokens"]))
        del r["tokens"]
        r["_bytes"] -= size
        total -= size
        stripped += 1
    if stripped:
        notes.append(f"{stripped} older episodes are shown without token values (the page keeps {max_bytes >> 20} MiB)")
    if total > max_bytes:
        steps = sorted({r.get("step", 0) for r in recs})
        k = -(-total // max_bytes)  # keep every k-th step
        keep = set(steps[::k]) | {steps[-1]}
        n = len(recs)
        recs = [r for r in recs if r.get("step", 0) in keep]
        notes.append(
            f"{n - len(recs)} episodes of {len(steps) - len(keep)} steps not shown: every {k}th step is kept "
            f"(the page keeps {max_bytes >> 20} MiB)"
        )
    return recs, notes


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The chart's TensorBoard scalars, {tag: [(step, value)]}; {} without events (an eval folder)."""
    if not any(run_dir.glob("events.out.tfevents*")):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    try:
        acc.Reload()
    except Exception:  # noqa: BLE001 - a half-written events file: the chart falls back to the records
        return {}
    have = set(acc.Tags().get("scalars", []))
    # a point over nothing (NaN: a success rate where no episode was checked) is not drawn
    return {t: [(e.step, e.value) for e in acc.Scalars(t) if math.isfinite(e.value)] for t in SCALARS if t in have}


def vocab(records: list[dict], model_path: str | None) -> dict[int, str]:
    """Each token id in the records' token values as text, by the run's tokenizer (its tokenizer.json through the
    `tokenizers` library: no transformers import, ~0.1 s); {} when there is none here (the page then shows ids)."""
    ids = {i for r in records for i in r.get("tokens", {}).get("ids", [])}
    if not ids or not model_path:
        return {}
    try:
        from tokenizers import Tokenizer

        from nanosky.bundled import resolve_model_path

        folder = Path(resolve_model_path(model_path)).expanduser()  # a bundled name: its folder
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - a model folder moved, a hub id, or no tokenizer.json: ids stay ids
        return {}
    return {i: tok.decode([i], skip_special_tokens=False) for i in sorted(ids)}


def load(path: str, max_bytes: int = MAX_BYTES) -> dict:
    """The page's data for a run directory or an eval's output folder."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{path}: no such directory (a run dir, or an eval's --out folder)")
    kind = "run" if (root / "rollouts.jsonl").exists() or not (root / "examples.jsonl").exists() else "eval"
    recs, notes = read_jsonl(root / ("rollouts.jsonl" if kind == "run" else "examples.jsonl"))
    if kind == "eval":
        for r in recs:  # an eval's examples: one "step", the split they were drawn from
            r.setdefault("step", 0)
            r.setdefault("split", "eval")
    recs, more = fit(recs, max_bytes)
    notes += more
    if not recs:
        notes.append("no episodes recorded yet" + (" (rollouts.jsonl is empty or missing)" if kind == "run" else ""))
    config = _json(root / "config.json")
    model = (config.get("model") or {}).get("path") if isinstance(config.get("model"), dict) else None
    for r in recs:
        r.pop("_bytes", None)
    return {
        "name": root.resolve().name,
        "kind": kind,
        "records": recs,
        "scalars": scalars(root) if kind == "run" else {},
        "vocab": vocab(recs, model),
        "config": header(config),
        "summary": _json(root / ("summary.json" if kind == "run" else "report.json")),
        "notes": notes,
    }


def header(config: dict) -> dict:
    """What the page's header shows of a run's config.json: env, algorithm (`algorithm.name`), seed, steps."""
    algo = config.get("algorithm")
    out = {
        "env": config.get("env"),
        "algo": algo.get("name") if isinstance(algo, dict) else None,
        "seed": config.get("seed"),
        "steps": config.get("steps"),
    }
    return {k: v for k, v in out.items() if v is not None}


def _json(p: Path) -> dict:
    try:
        d = json.loads(p.read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def mtime(path: str) -> float:
    """The newest change among the files the page reads (the server re-renders when it moves)."""
    root = Path(path)
    return max((os.path.getmtime(p) for p in root.iterdir() if p.is_file()), default=0.0)
