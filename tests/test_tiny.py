"""The bundled-model builder: deterministic from its seed, HF-loadable, with the chat template."""

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

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
