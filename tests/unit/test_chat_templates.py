"""Chat templates of real families, checked at start-up: a template must render system / user / assistant turns,
and in concatenated mode append each turn without rewriting earlier ones (Qwen3-style templates drop the reasoning
of earlier turns). A base model without a template gets a clear error or `--model.chat-template FILE` (ChatML)."""

import json
import os

import pytest
from families import build

from nanosky import preflight
from nanosky.bundled import resolve_model_path
from nanosky.cli import parse_args
from nanosky.rollout import chat

CHATML_BODY = (
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# Qwen3's behaviour: an assistant turn before the last user message loses its <think> block
DROPS_THINK = (
    "{%- set ns = namespace(last=0) -%}{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
    "{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}{%- for m in messages -%}{%- set c = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
NO_SYSTEM = (
    "{%- if messages[0]['role'] == 'system' -%}{{- raise_exception('System role not supported') -}}{%- endif -%}"
)


@pytest.fixture
def tok():
    return chat.load_tokenizer(resolve_model_path("tiny"))


def test_bundled_and_chatml_templates_append_only(tok):
    assert chat.append_only(tok, chat.PROBE)
    chat.check_template(tok, "concat")
    chatml = chat.load_tokenizer(resolve_model_path("tiny"), str(chat.CHATML))
    assert chatml.chat_template != tok.chat_template and chat.append_only(chatml, chat.PROBE)
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"properties": {}}}}]
    assert '"name": "f"' in chat.render(chatml, chat.PROBE, tools)  # ChatML shows the tools in the system turn


def test_a_template_that_drops_earlier_reasoning_is_refused_in_concat_mode(tok):
    tok.chat_template = DROPS_THINK
    assert not chat.append_only(tok, chat.PROBE)
    with pytest.raises(chat.TemplateError, match="rewrites earlier turns.*--rollout.mode stepwise"):
        chat.check_template(tok, "concat")
    chat.check_template(tok, "stepwise")  # each turn re-rendered by the template: fine
    tok.chat_template = CHATML_BODY
    chat.check_template(tok, "concat")


def test_no_template_or_no_system_role_is_a_clear_error(tok):
    tok.chat_template = NO_SYSTEM + CHATML_BODY
    with pytest.raises(chat.TemplateError, match="cannot render.*System role not supported"):
        chat.check_template(tok, "stepwise")
    tok.chat_template = None
    with pytest.raises(chat.TemplateError, match="no chat template: pass --model.chat-template FILE"):
        chat.check_template(tok, "concat")


def test_preflight_names_the_flag_and_takes_a_template_file(tmp_path):
    model = build("llama", str(tmp_path))  # a base model: no template
    os.remove(os.path.join(model, "chat_template.jinja"))
    cfg_file = os.path.join(model, "tokenizer_config.json")
    tc = json.load(open(cfg_file))
    tc.pop("chat_template", None)
    json.dump(tc, open(cfg_file, "w"))
    drops = tmp_path / "drops.jinja"
    drops.write_text(DROPS_THINK)

    def cfg(*flags):
        run = ["--log.run-dir", str(tmp_path / "run"), "--model.path", model]
        return parse_args(["--preset", "smoke", *run, *flags], console=False)

    with pytest.raises(preflight.UsageError, match=f"--model.path {model}: the model has no chat template"):
        preflight.check(cfg())
    preflight.check(cfg("--model.chat-template", str(chat.CHATML)))
    with pytest.raises(preflight.UsageError, match="rewrites earlier turns"):
        preflight.check(cfg("--model.chat-template", str(drops)))
    preflight.check(cfg("--model.chat-template", str(drops), "--rollout.mode", "stepwise"))
    with pytest.raises(preflight.UsageError, match="--model.chat-template /nope.jinja: no such file"):
        preflight.check(cfg("--model.chat-template", "/nope.jinja"))


def test_a_template_without_a_tools_section_gets_the_tools_in_the_system_turn_token_exact(tok):
    """SmolLM2's template (as CHATML_BODY) has no tools section: the tools' schemas and the call format go into the
    system turn (`chat.TOOLS_FALLBACK`), and the agent loop's concatenated ids (prompt, sampled turn and eos,
    observation) are the template's own rendering of the whole conversation, as with a template that lists tools."""
    import envs

    env = envs.make("tool_use", "test", 0)
    tools = [t.schema for t in env.tools]
    convo = [
        *env.reset(),
        {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}'},
        {"role": "tool", "name": "calculator", "content": "2"},
        {"role": "assistant", "content": "<answer>2</answer>"},
    ]
    with_section = chat.render(tok, convo, tools)
    assert chat.renders_tools(tok) and "You may call these functions" not in with_section  # the template lists them
    tok.chat_template = CHATML_BODY
    assert not chat.renders_tools(tok)
    text = chat.render(tok, convo[:2], tools, add_generation_prompt=True)
    assert text == chat.render(tok, chat.with_tools(convo[:2], tools), None, add_generation_prompt=True)
    assert all(t["function"]["name"] in text for t in tools) and "<tool_call>" in text
    assert text.index("You may call these functions") > text.index(
        convo[0]["content"]
    )  # after the env's own system message
    ids = chat.prompt_ids(tok, convo[:2], tools)
    ids += chat.encode(tok, convo[2]["content"]) + [tok.eos_token_id]
    ids += chat.observation_ids(tok, convo[:3], convo[3:4], tools)
    ids += chat.encode(tok, convo[4]["content"]) + [tok.eos_token_id]
    full = chat.encode(tok, chat.render(tok, convo, tools))
    assert full[: len(ids)] == ids  # token-in/token-out: what the trainer trains on is what the template renders
    no_system = chat.render(tok, convo[1:2], tools)
    assert no_system.startswith("<|im_start|>system\n# Tools")  # a conversation without one gets a system turn
