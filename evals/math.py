"""Math benchmarks: GSM8K JSONL, MATH-style JSONL and the text_math test split; accuracy, mean@n and pass@k, with
the bars that tell skill from format (as a training run's eval reports them: nanosky/evaluate.py `answer_metrics`).

    python -m evals.math --ckpt runs/demo-grpo                            # text_math test split (200 problems)
    python -m evals.math --ckpt ... --split validation                   # text_math validation split (model selection)
    python -m evals.math --ckpt ... --data gsm8k                         # shipped GSM8K-style sample
    python -m evals.math --ckpt ... --data math --n-samples 4 --temperature 1.0
    python -m evals.math --base-url http://localhost:8000/v1 --data my_gsm8k_test.jsonl

Rows: GSM8K (`question`, `answer` ending in "#### N"), MATH (`problem`, `solution` with `\\boxed{...}`) or plain
(`question`, `answer`). The model's answer is the last `<answer>...</answer>`, else the last `\\boxed{}`, else
"#### N", else "the answer is ...", else the last number; equivalence compares numbers exactly (integers,
decimals, fractions, `\\frac`, thousands commas, `$`, `%`) and other answers after LaTeX/whitespace normalisation.
A text_math logic problem has a closed set of answers (its `options`: yes/no, even/odd, the two numbers, the
names); its answer is the option the reply names, format aside (`envs.answers.lenient_match`: "Ann is taller"
names Ann, where the last-number reading finds nothing), or an equivalent answer tag.

The report: `accuracy` (the headline, format-free as above), `accuracy_strict` (the `<answer>` tag alone: a gain
there alone is format), `chance` (a random option's expected score; an open answer counts 0; absent when no row has
options) and `constant_best` (the best single fixed answer: the most common gold answer's share). A dataset file
scored with math-verify has no `accuracy_strict`.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

from envs.answers import extract_answer as tag_answer  # the strict reading: the <answer> tag alone
from envs.answers import lenient_match, named_option, normalize_answer
from envs.base import Env, Message, StepResult
from envs.ecosystem.mathreward import last_boxed  # one \boxed{} reader for the evals and the dataset env
from envs.text_math import SYSTEM_PROMPT  # the prompt the bundled model was warm-started with
from evals import common, models
from nanosky import process

SHIPPED = {
    "text_math": None,  # generated: envs.text_math.test_problems()
    "gsm8k": Path(__file__).parents[1] / "envs" / "data" / "gsm8k_sample.jsonl",
    "math": common.DATA_DIR / "math_sample.jsonl",
}


@dataclass(kw_only=True)
class MathEvalConfig(common.BaseEvalConfig):
    max_new_tokens: int = 160
    """Tokens per answer (one turn)."""
    prompt_key: str | None = None
    """A file read as `--env dataset` reads it (parquet, json, csv, a saved dataset, or jsonl in verl's / TRL's
    layout): the prompt column, when it is not one of prompt, question, problem (as --env-kwargs.prompt-key)."""
    answer_key: str | None = None
    """Such a file's ground-truth column (as --env-kwargs.answer-key; a dotted key reads inside a struct)."""
    split: Literal["test", "validation"] = "test"
    """The text_math split evaluated (validation: for choosing a checkpoint without touching test); other data has
    only its own rows."""

    def __post_init__(self):
        super().__post_init__()
        if self.split != "test" and (self.data or "text_math") != "text_math":
            raise ValueError(f"--split {self.split} is text_math's: --data {self.data} has no splits (drop --split)")


# ---------------------------------------------------------------------------------------------- extraction


_NUM = r"-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+"


def extract_answer(text: str) -> str | None:
    """The model's final answer: <answer> tag, \\boxed{}, "#### N", "answer is X", then the last number."""
    if not isinstance(text, str) or not text.strip():
        return None
    if (a := tag_answer(text)) is not None:
        return a
    if (a := last_boxed(text)) is not None:
        return a
    if m := re.findall(r"####\s*([^\n]+)", text):
        return m[-1].strip()
    if m := re.findall(r"answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s|\.?$)", text, flags=re.IGNORECASE | re.MULTILINE):
        return m[-1].strip()
    if m := re.findall(_NUM, text):
        return m[-1].rstrip(".")
    return None


