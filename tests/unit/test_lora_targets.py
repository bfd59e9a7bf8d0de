"""LoRA targets per architecture: the default adapts every linear layer of the decoder blocks, whatever the family
calls them (Phi-3's fused qkv_proj / gate_up_proj); an explicit list that matches nothing is refused, and one that
leaves linear layers out says which."""

import logging

import pytest
import torch
from families import build

from nanosky.train.lora import LoraConfig, apply_lora


def _adapted(model) -> set[str]:
    return {n.split(".lora_A")[0].split(".")[-1] for n, _ in model.named_parameters() if ".lora_A." in n}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("fam"))
    return {f: build(f, d) for f in ("phi3", "llama")}


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_default_targets_every_block_linear_of_fused_families(models):
    phi3 = apply_lora(_load(models["phi3"]), LoraConfig(rank=4))
    assert _adapted(phi3) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    llama = apply_lora(_load(models["llama"]), LoraConfig(rank=4))
    assert _adapted(llama) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not any("lm_head" in n or "embed" in n for n, p in llama.named_parameters() if p.requires_grad)


def test_explicit_targets_that_match_nothing_are_refused(models):
    with pytest.raises(ValueError, match=r"\['q_proj'\] match no linear layer.*qkv_proj"):
        apply_lora(_load(models["phi3"]), LoraConfig(rank=4, target_modules=("q_proj", "o_proj")))


def test_explicit_targets_that_leave_layers_out_warn(models, caplog):
    with caplog.at_level(logging.WARNING, logger="nanosky"):
        m = apply_lora(_load(models["llama"]), LoraConfig(rank=4, target_modules=("q_proj", "v_proj")))
    assert _adapted(m) == {"q_proj", "v_proj"}
    assert "leaves these linear layers without adapters" in caplog.text and "down_proj" in caplog.text
