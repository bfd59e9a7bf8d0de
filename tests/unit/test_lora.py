"""nanosky.train.lora on the bundled tiny model (FSDP2, 1 rank in-process; 2 ranks via torchrun in the last test)."""

import os

import pytest
import torch
from cpu import FP32

from nanosky.train.checkpoint_io import load_checkpoint, save_checkpoint
from nanosky.train.lora import (
    LoraConfig,
    adapters_off,
    apply_lora,
    check_platform,
    iter_merged_params,
    load_lora_model,
    load_reference,
    save_adapter,
    save_merged,
    trainable_parameters,
)
from nanosky.train.policy import load_model, token_logprobs

CFG = LoraConfig(rank=4, alpha=8)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (3, 14), generator=g)  # [B, L]
    att = torch.ones_like(ids)
    att[1, 10:] = 0  # one right-padded row
    return ids, att


def _train_steps(model, n: int = 2) -> None:
    """A few AdamW steps so that lora_B is no longer zero (a fresh adapter merges to the base exactly)."""
    opt = torch.optim.AdamW(trainable_parameters(model), lr=5e-2)
    for i in range(n):
        ids, att = _batch(i)
        lp, _ = token_logprobs(model, ids, att)
        (-lp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.fixture(scope="module")
def trained(tiny_path, dist_info):
    model = load_lora_model(tiny_path, CFG, dist_info, precision=FP32)
    _train_steps(model)
    return model


def _plain(tiny_path, state: dict | None = None):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    if state is not None:
        m.load_state_dict(state, strict=True)
    return m


def test_config_validation_and_platform():
    with pytest.raises(ValueError, match="lora.rank"):
        LoraConfig(rank=-1)
    with pytest.raises(ValueError, match="lora.alpha"):
        LoraConfig(rank=4, alpha=0)
    with pytest.raises(ValueError, match="lora.dropout"):
        LoraConfig(rank=4, dropout=1.0)
    with pytest.raises(ValueError, match="lora.qlora needs lora.rank"):
        LoraConfig(qlora=True)
    with pytest.raises(ValueError, match="lora.qlora needs CUDA or the CPU .*; not available on mps"):
        check_platform(LoraConfig(rank=8, qlora=True), "mps")
    check_platform(LoraConfig(rank=8, qlora=True), "cpu")  # bitsandbytes' NF4 runs here: test_engine_qlora.py
    import importlib.util

    find = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name == "bitsandbytes" else find(name, *a)
    try:  # without the package: the install command, at start-up
        with pytest.raises(ValueError, match=r"pip install -e '\.\[qlora\]'"):
            check_platform(LoraConfig(rank=8, qlora=True), "cuda")
    finally:
        importlib.util.find_spec = find
    check_platform(LoraConfig(rank=8), "cpu")  # plain LoRA runs anywhere


def test_only_adapters_trainable(tiny_path):
    base = _plain(tiny_path)
    n_layers = base.config.num_hidden_layers
    model = apply_lora(base, CFG)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(names) == 2 * len(CFG.target_modules) * n_layers
    assert all(".lora_A.default." in n or ".lora_B.default." in n for n in names)
    assert apply_lora(_plain(tiny_path), LoraConfig(rank=0)).__class__.__name__ == "Qwen2ForCausalLM"


def test_frozen_base_does_not_move(trained, tiny_path):
    base = _plain(tiny_path).state_dict()
    sd = {k: v.full_tensor() for k, v in trained.state_dict().items()}
    w = sd["base_model.model.model.layers.1.mlp.down_proj.base_layer.weight"]
    assert torch.equal(w, base["model.layers.1.mlp.down_proj.weight"])
    assert torch.equal(sd["base_model.model.model.norm.weight"], base["model.norm.weight"])
    assert sd["base_model.model.model.layers.1.mlp.down_proj.lora_B.default.weight"].abs().max() > 0


def test_merged_equals_manual(trained, tiny_path):
    merged = dict(iter_merged_params(trained))
    sd = {k: v.full_tensor() for k, v in trained.state_dict().items()}
    base = _plain(tiny_path).state_dict()
    for mod in ("model.layers.0.self_attn.q_proj", "model.layers.3.mlp.gate_proj"):
        a = sd[f"base_model.model.{mod}.lora_A.default.weight"]  # [r, in]
        b = sd[f"base_model.model.{mod}.lora_B.default.weight"]  # [out, r]
        want = base[f"{mod}.weight"] + (CFG.alpha / CFG.rank) * b @ a
        assert (b @ a).abs().max() > 1e-4  # the adapter really changes the weight
        torch.testing.assert_close(merged[f"{mod}.weight"], want, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        merged["model.layers.0.self_attn.q_proj.bias"], base["model.layers.0.self_attn.q_proj.bias"]
    )


def test_merged_weights_gathered_in_the_engines_bf16(trained):
    """A bf16 engine (CUDA) gets bf16 tensors gathered in bf16: the same merged weights, rounded once to bf16, with
    the names and order unchanged."""
    full = dict(iter_merged_params(trained))
    half = dict(iter_merged_params(trained, torch.bfloat16))
    assert list(half) == list(full)
    for name, t in half.items():
        assert t.dtype == torch.bfloat16, name
        # the base is rounded to bf16 before the (fp32) merge adds its small update: within one bf16 step of it
        torch.testing.assert_close(t.float(), full[name], rtol=2**-7, atol=1e-6)
    w = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(half[w].float(), full[w])  # it really is rounded


def test_merged_bf16_is_the_fp32_merge_rounded_once(tiny_path, dist_info):
    """--precision bf16's sync: each adapted weight is merged in fp32 (its base gathered in full precision) and rounded
    to bf16 once, so the stream equals the fp32 merge cast to bf16, bit for bit; a base rounded before the merge
    would round twice. The bundled base is stored in bf16 (rounding it is exact), so its weights get fp32 noise."""
    model = load_lora_model(tiny_path, CFG, dist_info, precision=FP32)
    _train_steps(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("base_layer.weight"):
                p.to_local().add_(torch.randn_like(p.to_local()) * 1e-3)  # no longer bf16-representable
    full = dict(iter_merged_params(model))
    half = dict(iter_merged_params(model, torch.bfloat16))
    for name, t in half.items():
        assert torch.equal(t, full[name].to(torch.bfloat16)), name


def test_merged_model_matches_lora_logprobs(trained, tiny_path):
    """What vLLM gets (the merged stream loaded into a plain HF model) scores tokens like the trained policy."""
    merged = dict(iter_merged_params(trained))
    plain = _plain(tiny_path)
    assert list(merged) == list(plain.state_dict())  # exactly the base model's names, in its order
    ids, att = _batch(7)
    with torch.no_grad():
        want, _ = token_logprobs(trained, ids, att)
        base_lp, _ = token_logprobs(plain, ids, att)
        plain.load_state_dict(merged, strict=True)
        got, _ = token_logprobs(plain, ids, att)
    m = att[:, 1:].bool()
    assert (base_lp - want)[m].abs().max() > 1e-3  # without the merge the logprobs differ: the test can fail
    assert (got - want)[m].abs().max() < 1e-5


def test_merge_leaves_training_model_untouched(trained):
    ids, att = _batch(3)
    with torch.no_grad():
        before = trained(input_ids=ids, attention_mask=att).logits
        list(iter_merged_params(trained))
        after = trained(input_ids=ids, attention_mask=att).logits
    assert torch.equal(before, after)
    assert any(".lora_A." in k for k in trained.state_dict())


def test_disable_adapter_gives_the_base_model(trained, tiny_path):
    """The reference policy of a LoRA run needs no second model: the sharded policy with adapters disabled."""
    ids, att = _batch(4)
    with torch.no_grad():
        want, _ = token_logprobs(_plain(tiny_path), ids, att)
        with trained.disable_adapter():
            got, _ = token_logprobs(trained, ids, att)
        policy, _ = token_logprobs(trained, ids, att)
    m = att[:, 1:].bool()
    assert (got - want)[m].abs().max() < 1e-5
    assert (policy - want)[m].abs().max() > 1e-3  # adapters are back on after the context


def test_plain_model_streams_its_own_state(tiny_path, dist_info):
    from nanosky.train.policy import iter_full_params

    model = load_model(tiny_path, dist_info, precision=FP32)
    a, b = list(iter_merged_params(model)), list(iter_full_params(model))
    assert [n for n, _ in a] == [n for n, _ in b]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))


