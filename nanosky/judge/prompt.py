"""What a judge is asked and how its answer is read: the messages (the task once, then each attempt), the JSON
schema its answer is constrained to, and a tolerant parse that clips scores to [0, 1] and ties them to the ids.

    msgs = group_messages(task, ["attempt 0's reply", "attempt 1's reply"], rubric)
    scores = parse_group(text, ids=[0, 1])        # {0: (0.8, "why"), 1: (0.1, "why")}; raises JudgeError
"""

from __future__ import annotations

import json
import math
from pathlib import Path

DEFAULT_RUBRIC = Path(__file__).with_name("rubric.txt")


class JudgeError(ValueError):
    """The judge's answer cannot be used: not JSON, a missing or unknown id, a score that is not a number."""


# Printable ASCII without '"' and '\\': one byte, so at most one token, per character of an explanation.
_PLAIN = r"[ !#-\[\]-~]"
_SCORE_MAX = "0.000001"  # the longest score a bounded number takes (xgrammar writes at most 6 decimals)
EXPLANATION_MAX = 120  # a sentence; and xgrammar 0.2.8 fails to compile a pattern repeated over 128 times


def strict_schema(n: int | None, chars: int) -> dict:
    """A schema that leaves nothing open (the self-judge's, under vLLM's structured outputs): for a group of `n`,
    entry k is attempt k's (its id a constant, so every id once and in order); `n` None: one attempt. Each
    explanation is at most `chars` plain characters, each score a number in [0, 1]. The answer is then at most
    `answer_chars(n, chars)` characters, and a budget of that many tokens (+1 for the end) always finishes it."""
    entry = {
        "explanation": {"type": "string", "pattern": f"^{_PLAIN}{{0,{chars}}}$"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    }
    if n is None:
        return {"type": "object", "properties": entry, "required": list(entry)}
    items = [
        {
            "type": "object",
            "properties": {"trajectory_id": {"const": k}} | entry,
            "required": ["trajectory_id", *entry],
        }
        for k in range(n)
    ]
    scores = {"type": "array", "prefixItems": items, "items": False, "minItems": n, "maxItems": n}
    return {"type": "object", "properties": {"scores": scores}, "required": ["scores"]}


_NUMBER_01 = r"(0(\.[0-9]{1,6})?|1(\.0{1,6})?)"  # a score in [0, 1], at most 8 characters as _SCORE_MAX


def strict_regex(n: int | None, chars: int) -> str:
    """`strict_schema(n, chars)` as one regular expression over the compact JSON (no whitespace at all): what a vLLM
    server is asked under (`structured_outputs.regex`), since its JSON mode lets a model write whitespace between
    any two tokens without end unless the server was started with `disable_any_whitespace`. Its answers parse as
    the schema's do, and are never longer than `answer_chars(n, chars)`."""
    entry = f'"explanation":"{_PLAIN}{{0,{chars}}}","score":{_NUMBER_01}'
    if n is None:
        return r"\{" + entry + r"\}"
    items = ",".join(r'\{"trajectory_id":' + str(k) + "," + entry + r"\}" for k in range(n))
    return r'\{"scores":\[' + items + r"\]\}"


def answer_chars(n: int | None, chars: int) -> int:
    """The longest answer `strict_schema(n, chars)` admits (no free whitespace: vLLM's disable_any_whitespace)."""
    x = "x" * chars
    if n is None:
        return len(json.dumps({"explanation": x, "score": 0}).replace("0}", _SCORE_MAX + "}"))
    worst = [{"trajectory_id": k, "explanation": x, "score": 0} for k in range(n)]
    return len(json.dumps({"scores": worst}).replace('"score": 0}', f'"score": {_SCORE_MAX}}}'))


def explanation_chars(n: int | None, max_tokens: int) -> int:
    """The longest explanation (up to EXPLANATION_MAX) that keeps `strict_schema`'s answer within `max_tokens` (with
    its end token); negative where not even an empty one fits."""
    fixed = answer_chars(n, 0) + 1
    return min(EXPLANATION_MAX, (max_tokens - fixed) // (n or 1))


def budget_error(n: int | None, max_tokens: int) -> str | None:
    """Why `max_tokens` cannot hold one strict judgement of `n` attempts (None: one), or None where it can."""
    if explanation_chars(n, max_tokens) >= 0:
        return None
    return (
        f"--reward.judge-max-tokens {max_tokens} cannot hold one judgement of {n or 1} attempts "
        f"(at least {answer_chars(n, 0) + 1} tokens)"
    )


def bounded_chars(n: int | None, max_tokens: int, slack: int = 0) -> int:
    """The longest explanation that keeps a judgement of `n` attempts (None: one) within `max_tokens`, less `slack`
    tokens per attempt (a server that lets the model put a space after each separator: 8 of them an entry).
    JudgeError where not even an empty judgement fits."""
    budget = max_tokens - slack * (n or 1)
    if err := budget_error(n, budget):
        raise JudgeError(err if not slack else err.replace("tokens)", f"tokens, {slack * (n or 1)} more for spaces)"))
    return explanation_chars(n, budget)


def bounded_schema(n: int | None, max_tokens: int, slack: int = 0) -> dict:
    """`strict_schema` with explanations as long as `bounded_chars` allows: every judge that takes a JSON schema is
    asked with it, so the longest answer it admits finishes within `max_tokens`."""
    return strict_schema(n, bounded_chars(n, max_tokens, slack))


def rubric(path: str | None) -> str:
    """The rubric's text: the file given, else the default."""
    p = Path(path) if path else DEFAULT_RUBRIC
    if not p.is_file():
        raise FileNotFoundError(f"--reward.rubric {path}: no such file")
    return p.read_text(encoding="utf-8").strip()


def _task(messages: list[dict]) -> str:
    return "\n\n".join(f"[{m.get('role', '?')}]\n{m.get('content') or ''}" for m in messages)


def group_messages(task: list[dict], attempts: list[str], rubric_text: str) -> list[dict]:
    """One call for a whole group: the shared task once, then each attempt under its id (0..G-1)."""
    body = "\n\n".join(f"<attempt id={i}>\n{a}\n</attempt>" for i, a in enumerate(attempts))
    return [
        {"role": "system", "content": rubric_text},
        {
            "role": "user",
            "content": f"The task:\n<task>\n{_task(task)}\n</task>\n\n{len(attempts)} attempts:\n\n{body}\n\n"
            'Answer with JSON only: {"scores": [{"trajectory_id": <id>, "explanation": "<one sentence>", '
            '"score": <0 to 1>}, ...]}, one entry for every attempt id.',
        },
    ]


def point_messages(task: list[dict], attempt: str, rubric_text: str) -> list[dict]:
    """One call for one attempt."""
    return [
        {"role": "system", "content": rubric_text},
        {
            "role": "user",
            "content": f"The task:\n<task>\n{_task(task)}\n</task>\n\nThe attempt:\n<attempt>\n{attempt}\n</attempt>"
            '\n\nAnswer with JSON only: {"explanation": "<one sentence>", "score": <0 to 1>}.',
        },
    ]


def loads(text: str) -> dict:
    """The JSON object in a judge's answer: the whole text, else the span from its first "{" to its last "}" (a
    server without structured outputs may wrap it in prose or a code fence)."""
    try:
        obj = json.loads(text)
    except (TypeError, ValueError):
        a, b = (text or "").find("{"), (text or "").rfind("}")
        if a < 0 or b <= a:
            raise JudgeError(f"no JSON object in the judge's answer: {text[:120]!r}") from None
        try:
            obj = json.loads(text[a : b + 1])
        except ValueError as e:
            raise JudgeError(f"the judge's answer is not valid JSON ({e}): {text[:120]!r}") from None
    if not isinstance(obj, dict):
        raise JudgeError(f"the judge's answer is not a JSON object: {text[:120]!r}")
    return obj


def _score(x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise JudgeError(f"a score that is not a finite number: {x!r}")
    return min(1.0, max(0.0, float(x)))


def parse_group(text: str, ids: list[int]) -> dict[int, tuple[float, str]]:
    """{id: (score in [0, 1], explanation)} for exactly `ids`; JudgeError on a missing, unknown or repeated id."""
    entries = loads(text).get("scores")
    if not isinstance(entries, list):
        raise JudgeError('the judge\'s answer has no "scores" list')
    out: dict[int, tuple[float, str]] = {}
    for e in entries:
        if not isinstance(e, dict) or "trajectory_id" not in e or "score" not in e:
            raise JudgeError(f"a score entry without trajectory_id and score: {e!r}")
        i = e["trajectory_id"]
        if isinstance(i, str) and i.strip().isdigit():
            i = int(i)
        if i not in ids or i in out:
            raise JudgeError(f"trajectory_id {i!r} is unknown or repeated (ids {ids})")
        out[i] = (_score(e["score"]), str(e.get("explanation", "")))
    if missing := [i for i in ids if i not in out]:
        raise JudgeError(f"the judge left out trajectory ids {missing}")
    return out


def parse_point(text: str) -> tuple[float, str]:
    """(score in [0, 1], explanation) of a pointwise answer."""
    obj = loads(text)
    if "score" not in obj:
        raise JudgeError('the judge\'s answer has no "score"')
    return _score(obj["score"]), str(obj.get("explanation", ""))
