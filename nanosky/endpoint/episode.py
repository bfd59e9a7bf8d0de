"""The exact tokens of one episode an external agent runs through the OpenAI-compatible endpoint.

An agent harness sends whole conversations as chat messages; training needs the token ids the engine sampled. The
endpoint renders each call's prompt, samples ids with the engine, and records them here. A call that extends the
previous one append-only (the same messages, then the assistant reply the endpoint returned, then tool or user
messages) continues the same row: the sampled ids stay as they were sampled, and the new messages' ids, masked,
are the difference between the chat template's renderings with and without them (as `chat.observation_ids`
computes it for nanosky's own loop). Anything else starts a new segment, rendered afresh: an edited or truncated
history, new tools, another system message, a reply cut at the length limit, or a template whose rendering of the
longer conversation does not extend the shorter one (Qwen3's drops earlier `<think>` blocks). Sampled text is
never re-tokenised for training.

    ep = Episode(tok)
    ids, cont = ep.prompt(messages, tools)          # cont: whether this call continues the last segment
    ... sample `out` from `ids` ...
    ep.record(messages, tools, ids, cont, out.token_ids, out.logprobs, version, reply, out.finish_reason)
    rows = ep.segments                              # each: ids, loss_mask, logprobs, versions, calls
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nanosky.rollout.chat import Message, encode, prompt_ids, render

CONTINUED_ROLES = ("tool", "user")
"""Roles a continuing call may add after the returned assistant message."""


@dataclass
class Segment:
    """One trainable row of an episode: a rendered prompt, then sampled ids (mask 1) and observation ids (mask 0)."""

    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int] = field(default_factory=list)  # the weight version of each call's sample (its first token's)
    token_versions: list[int] = field(default_factory=list)  # per id: the version that sampled it, -1 if not sampled
    turn_starts: list[int] = field(default_factory=list)  # index in `ids` of each call's first sampled id
    messages: list[Message] = field(default_factory=list)  # the conversation so far, with the last reply
    tools: list[dict] = field(default_factory=list)
    truncated: bool = False  # the last call stopped at the length limit: nothing continues it

    @property
    def prompt_len(self) -> int:
        return self.turn_starts[0] if self.turn_starts else len(self.ids)

    @property
    def calls(self) -> int:
        return len(self.turn_starts)


def normalise(message: Message) -> Message:
    """A message as the continuation check compares it: the fields that reach the template, with an empty content
    equal to none, and tool-call arguments compared as parsed JSON (an SDK may re-serialise them)."""
    out: dict[str, Any] = {"role": message.get("role"), "content": message.get("content") or ""}
    if isinstance(out["content"], list):  # content parts: their text, in order
        out["content"] = "".join(p.get("text", "") for p in out["content"] if isinstance(p, dict))
    calls = []
    for c in message.get("tool_calls") or []:
        f = c.get("function", {}) if isinstance(c, dict) else {}
        args = f.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass
        calls.append((f.get("name"), json.dumps(args, sort_keys=True)))
    if calls:
        out["tool_calls"] = calls
    if message.get("role") == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    return out


def for_template(messages: list[Message]) -> list[Message]:
    """Messages as a chat template can render them: a missing or null content (an assistant turn that only calls
    tools) is "", and content parts are their text (a template would print "None" or a list)."""
    out = []
    for m in messages:
        c = m.get("content")
        if c is None or isinstance(c, list):
            m = {**m, "content": normalise(m)["content"]}
        out.append(m)
    return out


class Episode:
    """The segments of one episode, built call by call."""

    def __init__(self, tok):
        self.tok = tok
        self.segments: list[Segment] = []

    def continuation(self, messages: list[Message], tools: list[dict] | None) -> list[int] | None:
        """The ids to append to the last segment for this call (its new messages, masked, and the generation
        prompt), or None when the call does not continue it append-only."""
        seg = self.segments[-1] if self.segments else None
        if seg is None or seg.truncated or (tools or []) != seg.tools:
            return None
        n = len(seg.messages)
        if len(messages) <= n or [normalise(m) for m in messages[:n]] != [normalise(m) for m in seg.messages]:
            return None
        if any(m.get("role") not in CONTINUED_ROLES for m in messages[n:]):
            return None
        eos, messages = self.tok.eos_token, for_template(messages)
        # the history as this request spells it (equal to the recorded one once normalised), so that the
        # difference is only what the new messages add
        before = render(self.tok, messages[:n], tools)
        after = render(self.tok, messages, tools, add_generation_prompt=True)
        cut = before.rfind(eos)
        if cut < 0 or not after.startswith(before[: cut + len(eos)]):
            return None  # the template rewrote an earlier turn: a new segment, never wrong tokens
        return encode(self.tok, after[cut + len(eos) :])

    def prompt(self, messages: list[Message], tools: list[dict] | None = None) -> tuple[list[int], bool]:
        """The prompt ids for a call, and whether they continue the last segment."""
        tail = self.continuation(messages, tools)
        if tail is not None:
            return self.segments[-1].ids + tail, True
        return prompt_ids(self.tok, for_template(messages), tools), False

    def record(
        self,
        messages: list[Message],
        tools: list[dict] | None,
        ids: list[int],
        continued: bool,
        sampled: list[int],
        logprobs: list[float],
        version: int,
        reply: Message,
        finish_reason: str,
        sampled_versions: list[int] | None = None,
    ) -> Segment:
        """Add a call's sample: `ids` is what `prompt` returned for it, `reply` the assistant message returned.
        `sampled_versions`: per sampled id, the weights that sampled it (all `version` when not given)."""
        if continued:
            seg = self.segments[-1]
            new = len(ids) - len(seg.ids)
            seg.ids, seg.loss_mask, seg.logprobs = (
                list(ids),
                seg.loss_mask + [0] * new,
                seg.logprobs + [0.0] * new,
            )
            seg.token_versions += [-1] * new
        else:
            seg = Segment(ids=list(ids), loss_mask=[0] * len(ids), logprobs=[0.0] * len(ids), tools=list(tools or []))
            seg.token_versions = [-1] * len(ids)
            self.segments.append(seg)
        seg.turn_starts.append(len(seg.ids))
        seg.ids += list(sampled)
        seg.loss_mask += [1] * len(sampled)
        seg.logprobs += list(logprobs)
        seg.versions.append(version)
        seg.token_versions += list(sampled_versions) if sampled_versions else [version] * len(sampled)
        seg.messages = [*messages, reply]
        seg.truncated = finish_reason == "length"
        return seg

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.segments)
