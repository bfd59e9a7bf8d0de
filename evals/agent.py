"""Agent benchmark in HLE's schema: questions answered by a tool-using agent (search / wiki / python_exec).

    python -m evals.agent --ckpt runs/tool_use-grpo                # shipped sample (evals/data/hle_sample.jsonl)
    python -m evals.agent --base-url http://localhost:8000/v1 --data hle_text_only.jsonl --ask-confidence
    python -m evals.agent ... --judge-base-url URL --judge-model M    # a model judge for free-form misses
    python -m evals.agent --ckpt runs/tool_use-grpo --env tool_use --agent my_agent:solve   # your own agent

Rows: `id`, `question`, `answer`, `answer_type` ("exactMatch" | "multipleChoice"); rows with an `image` are
skipped and counted (the agent is text-only). The agent calls tools with `<tool_call>...</tool_call>` and ends with
`<answer>...</answer>` (or HLE's "Answer: ..." line), optionally with a confidence ("Confidence: 80%" or
`<confidence>80</confidence>`). Grading is normalised exact match (case, whitespace, articles, numbers; option
letters and option texts for multiple choice). Accuracy, and the RMS calibration error over the answers that
state a confidence, are reported.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

from envs.base import Env, Message, StepResult
from envs.text_math import normalize_answer
from envs.tool_use import NUDGE
from envs.tool_use import SYSTEM_PROMPT as TOOL_PROMPT  # the prompt the bundled model saw in tool demos
from envs.tools import get_tool, parse_tool_calls, run_tool_call
from evals import common, models
from nanosky import process

SHIPPED = {"hle_sample": common.DATA_DIR / "hle_sample.jsonl"}
CONFIDENCE_PROMPT = " Then state your confidence as Confidence: N%."
ANSWER_TYPES = ("exactMatch", "multipleChoice")


@dataclass(kw_only=True)
class AgentEvalConfig(common.BaseEvalConfig):
    max_steps: int = 6
    """Assistant turns per question (tool calls + the answer)."""
    max_new_tokens: int = 96
    tools: tuple[str, ...] = ("search", "wiki", "python_exec")
    """Tools the agent may call (names from envs.tools)."""
    ask_confidence: bool = False
    """Ask for a confidence after the answer (HLE's format); the tiny model was not trained to give one."""
    judge_base_url: str | None = None
    """Optional OpenAI-compatible judge for exactMatch answers that miss the normalised match."""
    judge_model: str | None = None
    env: str | None = None
    """Instead of HLE rows: the held-out split of a registered env (e.g. tool_use), episodes 0..limit-1 (default
    limit 100), graded by the env; with --agent, the way an agent trained with --rollout.agent is evaluated."""
    env_kwargs: str = "{}"
    """--env: the env's keyword arguments, as JSON (e.g. '{"kinds": ["arith", "python"]}')."""


# ---------------------------------------------------------------------------------------------- grading


def extract_final(text: str) -> tuple[str | None, float | None]:
    """(answer, confidence in [0, 1]) from an agent's last turn; None where absent."""
    if not isinstance(text, str):
        return None, None
    from envs.text_math import extract_answer

    ans = extract_answer(text)
    if ans is None and (m := re.findall(r"^\s*\**answer\**\s*:\s*(.+)$", text, flags=re.IGNORECASE | re.MULTILINE)):
        ans = m[-1].strip()
    conf = None
    m = re.findall(r"<confidence>\s*([\d.]+)\s*%?\s*</confidence>", text) or re.findall(
        r"confidence\**\s*:\s*([\d.]+)\s*%?", text, flags=re.IGNORECASE
    )
    if m:
        try:
            v = float(m[-1])
            conf = v / 100 if v > 1 else v
            conf = conf if 0.0 <= conf <= 1.0 else None
        except ValueError:
            conf = None
    return ans, conf


def normalize_text(s: str) -> str:
    """Lower case, no surrounding quotes/punctuation, no leading article, single spaces; numbers canonical."""
    s = re.sub(r"\s+", " ", str(s)).strip().strip("\"'`*").strip().rstrip(".!").strip()
    s = re.sub(r"^(the|a|an) ", "", s, flags=re.IGNORECASE)
    return normalize_answer(s)


def parse_choices(question: str) -> dict[str, str]:
    """{"A": "option text", ...} from "Answer Choices:" lines ("A. text", "B) text", "(C) text")."""
    part = re.split(r"answer choices\s*:", question, flags=re.IGNORECASE)
    text = part[-1] if len(part) > 1 else question
    out = {}
    for m in re.finditer(r"(?:^|\n|\s)\(?([A-Z])[.)]\s+(.+?)(?=\s+\(?[A-Z][.)]\s|\n|$)", text):
        out.setdefault(m.group(1), m.group(2).strip())
    return out


def choice_letter(pred: str, choices: dict[str, str]) -> str | None:
    """The option a prediction names: "B", "(b)", "B. text", "Option B", "answer is B", or an option's text."""
    p = pred.strip()
    if m := re.fullmatch(r"\(?([A-Za-z])\)?[.):]?(?:\s.*)?", p, flags=re.DOTALL):
        if m.group(1).upper() in choices or not choices:
            return m.group(1).upper()
    if m := re.search(r"\b(?:option|choice|answer is)\s*\(?([A-Za-z])\b", p, flags=re.IGNORECASE):
        return m.group(1).upper()
    norm = normalize_text(p)
    hits = [k for k, v in choices.items() if normalize_text(v) == norm]
    return hits[0] if len(hits) == 1 else None


def grade(pred: str | None, answer: str, answer_type: str, question: str = "") -> bool:
    """Normalised exact match; for multipleChoice the predicted option (letter or text) must be the answer's."""
    if pred is None or not str(pred).strip():
        return False
    try:
        if answer_type == "multipleChoice":
            choices = parse_choices(question)
            gold = choice_letter(answer, choices) or answer.strip().upper()
            return choice_letter(pred, choices) == gold
        return normalize_text(pred) == normalize_text(answer)
    except Exception:  # noqa: BLE001 - grading never raises
        return False


def calibration_error(confidence: list[float], correct: list[bool], bin_size: int = 100) -> float:
    """RMS calibration error: sort by confidence, cut into bins of `bin_size` (the last bin takes the rest),
    then sqrt(sum_b |b|/n * (mean confidence_b - accuracy_b)^2)."""
    if not confidence:
        return float("nan")
    pairs = sorted(zip(confidence, correct))
    n = len(pairs)
    nb = max(1, n // bin_size)
    total = 0.0
    for b in range(nb):
        chunk = pairs[b * bin_size : (b + 1) * bin_size if b < nb - 1 else n]
        gap = sum(c for c, _ in chunk) / len(chunk) - sum(ok for _, ok in chunk) / len(chunk)
        total += len(chunk) / n * gap * gap
    return math.sqrt(total)


def judge_answer(client, question: str, answer: str, response: str) -> bool:
    """Ask a judge model whether `response` gives `answer`; any failure counts as "no"."""
    prompt = (
        f"Question: {question}\nCorrect answer: {answer}\nResponse: {response}\n"
        "Does the response's final answer mean the same as the correct answer? Reply with yes or no."
    )
    try:
        text = client.chat([{"role": "user", "content": prompt}], max_tokens=8, temperature=0.0)
    except Exception:  # noqa: BLE001
        return False
    return text.strip().lower().startswith("yes")


# ---------------------------------------------------------------------------------------------- data + env


def load_rows(spec: str | None, limit: int | None = None) -> tuple[list[dict], list[dict]]:
    """(valid text rows, bad rows incl. image rows). `spec`: "hle_sample" (default) or an HLE-schema JSONL."""
    spec = spec or "hle_sample"
    raw, bad = common.read_jsonl(SHIPPED.get(spec, spec))
    rows = []
    for r in raw:
        missing = [k for k in ("id", "question", "answer", "answer_type") if not str(r.get(k) or "").strip()]
        if missing:
            bad.append(common.bad_row(r, f"missing field(s): {', '.join(missing)}"))
        elif r.get("image"):
            bad.append({**common.bad_row(r, "image question (text-only agent)"), "image": True})
        elif r["answer_type"] not in ANSWER_TYPES:
            bad.append(common.bad_row(r, f"answer_type {r['answer_type']!r} not in {ANSWER_TYPES}"))
        else:
            rows.append(
                {k: r[k] for k in ("id", "question", "answer", "answer_type")} | {"category": r.get("category")}
            )
    return common.take(rows, limit), bad


class AgentQAEnv(Env):
    """One question; tool calls are run and shown, an answer ends the episode (reward 1.0 if correct)."""

    name = "agent_qa"

    def __init__(
        self,
        row: dict,
        max_turns: int = 6,
        tools: tuple[str, ...] = ("search", "wiki", "python_exec"),
        ask_confidence: bool = False,
        tool_timeout_s: float = 10.0,
        max_calls_per_turn: int = 4,
    ):
        self.row, self.max_turns, self.tool_timeout_s = row, max_turns, tool_timeout_s
        self.max_calls_per_turn = max_calls_per_turn
        self.tools = [get_tool(n) for n in tools]
        self.system_prompt = TOOL_PROMPT + (CONFIDENCE_PROMPT if ask_confidence else "")
        self.turn = self.n_calls = self.n_invalid = 0

    def reset(self) -> list[Message]:
        self.turn = self.n_calls = self.n_invalid = 0
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.row["question"]},
        ]

    def step(self, action: str) -> StepResult:
        try:
            return self._step(action if isinstance(action, str) else "")
        except Exception as e:  # noqa: BLE001 - step never raises
            return StepResult([], 0.0, True, self._info(False, error=repr(e)[:300]))

    def _step(self, action: str) -> StepResult:
        self.turn += 1
        last = self.turn >= self.max_turns
        if calls := parse_tool_calls(action):  # tool calls win over an answer in the same turn (it was a guess)
            table = {t.name: t for t in self.tools}
            results = [run_tool_call(c, table, self.tool_timeout_s) for c in calls[: self.max_calls_per_turn]]
            self.n_calls += len(results)
            self.n_invalid += sum(not r.ok for r in results)
            obs = [] if last else [r.to_message() for r in results]
            return StepResult(obs, 0.0, last, self._info(False, calls=[r.record() for r in results]))
        pred, conf = extract_final(action)
        if pred is not None:
            ok = grade(pred, self.row["answer"], self.row["answer_type"], self.row["question"])
            return StepResult([], float(ok), True, self._info(ok, pred=pred, confidence=conf))
        return StepResult([] if last else [{"role": "user", "content": NUDGE}], 0.0, last, self._info(False))

    def _info(self, success: bool, **extra: Any) -> dict[str, Any]:
        # tool_calls / invalid_calls are cumulative over the episode, as the agent loop expects.
        return {"success": success, "tool_calls": self.n_calls, "invalid_calls": self.n_invalid, **extra}


