"""The env interface every nanosky environment implements.

An env is one episode of one task. `reset()` returns the opening chat messages; `step(action_text)` takes the
policy's whole assistant turn as a string and returns what to append, the reward and whether the episode is over.
`step` never raises: malformed actions become observations (and usually reward 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}


@dataclass
class StepResult:
    observations: list[Message]  # messages to append to the conversation (empty when done)
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)  # e.g. {"success": bool, "answer": str}


class Env:
    """Base class. Subclasses set `tools` (tool objects with .name/.schema/__call__) when the task uses tools."""

    name: str = "env"
    max_turns: int = 1  # assistant turns before the agent loop stops the episode
    tools: list = []

    def reset(self) -> list[Message]:
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        raise NotImplementedError


_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)


def extract_action(text: str) -> str:
    """The action inside a model's reply for text-game envs: the text of the first `<action>...</action>` if
    present, else the first non-empty line (a reply that is exactly one action is itself)."""
    if match := _ACTION_TAG.search(text):
        return match.group(1).strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""
