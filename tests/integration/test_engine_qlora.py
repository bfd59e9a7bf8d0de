"""QLoRA on this CPU, for real: bitsandbytes' 4-bit NF4 base under FSDP2 (1 rank in-process), its merged weight
stream, and that stream served by the real vLLM engine. The 2-rank run (train → sync → resume) is
tests/e2e/test_lora_ranks.py. (Named to run before test_families.py, whose engines' teardown ends the process's vLLM
parallel state, which the shared `engine` fixture needs.)"""

import copy

import pytest
import torch
from cpu import FP32

from nanosky.train.lora import (
    LoraConfig,
    iter_merged_params,
    load_lora_model,
    quant_state,
    trainable_parameters,
)
from nanosky.train.policy import token_logprobs

pytest.importorskip("bitsandbytes")  # `make test` installs it (the qlora extra)
CFG = LoraConfig(rank=4, alpha=8, qlora=True)
MODS = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "model.layers.3.self_attn.o_proj")


@pytest.fixture(scope="module")
def qlora(tiny_path, dist_info):
    model = load_lora_model(tiny_path, CFG, dist_info, precision=FP32)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=5e-2)
    for i in range(2):  # lora_B leaves zero: the merge really adds something
        ids = torch.randint(3, 500, (2, 12), generator=torch.Generator().manual_seed(i))
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        (-lp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def _expected(tiny_path, model) -> dict[str, torch.Tensor]:
    """The merged weights computed independently of nanosky: the checkpoint's weight quantized afresh with
    bitsandbytes (NF4, as transformers' loader does), dequantized in the compute dtype (fp32 here), plus
    alpha / rank · B @ A from the trained adapters."""
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
    sd = {k.removeprefix("base_model.model."): _full(v) for k, v in model.state_dict().items()}
    out = {}
    for mod in MODS:
        packed, state = bnb.functional.quantize_4bit(
            base[f"{mod}.weight"].to(torch.bfloat16), quant_type="nf4", quant_storage=torch.bfloat16
        )
        state = copy.copy(state)
        state.dtype = torch.float32
        w = bnb.functional.dequantize_4bit(packed, state)
        a, b = sd[f"{mod}.lora_A.default.weight"], sd[f"{mod}.lora_B.default.weight"]  # [r, in], [out, r]
        assert (b @ a).abs().max() > 1e-3  # the adapter really changes the weight
        out[f"{mod}.weight"] = w + (CFG.alpha / CFG.rank) * b @ a
    return out


def test_fsdp2_drops_the_parameters_quant_state_and_the_module_keeps_it(qlora):
    layer = qlora.base_model.model.model.layers[0].self_attn.q_proj.get_base_layer()
    from torch.distributed.tensor import DTensor

    assert isinstance(layer.weight, DTensor) and type(layer.weight).__name__ != "Params4bit"  # FSDP2's swap
    assert getattr(layer.weight, "quant_state", None) is None
    assert tuple(quant_state(layer).shape) == (256, 256)  # [out, in] of the dense weight


def test_merged_stream_is_the_dequantized_base_plus_the_adapters(qlora, tiny_path):
    merged = dict(iter_merged_params(qlora, torch.float32))
    want = _expected(tiny_path, qlora)
    for name, w in want.items():
        assert merged[name].dtype == torch.float32 and merged[name].shape == w.shape, name
        assert torch.equal(merged[name], w), (name, float((merged[name] - w).abs().max()))
    # every tensor of the base model, dense, and nothing else (no packed storage, no quant-state entries)
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged, strict=True)  # shapes match: every weight dense
    ids = torch.randint(3, 500, (3, 14), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        a, _ = token_logprobs(qlora, ids, torch.ones_like(ids))
        b, _ = token_logprobs(plain, ids, torch.ones_like(ids))
    assert (a - b).abs().max() < 1e-4  # the trainer's 4-bit forward computes with exactly these weights


def test_engine_serves_the_synced_qlora_policy(qlora, engine, tiny_path):
    """The engine's weights after a sync are the dequantized-and-merged trainer weights: its logprobs equal the
    trainer's, where before the sync (the dense checkpoint) they did not."""
    from transformers import AutoModelForCausalLM

    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    x = torch.tensor([ids])
    with torch.no_grad():
        want, _ = token_logprobs(qlora, x, torch.ones_like(x))
    v = engine.version
    before = (engine.prompt_logprobs(ids) - want[0].double()).abs().max()
    engine.load_weights(iter_merged_params(qlora, torch.float32), version=v + 1)
    try:
        after = (engine.prompt_logprobs(ids) - want[0].double()).abs().max()
    finally:  # the engine is shared by the module's other tests: the checkpoint goes back
        sd = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
        engine.load_weights(iter(sd.items()), version=v + 2)
    assert before > 1e-2, before  # 4-bit base + trained adapters: far from the dense checkpoint
    assert after < 1e-4, after
