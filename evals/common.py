"""What every eval shares: the common flags, data loading with bad-row reporting, per-example records, the report
(headline metric, steps, tool calls, token cost, wall time), pass@k, the output directory and the summary table.

An eval is examples → Env objects → trajectories (`evals.models.rollout`) → grading → `finish_report` →
`write_outputs`. The model side (in-process vLLM or an OpenAI-compatible server) lives in `evals/models.py`.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

DATA_DIR = Path(__file__).parent / "data"


def _import_plugins(modules: list[str]) -> None:
    """`--plugins`, imported as run.py imports them; a module that is not there is one line."""
    from nanosky.cli import import_user_plugins
    from nanosky.preflight import UsageError

    try:
        import_user_plugins(modules)
    except UsageError as e:
        raise SystemExit(str(e)) from None


@dataclass(kw_only=True)
class BaseEvalConfig:
    plugins: list[str] = field(default_factory=list)
    """Python modules imported first (`--plugins my_envs`), as run.py's: the envs they register can be evaluated
    (`python -m evals.agent --env my_env --plugins my_envs --ckpt ...`)."""
    ckpt: str | None = None
    """The model, served by in-process vLLM: a run dir (its latest checkpoint, e.g. runs/demo-grpo), a checkpoint
    (runs/demo-grpo/checkpoints/step_000040) or any HF model folder (that checkpoint's export/, a bundled name)."""
    base_url: str | None = None
    """OpenAI-compatible server instead of --ckpt, e.g. http://localhost:8000/v1 (key: $OPENAI_API_KEY)."""
    model: str | None = None
    """Model name sent to --base-url (default: the server's first listed model)."""
    data: Annotated[str | None, tyro.conf.arg(aliases=("--instances",))] = None
    """Examples: a JSONL file in the benchmark's official schema, or a shipped set's name (default: shipped)."""
    limit: int | None = None
    """Evaluate only the first N valid examples."""
    seed: int = 0
    """Sampling seed (engine and API)."""
    n_samples: int = 1
    """Samples per example; pass@k is reported for k = 1, 2, 4, ... up to n."""
    temperature: float = 0.0
    """0 = greedy. n_samples > 1 needs temperature > 0."""
    max_steps: int = 1
    """Assistant turns per episode."""
    max_new_tokens: int = 128
    """Tokens per assistant turn."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """--ckpt: the engine's precision, decided as a training run's --precision is (auto: bf16 on CUDA and on a CPU
    with bf16 units, fp32 elsewhere), so an eval of a checkpoint samples as the run's own evals of it did."""
    max_model_len: int = 512
    """--ckpt: context length the engine serves (prompt + all turns; step-wise: one turn's prompt + response)."""
    history_window: int | None = None
    """Step-wise prompts, as a model trained with --rollout.mode stepwise saw them: the opening messages and the
    last K turns. None: the whole conversation."""
    constrain_actions: bool = False
    """--ckpt: sample each turn under the env's action constraint (its admissible actions, or one well-formed tool
    call), as a model trained with --rollout.constrain-actions was sampled (nanosky/train/constrain.py)."""
    batch_size: int = 32
    """--ckpt: episodes rolled out together (one progress-bar tick per batch)."""
    concurrency: int = 4
    """--base-url: episodes in flight at once."""
    api_tool_mode: Literal["text", "native"] = "text"
    """--base-url: "text" sends tool results as user turns and lists tools in the system prompt (any chat server);
    "native" sends `tools` + role "tool" messages for the server's chat template (e.g. vLLM serving a checkpoint)."""
    out: str | None = None
    """Output directory (default: runs/evals/<eval>-<time>)."""
    agent: str | None = None
    """Evaluate your own agent instead of nanosky's loop: MODULE:FN, the `--rollout.agent` contract (an async
    `solve(client, task)`), its client pointed at --ckpt's engine through the training endpoint (nanosky/endpoint/)."""
    agent_timeout_s: float = 300.0
    """--agent: an episode running longer fails (reward 0)."""
    agent_concurrency: int = 32
    """--agent: episodes your agent plays at once (the others wait; each may be a process tree of its own)."""

    def __post_init__(self):
        _import_plugins(self.plugins)
        if self.ckpt and self.base_url:
            raise ValueError("give either --ckpt or --base-url, not both")
        if self.agent and self.base_url:
            raise ValueError("--agent needs --ckpt: the endpoint serves the checkpoint from the in-process engine")
        if self.constrain_actions and self.base_url:
            raise ValueError("--constrain-actions needs --ckpt (the in-process engine's structured outputs)")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        for f in (
            "n_samples",
            "max_steps",
            "max_new_tokens",
            "batch_size",
            "concurrency",
            "agent_concurrency",
        ):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if not 0.0 <= self.temperature <= 10.0:
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature}")
        if self.history_window is not None and self.history_window < 1:
            raise ValueError(f"history_window must be >= 1, got {self.history_window}")
        if self.n_samples > 1 and self.temperature == 0.0:
            raise ValueError("n_samples > 1 with temperature 0 draws the same sample n times; set --temperature")


# ---------------------------------------------------------------------------------------------- data


