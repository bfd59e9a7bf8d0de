"""The bundled-model builder: deterministic from its seed, HF-loadable, with the chat template."""

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from nanosky.tiny import TinyConfig, build


def _small(out) -> TinyConfig:
    return TinyConfig(
        out=str(out),
        n_math=300,
        n_tool=4,
        steps=3,
        n_math2=100,
        n_tool2=0,
        steps2=2,
        hidden_size=32,
        intermediate_size=64,
        layers=1,
        heads=2,
        kv_heads=1,
        vocab_size=300,
    )


def test_build_is_deterministic_and_loadable(tmp_path):
    a, b = build(_small(tmp_path / "a")), build(_small(tmp_path / "b"))
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    tok = AutoTokenizer.from_pretrained(a)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    m = AutoModelForCausalLM.from_pretrained(a)
    assert m.config.model_type == "qwen2" and m.config.vocab_size == len(tok)


def test_bundled_model_is_small_and_warm_started(tiny_path):
    m = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert sum(p.numel() for p in m.parameters()) < 5e6
    tok = AutoTokenizer.from_pretrained(tiny_path)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        nxt = m(torch.tensor([ids])).logits[0, -1].softmax(-1)
    # a warm-started model answers in one of its trained styles, not with noise
    starts = [tok.convert_tokens_to_ids("<answer>"), tok.encode("The", add_special_tokens=False)[0]]
    assert float(nxt[starts].sum()) > 0.3


def test_agent_variant_continues_from_a_model_with_a_longer_context(tmp_path):
    import random

    from nanosky.tiny import _length_bucketed_batches
    from nanosky.tiny.data import _copy_examples

    base = build(_small(tmp_path / "base"))
    cfg = TinyConfig(
        out=str(tmp_path / "agent"),
        init=str(base),
        n_math=4,
        n_tool=4,
        n_agent=2,
        n_copy=4,
        steps=2,
        steps2=0,
    )
    cfg.max_len, cfg.batch_tokens = 1024, 4096
    agent = build(cfg)
    tok_a, tok_b = AutoTokenizer.from_pretrained(agent), AutoTokenizer.from_pretrained(base)
    assert tok_a.get_vocab() == tok_b.get_vocab()  # keeps the base tokenizer
    assert AutoModelForCausalLM.from_pretrained(agent).config.max_position_embeddings == 1024
    assert tok_a.model_max_length == 1024  # no "indexing errors" warning on prompts the model takes
    for shipped in ("tiny-agent", "tiny-swe", "tiny-tool", "tiny"):
        d = Path(__file__).parents[2] / "nanosky" / "assets" / shipped
        ctx = AutoConfig.from_pretrained(d).max_position_embeddings
        assert AutoTokenizer.from_pretrained(d).model_max_length == ctx, shipped
    # copy drills: the reply is the prompt
    for conv, _ in _copy_examples(20, 0):
        assert conv[-1]["content"] == conv[-2]["content"] and conv[-1]["content"]
    # a token cap shrinks batches of long examples, and every example is in exactly one batch per epoch
    data = [([0] * n, [1] * n) for n in [50] * 40 + [1000] * 10]
    batches = _length_bucketed_batches(data, 32, random.Random(0), batch_tokens=4096)
    assert sorted(i for b in batches for i in b) == list(range(50))
    assert all(len(b) * max(len(data[i][0]) for i in b) <= 4096 for b in batches)
    assert max(len(b) for b in batches) == 32


def test_step_wise_examples_train_only_the_current_action(tok):
    """The agent variant's data: each turn of a noisy expert's episode, prompted as `--rollout.mode stepwise`
    prompts it (actions shown), with the loss on that turn's action only."""
    from nanosky.agent.window import window
    from nanosky.tiny import _encode
    from nanosky.tiny.data import _action_copy_texts, _step_examples

    examples = _step_examples(4, 0, noise=0.25, k=2)
    assert examples == _step_examples(4, 0, noise=0.25, k=2)  # deterministic from the seed
    for messages, schemas, last in examples:
        assert last == "last" and schemas is None and messages[-1]["role"] == "assistant"
        assert window(messages[:-1], 2) == messages[:-1]  # already a window of two turns
        assert "admissible actions" in messages[-2]["content"]
    messages = next(m for m, *_ in examples if sum(x["role"] == "assistant" for x in m) == 3)
    ids, mask = _encode(tok, (messages, None, "last"))
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == messages[-1]["content"] + tok.eos_token  # not the history's actions
    assert sum(mask) < sum(_encode(tok, (messages, None))[1])
    texts = _action_copy_texts(6, 0)
    assert len(texts) == 6 and all(t.strip() for t in texts)


