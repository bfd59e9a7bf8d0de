"""The bundled tokenizer and chat template, and token-in-token-out conversation building."""

import envs
from nanosky.rollout.chat import encode_conversation, observation_ids, prompt_ids, render
from nanosky.tiny.tokenizer import TAG_TOKENS, build_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {}}},
        },
    }
]


def test_template_renders_every_role_and_tools(tok):
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
        {"role": "tool", "content": "T"},
    ]
    text = render(tok, msgs, TOOLS, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nS\n# Tools\n- calculator(expression): Evaluate arithmetic.\n"
        'Call: <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n'
        "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>T</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_tags_are_single_tokens_digits_split_and_roundtrip(tok):
    for tag in TAG_TOKENS:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag
    ids = tok.encode("<answer>1234</answer>", add_special_tokens=False)
    assert len(ids) == 6  # tag, 4 digits, tag
    s = 'naïve ünïcödé 😀 <tool_call>{"a": 1}</tool_call>'
    assert tok.decode(tok.encode(s, add_special_tokens=False)) == s
    assert tok.eos_token == "<|im_end|>"


def test_build_tokenizer_is_deterministic():
    texts = [f"What is {a} + {b}? <answer>{a + b}</answer>" for a in range(50) for b in range(20)]
    a, b = build_tokenizer(texts, 300), build_tokenizer(texts, 300)
    assert a.get_vocab() == b.get_vocab()


def test_encode_conversation_masks_only_assistant_turns(tok):
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "<answer>4</answer>"},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "yes"},
    ]
    ids, mask = encode_conversation(tok, msgs)
    assert len(ids) == len(mask)
    assert tok.decode(ids) == render(tok, msgs)
    policy = [i for i, m in zip(ids, mask) if m]
    assert tok.decode(policy) == "<answer>4</answer><|im_end|>yes<|im_end|>"


def test_incremental_ids_equal_full_rendering(tok):
    """What the agent loop builds (prompt + generated ids + observation ids) equals the template's rendering."""
    env = envs.make("math", split="test", seed=3)
    history = env.reset()
    ids = prompt_ids(tok, history, TOOLS)
    for turn in [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>',
        "<answer>4</answer>",
    ]:
        ids += tok.encode(turn, add_special_tokens=False) + [tok.eos_token_id]  # what the engine returns
        history.append({"role": "assistant", "content": turn})
        obs = [{"role": "tool", "content": "4"}]
        ids += observation_ids(tok, history, obs, TOOLS)
        history += obs
    expected = tok.encode(render(tok, history, TOOLS, add_generation_prompt=True), add_special_tokens=False)
    assert ids == expected
