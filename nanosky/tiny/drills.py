"""Copy drills, shared by the bundled models' data recipes (`data.py`, `swe_data.py`): tool use and code edits are
mostly copying, and dense copy targets teach a tiny model to copy fast."""

from __future__ import annotations

COPY_PROMPT = "Repeat the text exactly."


def copy_drill(text: str, answer: str | None = None) -> tuple[list[dict], None]:
    """One example: the system asks to repeat `text`; the reply is `answer` (default: `text` itself)."""
    return (
        [
            {"role": "system", "content": COPY_PROMPT},
            {"role": "user", "content": text},
            {"role": "assistant", "content": text if answer is None else answer},
        ],
        None,
    )
