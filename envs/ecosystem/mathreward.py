"""The `math` reward of `--env dataset` (and of SkyRL-style math rows): math-verify on the reply's last `\\boxed{}`,
else its last number, against the row's ground truth. Equivalence is math-verify's (symbolic and numeric:
`\\boxed{0.5}` equals `1/2`, `1,200` equals `1200`), so the gold may be written either way.

    reward, info = math_reward("... so \\boxed{\\frac12}", "0.5")   # 1.0, {"success": True, "pred": "\\frac12", ...}

math-verify's own timeouts use `signal.alarm`, which raises inside a thread (the env pool's threads, the in-process
pool), so they are off here; the env pool's step timeout (`--envpool.step-timeout-s`) bounds a pathological reply.
"""

from __future__ import annotations

import re

from envs.ecosystem import quiet, require

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (nested braces balanced), or of "\\boxed 5"."""
    if not isinstance(text, str):
        return None
    starts = list(re.finditer(r"\\(?:boxed|fbox)", text))
    if not starts:
        return None
    i = starts[-1].end()
    if text[i : i + 1] == " ":
        m = re.match(r" ([^\s$]+)", text[i:])
        return m.group(1) if m else None
    if text[i : i + 1] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j].strip()
    return None


def extract(text: str) -> str | None:
    """The reply's answer: its last \\boxed{} content, else its last number (commas kept for math-verify)."""
    if not isinstance(text, str):
        return None
    if (boxed := last_boxed(text)) is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1].rstrip(".") if numbers else None


def _parse(text: str) -> list:
    mv = require("math_verify")
    quiet("math_verify", "math_verify.parser", "math_verify.grader")
    # a number parses as itself ("1,200"); anything else as a boxed expression, so "1+x" is read whole
    return mv.parse(text if _NUMBER.fullmatch(text.strip()) else f"\\boxed{{{text}}}", parsing_timeout=None)


def gold_answer(value) -> str:
    """A row's ground truth as text: GSM8K's "... #### 72" -> "72", a MATH solution -> its last \\boxed{}."""
    text = str(value).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    elif (boxed := last_boxed(text)) is not None:
        text = boxed
    return text


def equivalent(pred: str | None, gold: str) -> bool:
    """math-verify's equivalence of an extracted answer and the gold; never raises."""
    if pred is None or not str(gold).strip():
        return False
    try:
        g, p = _parse(gold), _parse(pred)
        return bool(g and p and require("math_verify").verify(g, p, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a checker never raises: an unparseable answer is a wrong one
        return False


def math_reward(reply: str, gold: str) -> tuple[float, dict]:
    """(reward, info): 1.0 when the reply's answer is equivalent to `gold`, else 0.0 (a malformed reply too)."""
    pred = extract(reply)
    ok = equivalent(pred, gold)
    return (1.0 if ok else 0.0), {"success": ok, "pred": pred, "answer": gold}
