"""The endpoint's token bookkeeping (nanosky/endpoint/episode.py): a call that extends the previous one append-only
continues its row with the sampled ids kept and the new messages masked; anything else is a new segment, rendered
afresh, never wrong tokens. The bundled tiny-tool tokenizer and template, and a template of our own that drops
earlier reasoning as Qwen3's does."""

import json

import pytest

from nanosky.bundled import resolve_model_path
from nanosky.endpoint.episode import Episode, normalise
from nanosky.rollout.chat import encode, load_tokenizer, observation_ids, prompt_ids

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "exact arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {}}},
        },
    }
]
OPENING = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 17 * 23?"}]
# Qwen3-style: an assistant turn before the last user message loses its <think> block
DROP_THINK = (
    "{%- set last = namespace(i=-1) -%}{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
    "{%- set last.i = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}{%- set c = m['content'] or '' -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < last.i and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1].lstrip() -%}{%- endif -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("tiny-tool"))


def _sample(tok, text):
    """What the engine returns for `text`: its ids (as the model would sample them) and the eos."""
    ids = encode(tok, text) + [tok.eos_token_id]
    return ids, [-0.5] * len(ids)


def _call(ep, tok, messages, text, reply, version=0, finish="stop", tools=TOOLS):
    ids, cont = ep.prompt(messages, tools)
    sampled, lps = _sample(tok, text)
    ep.record(messages, tools, ids, cont, sampled, lps, version, reply, finish)
    return ids, cont, sampled


def test_append_only_tool_call_round_trip_continues_the_row_with_the_sampled_ids(tok):
    ep = Episode(tok)
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}</tool_call>'
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'},
            }
        ],
    }
    ids1, cont1, s1 = _call(ep, tok, OPENING, text, reply)
    assert not cont1 and ids1 == prompt_ids(tok, OPENING, TOOLS)
    # the SDK sends the reply back re-serialised, then the tool's result
    back = json.loads(json.dumps(reply))
    back["tool_calls"][0]["function"]["arguments"] = '{"expression":"17*23"}'
    tool = {"role": "tool", "tool_call_id": "call_0", "content": "391"}
    ids2, cont2, s2 = _call(
        ep,
        tok,
        [*OPENING, back, tool],
        "<answer>391</answer>",
        {"role": "assistant", "content": "<answer>391</answer>"},
        version=1,
    )
    assert cont2 and len(ep.segments) == 1
    # exactly nanosky's own loop: prompt + sampled + observation ids (the rendering's difference)
    hist = [*OPENING, {"role": "assistant", "content": text}]
    expected_obs = observation_ids(tok, hist, [tool], TOOLS)
    assert ids2 == ids1 + s1 + expected_obs
    seg = ep.segments[0]
    assert seg.ids == ids1 + s1 + expected_obs + s2
    assert seg.loss_mask == [0] * len(ids1) + [1] * len(s1) + [0] * len(expected_obs) + [1] * len(s2)
    assert seg.logprobs[len(ids1) : len(ids1) + len(s1)] == [-0.5] * len(s1)
    assert seg.versions == [0, 1] and seg.turn_starts == [len(ids1), len(ids1) + len(s1) + len(expected_obs)]
    assert seg.prompt_len == len(ids1) and ep.calls == 2


@pytest.mark.parametrize(
    "edit",
    [
        "edited user message",
        "truncated history",
        "another system message",
        "different tools",
        "edited reply",
        "a system message added",
    ],
)
def test_anything_but_an_append_only_extension_starts_a_new_segment(tok, edit):
    ep = Episode(tok)
    reply = {"role": "assistant", "content": "Let me think."}
    ids1, _, s1 = _call(ep, tok, OPENING, "Let me think.", reply)
    user = {"role": "user", "content": "Go on."}
    messages, tools = [*OPENING, reply, user], TOOLS
    if edit == "edited user message":
        messages[1] = {"role": "user", "content": "What is 17 * 24?"}
    elif edit == "truncated history":
        messages = [OPENING[1], reply, user]
    elif edit == "another system message":
        messages[0] = {"role": "system", "content": "Be brief."}
    elif edit == "different tools":
        tools = []
    elif edit == "edited reply":
        messages[2] = {"role": "assistant", "content": "Let me think again."}
    else:
        messages = [*OPENING, reply, {"role": "system", "content": "Hurry."}]
    ids2, cont, s2 = _call(ep, tok, messages, "Done.", {"role": "assistant", "content": "Done."}, tools=tools)
    assert not cont and len(ep.segments) == 2
    assert ids2 == prompt_ids(tok, messages, tools)  # rendered afresh
    assert ep.segments[0].ids == ids1 + s1 and ep.segments[1].ids == ids2 + s2
    assert ep.segments[1].loss_mask == [0] * len(ids2) + [1] * len(s2)


def test_a_template_that_drops_earlier_reasoning_gives_segments_never_wrong_tokens(tok):
    tok = load_tokenizer(resolve_model_path("tiny-tool"))
    tok.chat_template = DROP_THINK
    ep = Episode(tok)
    first = "<think>\nMultiply.\n</think>\nIt is 391."
    reply = {"role": "assistant", "content": first}
    ids1, _, s1 = _call(ep, tok, OPENING, first, reply, tools=None)
    messages = [*OPENING, reply, {"role": "user", "content": "Sure?"}]
    ids2, cont, s2 = _call(ep, tok, messages, "Yes.", {"role": "assistant", "content": "Yes."}, tools=None)
    assert not cont and len(ep.segments) == 2
    # the second segment's context is what the template renders now: the earlier reasoning is gone
    assert ids2 == prompt_ids(tok, messages) and "Multiply" not in tok.decode(ids2)
    assert "Multiply" in tok.decode(ep.segments[0].ids)  # the first keeps the sampled ids, reasoning included
    # a user message after a reply without reasoning extends the rendering: that call continues
    messages3 = [*messages, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Thanks."}]
    _, cont3, _ = _call(ep, tok, messages3, "Bye.", {"role": "assistant", "content": "Bye."}, tools=None)
    assert cont3 and len(ep.segments) == 2


def test_a_reply_cut_at_the_length_limit_is_not_continued(tok):
    ep = Episode(tok)
    reply = {"role": "assistant", "content": "Let me"}
    _call(ep, tok, OPENING, "Let me", reply, finish="length")
    messages = [*OPENING, reply, {"role": "user", "content": "Go on."}]
    _, cont, _ = _call(ep, tok, messages, "Done.", {"role": "assistant", "content": "Done."})
    assert not cont and len(ep.segments) == 2


def test_normalise_compares_what_reaches_the_template():
    a = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1, "b": [2]}'}}],
    }
    b = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "y", "type": "function", "function": {"name": "f", "arguments": '{"b":[2],"a":1}'}}],
    }
    assert normalise(a) == normalise(b)
    b["tool_calls"][0]["function"]["arguments"] = '{"a": 2, "b": [2]}'
    assert normalise(a) != normalise(b)
    parts = {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}
    assert normalise(parts) == normalise({"role": "user", "content": "Hi!"})