def gold_answer(row: dict) -> str:
    """The reference answer of a GSM8K, MATH or plain row; raises ValueError/KeyError for a bad row."""
    if "problem" in row and "solution" in row and "answer" not in row:
        ans = last_boxed(str(row["solution"]))
        if not ans:
            raise ValueError("MATH row: no \\boxed{} answer in solution")
        return ans
    ans = str(row["answer"])
    if "####" in ans:
        ans = ans.rsplit("####", 1)[1]
    ans = ans.strip()
    if not ans:
        raise ValueError("empty answer")
    return ans


# ---------------------------------------------------------------------------------------------- equivalence


def _strip_latex(s: str) -> str:
    s = str(s).strip().strip("$").strip()
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:mathrm|mathbf|textbf)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # \frac12
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    for junk in (
        "\\left",
        "\\right",
        "\\!",
        "\\,",
        "\\;",
        "\\:",
        "\\ ",
        "\\$",
        "^\\circ",
        "^{\\circ}",
        "\\%",
        "%",
        "\\displaystyle",
    ):
        s = s.replace(junk, "")
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5" -> "5"
    s = re.sub(r"\s+", "", s).rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # thousands separators, not a tuple
        s = s.replace(",", "")
    return s.replace("$", "")


def to_number(s: str) -> Fraction | None:
    """Exact value of an integer, decimal, a/b or \\frac{a}{b} (after normalisation), else None."""
    s = _strip_latex(s)
    for unit in ("dollars", "dollar", "cm", "m", "km", "kg", "g", "units", "degrees"):
        if s.endswith(unit) and re.match(r"-?[\d.]", s):
            s = s[: -len(unit)]
    try:
        if m := re.fullmatch(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s):
            v = Fraction(m.group(2)) / Fraction(m.group(3))
            return -v if m.group(1) else v
        if m := re.fullmatch(r"(-?[\d.]+)/(-?[\d.]+)", s):
            return Fraction(m.group(1)) / Fraction(m.group(2))
        if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def is_equiv(pred: str | None, gold: str) -> bool:
    """Numbers compare exactly by value (0.5 == 1/2 == \\frac{1}{2}); tuples element-wise; else normalised text."""
    if pred is None:
        return False
    try:
        a, b = to_number(pred), to_number(gold)
        if a is not None and b is not None:
            return a == b
        pa, pb = _strip_latex(pred), _strip_latex(gold)
        if pa.lower() == pb.lower():
            return True
        tup = re.compile(r"([(\[])(.*)([)\]])")
        ma, mb = tup.fullmatch(pa), tup.fullmatch(pb)
        if ma and mb and ma.group(1) == mb.group(1) and ma.group(3) == mb.group(3):
            xs, ys = ma.group(2).split(","), mb.group(2).split(",")
            return len(xs) == len(ys) and all(is_equiv(x, y) for x, y in zip(xs, ys))
        return False
    except Exception:  # noqa: BLE001 - grading never raises
        return False


# ---------------------------------------------------------------------------------------------- data + env


def dataset_file(spec: str) -> bool:
    """Whether `spec` is read as `--env dataset` reads it, and scored with its reward (math-verify): parquet, json,
    csv, a saved dataset folder, or a jsonl whose first row is in verl's or TRL's layout (a `prompt` column)."""
    p = Path(spec)
    if spec in SHIPPED or not p.exists():
        return False
    if p.is_dir() or p.suffix.lower() in (".parquet", ".json", ".csv"):
        return True
    first, _ = common.read_jsonl(p)
    return bool(first) and "prompt" in first[0]


