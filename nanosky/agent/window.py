"""The step-wise history window (`--rollout.mode stepwise`): each turn is sampled from the opening messages and the
last K turns, re-rendered, so a long episode fits a short context. The agent loop samples from `window(...)`;
`nanosky/train/stepwise.py` turns the sampled turns into training rows.

    shown = window(messages, k=2)      # opening + "[3 earlier steps not shown]" + the last 2 turns
"""

from __future__ import annotations

from envs.base import ACTIONS_HEADER


def window(messages: list[dict], k: int) -> list[dict]:
    """The opening messages (everything before the first assistant turn), then the last `k` turns (an assistant
    message and the observations that answered it). When turns are dropped, the opening's last message says how
    many, so the model knows the episode did not just start. Only the current observation keeps its admissible-
    action list (`show_actions`): past lists are stale, and a small model copies from them (as verl-agent's prompts
    do, the history shows observations and actions only)."""
    return _window(_drop_stale_actions(messages), k)


def _drop_stale_actions(messages: list[dict]) -> list[dict]:
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    return [
        {**m, "content": m["content"].split(ACTIONS_HEADER)[0]}
        if i < last and m["role"] != "assistant" and isinstance(m.get("content"), str)
        else m
        for i, m in enumerate(messages)
    ]


def _window(messages: list[dict], k: int) -> list[dict]:
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    opening, turns = list(messages[:first]), []
    for m in messages[first:]:
        if m["role"] == "assistant":
            turns.append([m])
        else:
            turns[-1].append(m)
    hidden = len(turns) - k
    if hidden <= 0:
        return list(messages)
    last = opening[-1] if opening else None
    if last is not None and isinstance(last.get("content"), str):
        s = "s" if hidden > 1 else ""
        opening[-1] = {**last, "content": f"{last['content']}\n\n[{hidden} earlier step{s} not shown]"}
    return opening + [m for turn in turns[-k:] for m in turn]
