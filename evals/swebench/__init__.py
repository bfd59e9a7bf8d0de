"""Coding benchmark in SWE-bench's schema, graded locally: an agent fixes issues in sandboxed checkouts.

    python -m evals.swebench --ckpt runs/swe-grpo --limit 5           # agent on the shipped mini suite
    python -m evals.swebench --predictions gold                       # grade gold patches: resolves everything
    python -m evals.swebench --predictions empty                      # resolves nothing
    python -m evals.swebench --predictions preds.jsonl --instances my_instances.jsonl
    python -m evals.swebench --base-url http://localhost:8000/v1 --instances verified_subset.jsonl

Instances: JSONL rows with SWE-bench's fields (`instance_id`, `repo`, `base_commit`, `problem_statement`, `patch`,
`test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, `version`) plus `local_repo`, a git repository (or a tarball of
one) containing `base_commit`; the default is the shipped mini suite (`envs/swe/suite.py`). Predictions use
the official fields (`instance_id`, `model_name_or_path`, `model_patch`); every run writes `predictions.jsonl`.
Instances without `local_repo` cannot be run here: their predictions go to the official docker harness when
docker and the `swebench` package are installed. The report mirrors the official one (resolved_ids,
unresolved_ids, empty_patch_ids, error_ids) plus steps, tool calls and token cost.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from envs.swe import harness
from envs.swe.env import SWEEnv
from envs.swe.suite import build_suite
from evals import common

SHIPPED = "swe_mini"


@dataclass(kw_only=True)
class SWEEvalConfig(common.BaseEvalConfig):
    max_steps: int = 8
    """Agent turns per instance (tool calls; submit ends the episode earlier)."""
    max_new_tokens: int = 96
    predictions: str | None = None
    """Grade patches without an agent: "gold" (the instances' own fix), "empty", or an official predictions JSONL."""
    model_name_or_path: str | None = None
    """Name written into predictions.jsonl (default: the checkpoint, server model or predictions source)."""
    workers: int = 2
    """Instances graded in parallel."""
    test_timeout_s: float = 120.0
    """Per-instance limit for the test run."""
    python: str = sys.executable
    """Interpreter that runs the repositories' tests (and `python` in the agent's shell)."""
    obs_chars: int = 300
    """Tool outputs shown to the agent are cut to this many characters."""
    cache_dir: str | None = None
    """Where the shipped suite's git repositories are built (default ~/.cache/nanosky/swe_mini)."""


# ---------------------------------------------------------------------------------------------- data


def load_instances(
    spec: str | None, limit: int | None = None, cache_dir: str | None = None
) -> tuple[list[dict], list[dict]]:
    """(normalised instances, bad rows): missing fields, bad test lists, duplicate ids, unreadable local_repo."""
    spec = spec or SHIPPED
    if spec == SHIPPED:
        raw, bad, base_dir = build_suite(cache_dir), [], None
    else:
        (raw, bad), base_dir = common.read_jsonl(spec), Path(spec).parent
    out, seen = [], set()
    for r in raw:
        try:
            inst = harness.normalize_instance(r, base_dir)
            if inst["instance_id"] in seen:
                raise ValueError(f"duplicate instance_id {inst['instance_id']}")
            if inst.get("local_repo"):
                inst["local_repo"] = harness.resolve_repo(inst["local_repo"], inst["base_commit"])
        except (ValueError, TypeError) as e:
            bad.append(common.bad_row(r, str(e), "instance_id"))
            continue
        seen.add(inst["instance_id"])
        out.append(inst)
    return common.take(out, limit), bad


def load_predictions(spec: str, instances: list[dict]) -> tuple[dict[str, str], str, list[dict]]:
    """(instance_id -> model_patch, model name, bad rows) for "gold", "empty" or a predictions JSONL."""
    if spec == "gold":
        return {i["instance_id"]: i["patch"] for i in instances}, "gold", []
    if spec == "empty":
        return {i["instance_id"]: "" for i in instances}, "empty", []
    rows, bad = common.read_jsonl(spec)
    preds, names = {}, set()
    for r in rows:
        if not isinstance(r.get("instance_id"), str) or not isinstance(r.get("model_patch") or "", str):
            bad.append(common.bad_row(r, "a prediction needs instance_id and model_patch (string)", "instance_id"))
            continue
        preds[r["instance_id"]] = r.get("model_patch") or ""
        names.add(str(r.get("model_name_or_path", "")))
    return preds, ",".join(sorted(n for n in names if n)) or Path(spec).stem, bad


# ---------------------------------------------------------------------------------------------- grading


def grade_all(jobs: list[tuple[dict, str]], cfg: SWEEvalConfig) -> list[dict]:
    """harness.evaluate_instance over (instance, patch) pairs, `cfg.workers` at a time, in order."""
    with ThreadPoolExecutor(cfg.workers) as pool, tqdm(total=len(jobs), desc="grading") as bar:
        futures = [
            pool.submit(harness.evaluate_instance, inst, patch, cfg.test_timeout_s, cfg.python) for inst, patch in jobs
        ]
        for f in futures:
            f.add_done_callback(lambda _: bar.update(1))
        return [f.result() for f in futures]


def swe_report(
    instances: list[dict], records: list[dict], bad: list[dict], wall_s: float, n_samples: int, not_evaluated: list[str]
) -> dict:
    """The official report's counts and id lists (from each instance's first sample) plus pass@k and the
    common numbers; the headline is the resolved rate over the instances evaluated here."""
    first = {r["id"]: r for r in records if r["sample"] == 0}
    ids = lambda pred: sorted(i for i, r in first.items() if pred(r))  # noqa: E731
    resolved = ids(lambda r: r["resolved"])
    empty = ids(lambda r: r["empty_patch"])
    errors = ids(lambda r: r["error"] is not None and not r["empty_patch"])
    unresolved = ids(lambda r: not r["resolved"] and not r["empty_patch"] and r["error"] is None)
    correct: dict[str, list[bool]] = {}
    for r in records:
        correct.setdefault(r["id"], []).append(r["resolved"])
    pm = common.pass_metrics(correct)
    rate = pm.pop(f"mean@{n_samples}", 0.0)
    counts = {k: sum(r["resolution"] == k for r in records) for k in (harness.FULL, harness.PARTIAL, harness.NO)}
    return common.finish_report(
        "swebench",
        records,
        bad,
        wall_s,
        "resolved_rate",
        resolved_rate=rate,
        **pm,
        total_instances=len(instances),
        submitted_instances=len(first),
        completed_instances=len(resolved) + len(unresolved),
        resolved_instances=len(resolved),
        unresolved_instances=len(unresolved),
        empty_patch_instances=len(empty),
        error_instances=len(errors),
        resolutions=counts,
        resolved_ids=resolved,
        unresolved_ids=unresolved,
        empty_patch_ids=empty,
        error_ids=errors,
        not_evaluated_ids=not_evaluated,
    )


def evaluate_predictions(
    instances: list[dict], patches: dict[str, str], cfg: SWEEvalConfig, bad: list[dict] | None = None
) -> tuple[dict, list[dict]]:
    """Grade given patches (no agent). Instances without a prediction are not submitted; without local_repo, not
    evaluated here (listed in `not_evaluated_ids`)."""
    t0 = time.time()
    local = [i for i in instances if i["instance_id"] in patches and i.get("local_repo")]
    results = grade_all([(i, patches[i["instance_id"]]) for i in local], cfg)
    records = [{"id": r["instance_id"], "sample": 0, **r, "model_patch": patches[r["instance_id"]]} for r in results]
    skipped = [i["instance_id"] for i in instances if i["instance_id"] in patches and not i.get("local_repo")]
    return swe_report(instances, records, bad or [], time.time() - t0, 1, skipped), records


def evaluate(
    model, tok, instances: list[dict], cfg: SWEEvalConfig, bad: list[dict] | None = None
) -> tuple[dict, list[dict]]:
    """The agent on every instance with a local_repo (n_samples each), its patches graded like predictions."""
    from evals.models import rollout

    t0 = time.time()
    bad = list(bad or [])
    runnable = [i for i in instances if i.get("local_repo")]
    bad += [
        {"id": i["instance_id"], "error": "no local_repo: the agent needs a checkout", "skipped": True}
        for i in instances
        if not i.get("local_repo")
    ]
    envs = [SWEEnv(i, cfg.max_steps, cfg.obs_chars, python=cfg.python) for i in runnable for _ in range(cfg.n_samples)]
    try:
        trajs = rollout(model, tok, envs, cfg, desc="swebench agent")
    finally:
        patches = [e.finish() for e in envs]  # also removes the work trees
    results = grade_all([(envs[j].instance, p) for j, p in enumerate(patches)], cfg)
    records = []
    for j, (t, res) in enumerate(zip(trajs, results)):
        extra = {k: v for k, v in res.items() if k != "instance_id"}
        records.append(
            common.record(
                res["instance_id"],
                j % cfg.n_samples,
                t,
                **extra,
                model_patch=patches[j],
                submitted=bool(t.info.get("submitted")),
            )
        )
    return swe_report(runnable, records, bad, time.time() - t0, cfg.n_samples, []), records


def run(model, tok, instances: list[dict], cfg: SWEEvalConfig) -> dict:
    """The in-training entry point: the report only."""
    return evaluate(model, tok, instances, cfg)[0]


# ---------------------------------------------------------------------------------------------- CLI


def write_predictions(path: Path, records: list[dict], model_name: str) -> Path:
    """The official predictions file: one row per instance (its first sample)."""
    out = path / "predictions.jsonl"
    with open(out, "w", encoding="utf-8") as f:
        for r in records:
            if r["sample"] == 0:
                f.write(
                    json.dumps(
                        {"instance_id": r["id"], "model_name_or_path": model_name, "model_patch": r["model_patch"]}
                    )
                    + "\n"
                )
    return out


def main(argv: list[str] | None = None) -> dict:
    import tyro

    cfg = tyro.cli(SWEEvalConfig, args=argv, description=__doc__)
    instances, bad = load_instances(cfg.data, cfg.limit, cfg.cache_dir)
    path = common.out_dir(cfg, "swebench")
    if cfg.predictions:
        patches, name, pbad = load_predictions(cfg.predictions, instances)
        report, records = evaluate_predictions(instances, patches, cfg, bad + pbad)
    else:
        from evals.models import close_model, open_model

        model, tok, name = open_model(cfg, log_path=str(path / "engine.log"))
        try:
            report, records = evaluate(model, tok, instances, cfg, bad)
        finally:
            close_model(model)
    name = cfg.model_name_or_path or name
    preds = write_predictions(path, records, name)
    if report["not_evaluated_ids"]:
        # Only a user's instances file can lack local_repo (the shipped suite never does).
        report["official_harness"] = harness.official_harness(
            str(cfg.data), str(preds), report["not_evaluated_ids"], path.name, cfg.workers
        )
        print(report["official_harness"])
    report = {**report, "model": name, "data": cfg.data or SHIPPED}
    common.write_outputs(path, records, report, cfg)
    print(common.summary_table(report))
    print(f"wrote {path / 'examples.jsonl'}, {path / 'report.json'} and {preds}")
    return report
