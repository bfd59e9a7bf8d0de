"""Chat rendering to token ids with a loss mask — shared by the warm start (SFT) and the agent loop (RL).

The agent loop is token-in, token-out: it renders the opening conversation once, then appends exactly the token
ids the engine generated (mask 1) and the ids of each observation turn (mask 0). Observation ids come from the
*difference* between the chat template's rendering with and without the new messages, so for any template whose
rendering of a conversation is a prefix of its rendering of a longer one (the bundled template, Qwen2.5, Llama 3),
`prompt ids + generated ids + observation ids` equals the template's rendering of the final conversation — except
where the model itself produced a non-canonical tokenisation of its text, which we keep as generated (re-tokenising
would train on tokens the policy never sampled).

Tools for any template: a template with a tools section (Qwen2.5, Llama 3.1, Hermes) lists the tools it is given;
one without (SmolLM2's, ChatML) would drop them silently, so `render` writes them into the system turn instead
(`TOOLS_FALLBACK`: the schemas, one JSON object a line, and the `<tool_call>` format `envs.tools.parse` reads),
appended to the conversation's system message or as a new first one. Every rendering goes through `render` (the
engine's prompts, the endpoint's `tools` requests, the trainer's rows), so token-in/token-out stays exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Message = dict[str, Any]
CHATML = Path(__file__).resolve().parents[1] / "assets" / "chatml.jinja"
"""ChatML, the documented `--model.chat-template` for a base model that has no template."""
PROBE: list[Message] = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Find the answer."},
    {"role": "assistant", "content": "<think>\nLook first.\n</think>\nI will look."},
    {"role": "user", "content": "Observation: 42."},
    {"role": "assistant", "content": "<think>\nIt is 42.\n</think>\nThe answer is 42."},
]
"""A multi-turn conversation with reasoning blocks: what `check_template` renders at start-up."""


TOOLS_FALLBACK = """# Tools

You may call these functions. Their signatures, one JSON object a line:
<tools>
{schemas}
</tools>

To call one, reply with a JSON object of its name and arguments inside <tool_call></tool_call> tags:
<tool_call>{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}</tool_call>"""
"""The system turn's tools section for a template that has none (`renders_tools`)."""


class TemplateError(ValueError):
    """A chat template the run cannot train with (none, one that cannot render the roles, or one that rewrites
    earlier turns in concatenated mode)."""


def load_tokenizer(path: str, chat_template: str | None = None):
    """The model's tokenizer; `chat_template` (a Jinja file) replaces or supplies its template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if chat_template:
        tok.chat_template = Path(chat_template).read_text()
    return tok


def append_only(tok, messages: list[Message]) -> bool:
    """Whether the agent loop's concatenated row (the opening prompt, each assistant turn's ids and eos, then
    `observation_ids`) is the template's own rendering of the whole conversation. A template that rewrites earlier
    turns (Qwen3's drops the reasoning of turns before the last user message) fails: the policy would be trained
    on a context it never meets when the template renders the conversation."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids, hist, k = prompt_ids(tok, messages[:first]), list(messages[:first]), first
    while k < len(messages):
        ids += encode(tok, messages[k]["content"]) + [tok.eos_token_id]
        hist.append(messages[k])
        k += 1
        new = []
        while k < len(messages) and messages[k]["role"] != "assistant":
            new.append(messages[k])
            k += 1
        if new:
            ids += observation_ids(tok, hist, new)
            hist += new
    full = encode(tok, render(tok, messages))
    return full[: len(ids)] == ids


def check_template(tok, mode: str) -> None:
    """Start-up check of the chat template for `--rollout.mode` `mode`; raises TemplateError naming the fix."""
    if not getattr(tok, "chat_template", None):
        raise TemplateError(f"the model has no chat template: pass --model.chat-template FILE (ChatML: {CHATML})")
    try:
        render(tok, PROBE, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - a template's own raise_exception, or a Jinja error
        raise TemplateError(
            f"the chat template cannot render a system / user / assistant conversation ({type(e).__name__}: {e}); "
            "pass --model.chat-template FILE"
        ) from e
    if mode == "concat" and not append_only(tok, PROBE):
        raise TemplateError(
            "the chat template rewrites earlier turns (e.g. drops their <think> blocks), so concatenated rows would "
            "train on a context the template never renders: use --rollout.mode stepwise (each turn re-rendered), "
            "or --model.chat-template FILE"
        )


def render(tok, messages: list[Message], tools: list[dict] | None = None, add_generation_prompt: bool = False) -> str:
    """The template's text of `messages`; `tools` listed by the template, or by `TOOLS_FALLBACK` where it has no
    tools section."""
    if tools and not renders_tools(tok):
        messages, tools = with_tools(messages, tools), None
    return tok.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def renders_tools(tok) -> bool:
    """Whether the tokenizer's chat template lists the tools it is given (checked once per template, on `tok`)."""
    template = getattr(tok, "chat_template", None)
    known = getattr(tok, "_nanosky_renders_tools", None)
    if known is None or known[0] != template:
        probe = {"type": "function", "function": {"name": "nanosky_probe_tool", "description": "", "parameters": {}}}
        try:
            text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[probe], tokenize=False)
        except Exception:  # noqa: BLE001 - a template that refuses tools has no tools section
            text = ""
        known = (template, "nanosky_probe_tool" in text)
        tok._nanosky_renders_tools = known  # the tokenizer's own fact, kept with it
    return known[1]


def with_tools(messages: list[Message], tools: list[dict]) -> list[Message]:
    """`messages` with `TOOLS_FALLBACK` in the system turn: after the conversation's system message, or as a new
    first one."""
    block = TOOLS_FALLBACK.format(schemas="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def prompt_ids(tok, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
    """Ids of the conversation so far, ending with the assistant generation prompt."""
    return encode(tok, render(tok, messages, tools, add_generation_prompt=True))


def observation_ids(tok, history: list[Message], new: list[Message], tools: list[dict] | None = None) -> list[int]:
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


def encode_conversation(tok, messages: list[Message], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
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