def load_dataset_rows(spec: str, limit: int | None, prompt_key=None, answer_key=None) -> tuple[list[dict], list]:
    """Every row of a file `--env dataset` reads, as eval rows with their chat prompt and math-verify gold."""
    from envs.ecosystem.mathreward import gold_answer
    from envs.ecosystem.rows import DataError, read_rows, to_task

    rows, bad = [], []
    for i, raw in enumerate(read_rows(spec, "test")):
        try:
            task = to_task(raw, prompt_key, answer_key)
            if task.answer is None:
                raise DataError("no answer column")
            rows.append(
                {
                    "id": f"{Path(spec).stem}/{i}",
                    "messages": task.prompt,
                    "question": task.prompt[-1]["content"],
                    "answer": gold_answer(task.answer),
                    "source": task.source,
                    "reward": "math-verify",
                }
            )
        except DataError as e:
            bad.append(common.bad_row({"_line": i}, str(e)))
    return common.take(rows, limit), bad


def load_rows(
    spec: str | None, limit: int | None = None, prompt_key=None, answer_key=None, split: str = "test"
) -> tuple[list, list]:
    """(rows {"id", "question", "answer", "source"}, bad rows). `spec`: a shipped name or a JSONL path; a file in
    `--env dataset`'s layouts keeps its chat prompt and is scored with math-verify, as in training. text_math rows
    carry their problem's `options` (a closed set of answers; empty for an open one), from `split`."""
    spec = spec or "text_math"
    if split != "test" and spec != "text_math":
        raise ValueError(f"split {split!r} is text_math's: {spec} has no splits")
    if dataset_file(spec):
        return load_dataset_rows(spec, limit, prompt_key, answer_key)
    if spec == "text_math":
        from envs.text_math import test_problems, validation_problems

        problems = {"test": test_problems, "validation": validation_problems}[split]()
        rows = [
            {
                "id": f"text_math/{split}/{i}" if split != "test" else f"text_math/{i}",
                "question": p.question,
                "answer": p.answer,
                "source": "text_math",
                "options": tuple(p.options),
            }
            for i, p in enumerate(problems)
        ]
        return common.take(rows, limit), []
    path = SHIPPED.get(spec) or Path(spec)
    raw, bad = common.read_jsonl(path)
    rows = []
    for r in raw:
        try:
            question = str(r.get("problem", r.get("question", ""))).strip()
            if not question:
                raise ValueError("no 'question' or 'problem'")
            source = "math" if "problem" in r else "gsm8k" if "####" in str(r.get("answer", "")) else "qa"
            rows.append(
                {
                    "id": r.get("id", f"{Path(path).stem}/{r['_line']}"),
                    "question": question,
                    "answer": gold_answer(r),
                    "source": source,
                }
            )
        except (KeyError, ValueError, TypeError) as e:
            bad.append(common.bad_row(r, f"{type(e).__name__}: {e}"))
    return common.take(rows, limit), bad


class MathQAEnv(Env):
    """One question, one answer turn; reward 1.0 when the answer read format-free (`extract_answer`; with `options`,
    the option the reply names) is equivalent to the reference. `info["strict"]`: the `<answer>` tag alone holds it."""

    name = "math_qa"
    max_turns = 1

    def __init__(self, question: str, answer: str, system_prompt: str = SYSTEM_PROMPT, messages=None, options=()):
        self.question, self.answer, self.system_prompt = question, answer, system_prompt
        self.messages = messages  # a dataset file's own chat prompt, scored as --env dataset scores it
        self.options = tuple(options or ())  # a closed set of answers (text_math logic), else empty

    def reset(self) -> list[Message]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": self.question}]

    def step(self, action: str) -> StepResult:
        if self.messages is not None:
            from envs.ecosystem.mathreward import math_reward

            reward, info = math_reward(action, self.answer)
            return StepResult([], reward, True, info)
        strict = isinstance(action, str) and is_equiv(tag_answer(action), self.answer)
        if self.options:  # the option named, format aside; a tag equivalent to the answer ("05" for 5) counts too
            pred = named_option(action, self.options) if isinstance(action, str) else None
            ok = strict or lenient_match(action, self.answer, self.options)
        else:
            pred = extract_answer(action) if isinstance(action, str) else None
            ok = is_equiv(pred, self.answer)
        info = {"success": ok, "strict": strict, "pred": pred, "answer": self.answer}
        return StepResult([], 1.0 if ok else 0.0, True, info | ({"options": self.options} if self.options else {}))