# ---------------------------------------------------------------------------------------------- eval


def evaluate(
    model, tok, rows: list[dict], cfg: AgentEvalConfig, bad: list[dict] | None = None
) -> tuple[dict, list[dict]]:
    """(report, per-episode records) for HLE-schema rows."""
    from evals.models import rollout
    from nanosky.agent import OpenAIBackend

    t0 = time.time()
    envs = [
        AgentQAEnv(r, cfg.max_steps, tuple(cfg.tools), cfg.ask_confidence) for r in rows for _ in range(cfg.n_samples)
    ]
    trajs = rollout(model, tok, envs, cfg, desc="agent")
    judge = OpenAIBackend(cfg.judge_base_url, cfg.judge_model) if cfg.judge_base_url else None
    records, correct, confs = [], {}, []
    for j, t in enumerate(trajs):
        row, s = rows[j // cfg.n_samples], j % cfg.n_samples
        ok, judged = bool(t.info.get("success", False)), False
        pred, conf = t.info.get("pred"), t.info.get("confidence")
        if not ok and judge and pred and row["answer_type"] == "exactMatch":
            ok = judged = judge_answer(judge, row["question"], row["answer"], t.messages[-1]["content"])
        correct.setdefault(row["id"], []).append(ok)
        if conf is not None:
            confs.append((conf, ok))
        records.append(
            common.record(
                row["id"],
                s,
                t,
                correct=ok,
                pred=pred,
                answer=row["answer"],
                answer_type=row["answer_type"],
                confidence=conf,
                judged=judged,
            )
        )
    pm = common.pass_metrics(correct)
    acc = pm.pop(f"mean@{cfg.n_samples}", 0.0)
    extra: dict[str, Any] = {"accuracy": acc, **pm}
    extra["answered"] = sum(r["pred"] is not None for r in records) / max(len(records), 1)
    extra["n_image_skipped"] = sum(bool(b.get("image")) for b in bad or [])
    extra["n_with_confidence"] = len(confs)
    extra["calibration_error"] = calibration_error(*map(list, zip(*confs))) if confs else None
    report = common.finish_report("agent", records, bad or [], time.time() - t0, "accuracy", **extra)
    return report, records


def evaluate_env(model, tok, cfg: AgentEvalConfig) -> tuple[dict, list[dict]]:
    """(report, records) on `cfg.env`'s held-out split: success as the env grades it, pass@k over the samples."""
    import json

    import envs
    from evals.models import rollout

    t0, n = time.time(), cfg.limit or 100
    kwargs = json.loads(cfg.env_kwargs)
    episodes = [envs.make(cfg.env, split="test", seed=i, **kwargs) for i in range(n) for _ in range(cfg.n_samples)]
    trajs = rollout(model, tok, episodes, cfg, desc=cfg.env)
    if (
        scorer := envs.group_scorer(cfg.env, "test", **kwargs)
    ) is not None:  # a TRL reward function: per episode's samples
        from nanosky.env_rewards import score_groups

        for j, t in enumerate(trajs):
            t.env_seed = j // cfg.n_samples
        score_groups(scorer, trajs, by="env_seed")
    correct: dict[int, list[bool]] = {}
    records = []
    for j, t in enumerate(trajs):
        i, s = divmod(j, cfg.n_samples)
        correct.setdefault(i, []).append(bool(t.success))
        records.append(common.record(i, s, t, correct=bool(t.success), reward=t.reward))
    pm = common.pass_metrics(correct)
    acc = pm.pop(f"mean@{cfg.n_samples}", 0.0)
    report = common.finish_report(f"agent/{cfg.env}", records, [], time.time() - t0, "accuracy", accuracy=acc, **pm)
    return report, records


def run(model, tok, rows: list[dict], cfg: AgentEvalConfig) -> dict:
    """The in-training entry point: the report only."""
    return evaluate(model, tok, rows, cfg)[0]


def main(argv: list[str] | None = None) -> dict:
    import tyro

    cfg = tyro.cli(AgentEvalConfig, args=argv, description=__doc__)
    if cfg.env:
        return models.run_cli(f"agent-{cfg.env}", cfg, lambda model, tok: evaluate_env(model, tok, cfg))
    rows, bad = load_rows(cfg.data, cfg.limit)
    return models.run_cli("agent", cfg, lambda model, tok: evaluate(model, tok, rows, cfg, bad))


if __name__ == "__main__":
    main()
    process.exit_now(0)  # a finished eval skips the interpreter's ~2 s teardown (torch, vLLM and transformers loaded)
