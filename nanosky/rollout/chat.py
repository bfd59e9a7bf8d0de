"""Chat rendering to token ids with a loss mask — shared by the warm start (SFT) and the agent loop (RL).

The agent loop is token-in, token-out: it renders the opening conversation once, then appends exactly the token
ids the engine generated (mask 1) and the ids of each observation turn (mask 0). Observation ids come from the
*difference* between the chat template's rendering with and without the new messages, so for any template whose
rendering of a conversation is a prefix of its rendering of a longer one (the bundled template, Qwen2.5, Llama 3),
`prompt ids + generated ids + observation ids` equals the template's rendering of the final conversation — except
where the model itself produced a non-canonical tokenisation of its text, which we keep as generated (re-tokenising
would train on tokens the policy never sampled).
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def render(
    tok, messages: list[Message], tools: list[dict] | None = None, add_generation_prompt: bool = False
) -> str:
    return tok.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def prompt_ids(tok, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
    """Ids of the conversation so far, ending with the assistant generation prompt."""
    return encode(tok, render(tok, messages, tools, add_generation_prompt=True))


def observation_ids(
    tok, history: list[Message], new: list[Message], tools: list[dict] | None = None
) -> list[int]:
    """Ids to append after an assistant turn (which ended in the eos token) so that the sequence continues with
    `new` messages and a fresh assistant generation prompt."""
    eos = tok.eos_token
    before = render(tok, history, tools)
    after = render(tok, history + new, tools, add_generation_prompt=True)
    cut = before.rfind(eos)
    if cut >= 0 and after.startswith(before[: cut + len(eos)]):
        return encode(tok, after[cut + len(eos) :])
    # A template that rewrites earlier turns (e.g. strips reasoning): fall back to rendering the new turns alone.
    return encode(tok, "\n" + render(tok, new, None, add_generation_prompt=True))


def encode_conversation(
    tok, messages: list[Message], tools: list[dict] | None = None
) -> tuple[list[int], list[int]]:
    """Whole conversation → (ids, loss_mask); mask is 1 on assistant content and its closing eos token."""
    ids: list[int] = []
    mask: list[int] = []
    eos_id = tok.eos_token_id
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        head = prompt_ids(tok, messages[:i], tools)
        full = encode(tok, render(tok, messages[: i + 1], tools))
        if full[: len(head)] != head:
            raise ValueError("chat template rendering is not prefix-stable; cannot build a loss mask")
        ids_turn = full[len(head) :]
        # Everything after the eos (the newline between turns) is template glue, not policy output.
        end = ids_turn.index(eos_id) + 1 if eos_id in ids_turn else len(ids_turn)
        mask.extend([0] * (len(head) - len(ids)))
        mask.extend([1] * end + [0] * (len(ids_turn) - end))
        ids = full
    full = encode(tok, render(tok, messages, tools))
    mask.extend([0] * (len(full) - len(mask)))
    return full, mask