# ---------------------------------------------------------------------------------------------- eval


def evaluate(
    model, tok, rows: list[dict], cfg: MathEvalConfig, bad: list[dict] | None = None
) -> tuple[dict, list[dict]]:
    """(report, per-episode records). `model` is an EngineBackend (with `tok`) or an OpenAIBackend (tok None)."""
    from evals.models import rollout

    t0 = time.time()
    envs = [
        MathQAEnv(r["question"], r["answer"], messages=r.get("messages"), options=r.get("options"))
        for r in rows
        for _ in range(cfg.n_samples)
    ]
    trajs = rollout(model, tok, envs, cfg, desc="math")
    return report_of(rows, trajs, cfg, bad, time.time() - t0)


def skill_bars(rows: list[dict]) -> dict[str, float]:
    """The bars a score must clear, over `rows` (absent over none): `chance`, a random option's expected score (an
    open answer counts 0; absent when no row has options), and `constant_best`, the most common gold answer's share
    (answers compared as `envs.answers.normalize_answer` compares them)."""
    if not rows:
        return {}
    golds = Counter(normalize_answer(str(r["answer"])) for r in rows)
    bars = {"constant_best": max(golds.values()) / len(rows)}
    if any(r.get("options") for r in rows):
        bars["chance"] = sum(1 / len(r["options"]) for r in rows if r.get("options")) / len(rows)
    return bars


def report_of(
    rows: list[dict], trajs: list, cfg: MathEvalConfig, bad: list[dict] | None = None, wall_s: float = 0.0
) -> tuple[dict, list[dict]]:
    """(report, per-episode records) from the trajectories of `rows` × `cfg.n_samples` (in that order). A metric
    over zero episodes is NaN (the headline) or absent, never 0."""
    records, correct, strict = [], {}, []
    for j, t in enumerate(trajs):
        row, s = rows[j // cfg.n_samples], j % cfg.n_samples
        ok = bool(t.info.get("success", False))
        correct.setdefault(row["id"], []).append(ok)
        grading = {"correct": ok, "pred": t.info.get("pred"), "answer": row["answer"], "source": row["source"]}
        if row.get("messages") is None:  # math-verify's rows have no tag reading; an unplayed episode is wrong
            grading["strict"] = bool(t.info.get("strict", False))
            strict.append(grading["strict"])
        records.append(common.record(row["id"], s, t, **grading))
    pm = common.pass_metrics(correct)
    acc = pm.pop(f"mean@{cfg.n_samples}", float("nan"))
    by_source = {}
    for src in sorted({r["source"] for r in rows}):
        rs = [r for r in records if r["source"] == src]
        if rs:
            by_source[src] = sum(r["correct"] for r in rs) / len(rs)
    report = common.finish_report(
        "math",
        records,
        bad or [],
        wall_s,
        "accuracy",
        accuracy=acc,
        **({"accuracy_strict": sum(strict) / len(strict)} if strict else {}),
        **skill_bars(rows),
        **{f"mean@{cfg.n_samples}": acc},
        **pm,
        accuracy_by_source=by_source,
    )
    return report, records


def run(model, tok, rows: list[dict], cfg: MathEvalConfig) -> dict:
    """The in-training entry point: the report only (see `common.metrics` for TensorBoard tags)."""
    return evaluate(model, tok, rows, cfg)[0]


def main(argv: list[str] | None = None) -> dict:
    import tyro

    cfg = tyro.cli(MathEvalConfig, args=argv, description=__doc__)
    rows, bad = load_rows(cfg.data, cfg.limit, cfg.prompt_key, cfg.answer_key, cfg.split)
    return models.run_cli("math", cfg, lambda model, tok: evaluate(model, tok, rows, cfg, bad))


if __name__ == "__main__":
    main()
    process.exit_now(0)  # a finished eval skips the interpreter's ~2 s teardown (torch, vLLM and transformers loaded)