def test_save_adapter_loads_with_peft(trained, tiny_path, tmp_path):
    from peft import PeftModel

    save_adapter(trained, str(tmp_path / "adapter"))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(tmp_path / "adapter"))
    loaded = PeftModel.from_pretrained(_plain(tiny_path), str(tmp_path / "adapter"))
    ids, att = _batch(5)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids, attention_mask=att).logits,
            trained(input_ids=ids, attention_mask=att).logits,
            rtol=1e-5,
            atol=1e-5,
        )


def test_save_merged_is_a_plain_hf_model(trained, tok, tmp_path):
    from transformers import AutoModelForCausalLM

    save_merged(trained, tok, str(tmp_path / "merged"))
    m = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    assert m.dtype == torch.float32
    ids, att = _batch(6)
    with torch.no_grad():
        torch.testing.assert_close(
            m(input_ids=ids, attention_mask=att).logits,
            trained(input_ids=ids, attention_mask=att).logits,
            rtol=1e-5,
            atol=1e-5,
        )


def test_checkpoint_holds_only_the_adapter(tiny_path, dist_info, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    model = load_lora_model(tiny_path, CFG, dist_info, precision=FP32)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=5e-2)
    _train_steps(model, 1)
    path = save_checkpoint(str(tmp_path), 1, model=model, optimizer=opt, state={"step": 1})
    keys = FileSystemReader(os.path.join(path, "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("policy/model")]
    assert model_keys and all(".lora_" in k for k in model_keys)

    model2 = load_lora_model(tiny_path, CFG, dist_info, precision=FP32)  # fresh adapters (lora_B = 0), same frozen base
    opt2 = torch.optim.AdamW(trainable_parameters(model2), lr=5e-2)
    load_checkpoint(path, model=model2, optimizer=opt2)
    a, b = dict(iter_merged_params(model)), dict(iter_merged_params(model2))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_reference_of_a_lora_run_is_the_policy_with_its_adapters_off(trained, tiny_path, dist_info):
    """KL's reference under LoRA: no second model; inside `adapters_off` the trained policy computes as the base
    checkpoint, and after the block as itself again."""
    ids, att = _batch(5)
    assert load_reference(tiny_path, CFG, dist_info, trained, precision=FP32) is trained
    with torch.no_grad():
        policy, _ = token_logprobs(trained, ids, att)
        base, _ = token_logprobs(_plain(tiny_path), ids, att)
        with adapters_off(load_reference(tiny_path, CFG, dist_info, trained, precision=FP32)) as ref:
            off, _ = token_logprobs(ref, ids, att)
        again, _ = token_logprobs(trained, ids, att)
    m = att[:, 1:].bool()
    assert (policy - base)[m].abs().max() > 1e-2  # the adapters trained away from the base
    assert (off - base)[m].abs().max() < 1e-5
    assert torch.equal(again, policy)


def test_the_stream_and_the_export_use_the_checkpoints_names(tmp_path, dist_info, tok):
    """transformers 5 stacks Mixtral's experts in memory (`mlp.experts.gate_up_proj`); the stream vLLM loads and the
    export carry what `save_pretrained` wrote: the same names and tensors as the checkpoint file."""
    from families import build
    from safetensors import safe_open

    path = build("mixtral", str(tmp_path))
    model = load_model(path, dist_info, precision=FP32)
    assert any("experts.gate_up_proj" in n for n in model.state_dict())  # stacked in memory
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        disk = {k: f.get_tensor(k) for k in f.keys()}
    assert any(".experts.0.w1.weight" in k for k in disk)
    stream = dict(iter_merged_params(model))
    assert set(stream) == set(disk)
    assert all(torch.equal(stream[k], disk[k]) for k in disk)
    save_merged(model, tok, str(tmp_path / "export"))
    with safe_open(os.path.join(tmp_path, "export", "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(disk)  # untied head: every tensor


def test_cohere2_trains_with_the_engines_window_and_exports_its_own(tmp_path, dist_info, tok):
    """vLLM's Command-R attention sees window + 1 positions: the trainer's config follows it, the export does not."""
    import json

    from families import build

    from nanosky.train.policy import engine_config

    path = build("cohere2", str(tmp_path))
    assert engine_config(path).sliding_window == 17  # the checkpoint says 16
    model = load_model(path, dist_info, precision=FP32)
    assert model.config.sliding_window == 17
    assert model.model.layers[0].self_attn.sliding_window == 17  # built from it, not patched after
    save_merged(model, tok, str(tmp_path / "export"))
    assert json.load(open(tmp_path / "export" / "config.json"))["sliding_window"] == 16
