"""text_math's answers: what a reply's final answer is, in each of the formats an env can ask for, and how it is
compared and scored (1.0 right, 0.1 well-formed but wrong, 0.0 otherwise). envs/tool_use.py and the evals share it.

    score("385 + 47 = 432 <answer>432</answer>", "432")                 # (1.0, {"success": True, ...})
    score("#### 432", "432", extract=extract_hashes)                     # GSM8K's format
"""

from __future__ import annotations

import re
from fractions import Fraction

SYSTEM_PROMPT = "Think step by step if needed. Put the final answer in <answer></answer>."
HASH_PROMPT = "Solve the problem step by step. Then write the final answer on its own line as: #### <answer>"
LAST_PROMPT = "Solve the problem step by step. End with: The answer is: <answer>"
"""`answer_format="last"`: the closing line SmolLM2-135M-Instruct writes by itself ("The answer is: 20")."""
"""`answer_format="hashes"`: GSM8K's own convention, which pretrained instruct models already follow (SmolLM2-135M
ignores the `<answer>` instruction zero-shot, and ends its GSM8K replies with `#### N`)."""

_OPEN, _CLOSE = "<answer>", "</answer>"
_NUMBER = re.compile(r"([+-]?)(\d+)(?:\.(\d+))?", re.ASCII)
_FRACTION = re.compile(r"([+-]?\d{1,30})\s*/\s*([+-]?\d{1,30})", re.ASCII)


def extract_hashes(text: str) -> str | None:
    """What follows the last `####` up to the end of its line (stripped); None when there is no `####`."""
    if not isinstance(text, str) or (at := text.rfind("####")) < 0:
        return None
    return text[at + 4 :].strip().split("\n", 1)[0].strip()


_SAYS = re.compile(r"answer is\s*:?\s*([^\n]*)", re.IGNORECASE)


def extract_last(text: str) -> str | None:
    """What follows the last "answer is" on its line (its leading number, if it starts with one; a trailing period
    dropped), else the reply's last number; None when there is neither."""
    if not isinstance(text, str):
        return None
    if said := _SAYS.findall(text):
        said = said[-1].strip().rstrip(".").strip()
        lead = re.match(r"\$?([+-]?\d[\d,]*(?:\.\d+)?)\b", said)  # "12 apples" -> "12"
        return lead.group(1) if lead else said or None
    numbers = _NUMBER.findall(text)
    return "".join(numbers[-1][:2]) + (f".{numbers[-1][2]}" if numbers[-1][2] else "") if numbers else None


def extract_answer(text: str) -> str | None:
    """Content of the last closed <answer>...</answer> (stripped); None when there is none."""
    if not isinstance(text, str):
        return None
    end = text.rfind(_CLOSE)
    start = text.rfind(_OPEN, 0, end) if end >= 0 else -1
    if start < 0:
        return None
    # The first close after the last open before the final close: robust to nested and stray tags.
    return text[start + len(_OPEN) : text.find(_CLOSE, start)].strip()


def _canon_number(sign: str, whole: str, frac: str | None) -> str:
    whole, frac = whole.lstrip("0") or "0", (frac or "").rstrip("0")
    out = whole + ("." + frac if frac else "")
    return out if out == "0" or sign != "-" else "-" + out