def test_from_scratch_with_a_shared_tokenizer(tmp_path):
    """`tokenizer=<dir>` trains new weights (its own shape) on the given vocabulary instead of a new BPE."""
    base = build(_small(tmp_path / "base"))
    cfg = _small(tmp_path / "tool")
    cfg.tokenizer, cfg.heads, cfg.kv_heads, cfg.n_math, cfg.n_copy, cfg.steps2 = str(base), 4, 4, 0, 8, 0
    tool = build(cfg)
    assert AutoTokenizer.from_pretrained(tool).get_vocab() == AutoTokenizer.from_pretrained(base).get_vocab()
    m = AutoModelForCausalLM.from_pretrained(tool)
    assert m.config.num_attention_heads == 4 and m.config.num_key_value_heads == 4
    k = "model.layers.0.self_attn.k_proj.weight"  # base: 1 kv head of 16 dims; here 4 kv heads of 8
    assert load_file(str(tool / "model.safetensors"))[k].shape == (32, 32)
    assert load_file(str(base / "model.safetensors"))[k].shape == (16, 32)


def test_tool_variant_copies_digit_strings():
    """The bundled tool model's reason to exist: it copies (the question's numbers into a call, a tool's output
    into the answer). Greedy copies of 4–8-digit strings, which the base model gets wrong."""
    import random

    from nanosky.bundled import resolve_model_path
    from nanosky.tiny.drills import COPY_PROMPT

    def exact(path: str) -> int:
        tok = AutoTokenizer.from_pretrained(path)
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        rng, ok = random.Random(11), 0
        for _ in range(20):
            text = "".join(rng.choice("0123456789") for _ in range(rng.randint(4, 8)))
            msgs = [{"role": "system", "content": COPY_PROMPT}, {"role": "user", "content": text}]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
            out = m.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
            ok += tok.decode(out[0, len(ids) :], skip_special_tokens=True).strip() == text
        return ok

    assert exact(resolve_model_path("tiny-tool")) >= 10
    assert exact(resolve_model_path("tiny")) <= 2


def test_swe_variant_data_are_real_expert_episodes_and_editor_copy_drills(tok):
    """The swe variant's data: whole expert episodes of `envs.make("swe")` (tools run for real; every assistant turn
    trained), and drills that copy numbered view lines into the JSON string an old_str is."""
    import json

    from nanosky.tiny import _encode
    from nanosky.tiny.swe_data import _code_copy_examples, _swe_examples

    ((messages, schemas),) = _swe_examples(1, 0)
    assert [s["function"]["name"] for s in schemas] == ["bash", "str_replace_editor", "submit"]
    actions = [m["content"] for m in messages if m["role"] == "assistant"]
    assert json.loads(actions[-1].removeprefix("<tool_call>").removesuffix("</tool_call>"))["name"] == "submit"
    assert any('"command": "str_replace"' in a for a in actions)
    assert any("passed" in m["content"] for m in messages if m["role"] == "tool")  # the test run really ran
    ids, mask = _encode(tok, (messages, schemas))
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "".join(a + tok.eos_token for a in actions)
    for drill, _ in _code_copy_examples(5, 0):
        shown, answer = drill[1]["content"], drill[2]["content"]
        assert json.loads(answer) == "\n".join(line.split("\t", 1)[1] for line in shown.split("\n"))


def test_swe_fix_turns_are_the_envs_own_first_turns():
    """The cheap first-turn examples (no sandbox) are exactly what the real env shows the expert: the same issue,
    grep line, file view and str_replace call."""
    import envs
    from envs.base import expert_episode
    from nanosky.tiny.swe_data import _swe_fix_turns

    examples = _swe_fix_turns(3, 5)
    for i, (messages, schemas) in enumerate(examples):
        env = envs.make("swe", "train", 5 * 1_000_003 + 600_000 + i, level=(1, 1, 2)[i])
        env.grade = False
        assert expert_episode(env)[: len(messages)] == messages
        assert messages[-1]["role"] == "assistant" and '"command": "str_replace"' in messages[-1]["content"]
        assert schemas == [t.schema for t in env.tools]