def read_jsonl(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(rows, bad): every non-blank line that is a JSON object, and {"line", "error"} for the others."""
    rows, bad = [], []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            bad.append({"line": n, "error": f"invalid JSON: {e}"})
            continue
        if not isinstance(row, dict):
            bad.append({"line": n, "error": f"expected a JSON object, got {type(row).__name__}"})
            continue
        row.setdefault("_line", n)
        rows.append(row)
    return rows, bad


def bad_row(row: dict, error: str, id_key: str = "id") -> dict:
    """A skipped example as reported in the JSONL and report.json."""
    return {
        "id": row.get(id_key) if isinstance(row, dict) else None,
        "line": row.get("_line"),
        "error": error,
        "skipped": True,
    }


def take(items: list, limit: int | None) -> list:
    return items if limit is None else items[:limit]


# ---------------------------------------------------------------------------------------------- metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"k={k} > n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... and n itself."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks + ([n] if ks[-1] != n else [])


def pass_metrics(correct: dict[Any, list[bool]]) -> dict[str, float]:
    """mean@n (= accuracy over every sample) and pass@k averaged over examples; `correct`: id -> per-sample."""
    if not correct:
        return {}
    n = min(len(v) for v in correct.values())
    out = {f"mean@{n}": sum(sum(v[:n]) / n for v in correct.values()) / len(correct)}
    for k in ks_for(n):
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(v[:n]), k) for v in correct.values()) / len(correct)
    return out


def token_cost(traj) -> tuple[int, int]:
    """(prompt, completion) tokens as an API would bill them: the whole context at every call, plus the sampled
    tokens; both backends report them per call, summed on the trajectory."""
    return int(traj.prompt_tokens), int(traj.completion_tokens)


def record(example_id: Any, sample: int, traj, **grading: Any) -> dict:
    """One per-example JSONL line: grading fields first, then the whole trajectory (decoded, without ids)."""
    prompt_tokens, completion_tokens = token_cost(traj)
    d = traj.to_json(with_ids=False)
    d.pop("env_seed", None)
    d.pop("group", None)
    return {
        "id": example_id,
        "sample": sample,
        **grading,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        **d,
    }


def finish_report(name: str, records: list[dict], bad: list[dict], wall_s: float, headline: str, **extra: Any) -> dict:
    """The numbers every eval reports, from its graded records; `headline` names the main metric in `extra`."""
    recs = [r for r in records if not r.get("skipped")]
    n = max(len(recs), 1)
    report = {
        "eval": name,
        "headline": headline,
        headline: extra.pop(headline),
        "n_examples": len({r["id"] for r in recs}),
        "n_episodes": len(recs),
        "n_skipped": len(bad),
    }
    if any("turns" in r for r in recs):  # episodes were played (not e.g. swebench --predictions)
        report |= {
            "mean_steps": sum(r["turns"] for r in recs) / n,
            "tool_calls_per_example": sum(r["tool_calls"] for r in recs) / n,
            "prompt_tokens": sum(r["prompt_tokens"] for r in recs),
            "completion_tokens": sum(r["completion_tokens"] for r in recs),
            "tokens_per_example": sum(r["prompt_tokens"] + r["completion_tokens"] for r in recs) / n,
            "stop_reasons": dict(Counter(r["stop_reason"] for r in recs)),
        }
    return report | {"wall_time_s": round(wall_s, 2), **extra, "bad_rows": bad}


def metrics(report: dict, prefix: str) -> dict[str, float]:
    """The report's scalar numbers as TensorBoard tags, e.g. {"eval/math/accuracy": 0.4, ...}."""
    return {f"{prefix}/{k}": float(v) for k, v in report.items() if isinstance(v, (int, float)) and k != "n_skipped"}


# ---------------------------------------------------------------------------------------------- output


def out_dir(cfg: BaseEvalConfig, name: str) -> Path:
    path = Path(cfg.out) if cfg.out else Path("runs") / "evals" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_outputs(path: Path, records: list[dict], report: dict, cfg: BaseEvalConfig | None = None) -> None:
    """examples.jsonl (one line per episode and per skipped row) and report.json (with the config used)."""
    with open(path / "examples.jsonl", "w", encoding="utf-8") as f:
        for r in records + report.get("bad_rows", []):
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    full = {**report, "config": asdict(cfg) if cfg is not None else None}
    (path / "report.json").write_text(json.dumps(full, indent=1, default=str), encoding="utf-8")


def summary_table(report: dict) -> str:
    """A one-screen table of the report's numbers (dicts of numbers one level deep) and a few skipped rows."""
    rows = []
    for k, v in report.items():
        if k == "headline" or isinstance(v, list):
            continue
        if isinstance(v, dict):
            rows += [(f"{k}.{kk}", _fmt(vv)) for kk, vv in v.items() if isinstance(vv, (int, float, str))][:8]
        elif v is not None:
            rows.append((k, _fmt(v)))
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 3 + max(len(v) for _, v in rows))
    out = [line, f"{report['eval']}: {report['headline']} = {_fmt(report[report['headline']])}", line]
    out += [f"{k:<{width}}   {v}" for k, v in rows]
    for b in report.get("bad_rows", [])[:5]:
        out.append(f"skipped {b.get('id') or 'line ' + str(b.get('line'))}: {str(b['error'])[:80]}")
    if len(report.get("bad_rows", [])) > 5:
        out.append(f"... and {len(report['bad_rows']) - 5} more skipped rows (see report.json)")
    return "\n".join(out + [line])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)