def normalize_answer(s: str) -> str:
    """Canonical form for comparison: "$1,200.00" -> "1200", "+5" -> "5", "6/3" -> "2", "1/2" -> "0.5", "Yes." -> "yes"."""
    s = str(s).strip().lower().replace(",", "").replace("$", "").strip().rstrip(".").strip()
    if m := _NUMBER.fullmatch(s):
        return _canon_number(*m.groups())
    if m := _FRACTION.fullmatch(s):
        num, den = int(m.group(1)), int(m.group(2))  # at most 30 digits each: cheap and within int limits
        if den == 0:
            return s
        f = Fraction(num, den)
        twos, fives, d = 0, 0, f.denominator
        while d % 2 == 0:
            d, twos = d // 2, twos + 1
        while d % 5 == 0:
            d, fives = d // 5, fives + 1
        if d != 1:  # not a terminating decimal: keep the reduced fraction
            return f"{f.numerator}/{f.denominator}"
        places = max(twos, fives)  # 1/2**a/5**b has exactly max(a, b) decimal places
        whole, frac = divmod(abs(f.numerator) * 10**places // f.denominator, 10**places)
        return _canon_number("-" if f < 0 else "", str(whole), str(frac).zfill(places) if places else None)
    return s


def score(response: str, answer: str, extract=extract_answer) -> tuple[float, dict]:
    """(reward, info): 1.0 for a correct answer, 0.1 for a non-empty <answer> (or `#### ...`, with
    `extract=extract_hashes`) that is wrong, else 0.0."""
    try:
        pred = extract(response)
        format_ok = bool(pred)
        success = format_ok and normalize_answer(pred) == normalize_answer(answer)
    except Exception:  # reward functions never raise; a crash here is scored like garbage
        pred, format_ok, success = None, False, False
    reward = 1.0 if success else 0.1 if format_ok else 0.0
    return reward, {"success": success, "format_ok": format_ok, "pred": pred}


_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (one level of inner braces allowed); None when there is none."""
    found = _BOXED.findall(text) if isinstance(text, str) else []
    return found[-1].strip() if found else None


EXPLICIT = (extract_answer, extract_boxed, extract_hashes)
"""The statements a reply marks as its answer, most explicit first (`stated_answer`, `named_option`)."""


def stated_answer(text: str) -> str | None:
    """The reply's final answer however it states it, the most explicit statement first: the last answer tag, the
    last `\\boxed{}`, the last `#### N`, the last "answer is ...", else the last number. None: it states none."""
    for extract in (*EXPLICIT, extract_last):
        try:
            if found := extract(text):
                return found
        except Exception:  # noqa: BLE001 - a scorer never raises: an unreadable reply states nothing
            return None
    return None


def named_option(text: str, options) -> str | None:
    """The option a reply names, format aside: the one its explicit statement (an answer tag, `\\boxed{}`,
    `#### X`, "answer is X") names alone; else the one named alone in its last clause (split at , ; . ! ? and line
    ends: "7 is not even, it is odd" names odd); else the first named in the last clause that names any ("5 is
    larger than 3" names 5). None: it names none. Options match as whole words, case aside."""
    if not isinstance(text, str) or not options:
        return None

    def names(s: str) -> list[str]:  # the options named in s, in order
        hits = []
        for o in options:
            hits += [(m.start(), o) for m in re.finditer(rf"(?<!\w){re.escape(str(o))}(?!\w)", s, re.IGNORECASE)]
        return [o for _, o in sorted(hits)]

    explicit = next((found for f in EXPLICIT if (found := f(text))), None)
    # "The answer is: Ann. Ben is shorter.": the statement ends with its sentence
    explicit = explicit or (re.split(r"[.;!?](?:\s|$)", said[-1])[0] if (said := _SAYS.findall(text)) else None)
    if explicit is not None and len(set(named := names(explicit))) == 1:
        return named[0]
    clauses = [n for c in re.split(r"[,;.!?\n]", text) if (n := names(c))]
    alone = [n[0] for n in clauses if len(set(n)) == 1]
    return alone[-1] if alone else clauses[-1][0] if clauses else None


def lenient_match(response: str, answer: str, options=None) -> bool:
    """The answer checked however the reply states it (format-free: `eval/accuracy_lenient`). With `options` (a
    closed set of answers), the option it names (`named_option`); else its stated answer (`stated_answer`),
    compared as `score` compares. Never raises."""
    try:
        pred = named_option(response, options) if options else stated_answer(response)
        return pred is not None and normalize_answer(pred) == normalize_answer(answer)
    except Exception:  # noqa: BLE001
        return False


FORMATS = {
    "tags": (SYSTEM_PROMPT, extract_answer),
    "hashes": (HASH_PROMPT, extract_hashes),
    "last": (LAST_PROMPT, extract_last),
}
