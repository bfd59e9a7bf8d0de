"""Tiny random-weight models of real architectures, built from a transformers config and saved locally (no download):
hidden 128, 2 layers, GQA where the family has it, the bundled tokenizer and chat template.

    path = build("gemma2", tmp_dir)          # a folder vLLM and transformers both load
    FAMILIES                                 # every family the matrix test covers
"""

from __future__ import annotations

import os
import shutil

import torch

from nanosky.bundled import resolve_model_path

COMMON = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
# family -> (transformers config class, model class, config overrides)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                   "decoder_sparse_step": 1, "norm_topk_prob": True}),
    # a 16-token window: the test's sequences are longer, so a packing that ignored it would show
    "mistral_swa": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"head_dim": 32, "sliding_window": 16, "query_pre_attn_scalar": 32, "tie_word_embeddings": True}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {"head_dim": 32, "sliding_window": 16, "query_pre_attn_scalar": 32, "tie_word_embeddings": True,
                "layer_types": ["sliding_attention", "full_attention"]}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {"sliding_window": None}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
    # transformers 5 stacks its experts in memory; the checkpoint and vLLM name them one by one
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "mixtral_swa": ("MixtralConfig", "MixtralForCausalLM",
                    {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16}),
    # vLLM's Command-R attention sees sliding_window + 1 positions (policy.ENGINE_WINDOW_OFFSET)
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM",
                {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                   "shared_expert_intermediate_size": 128, "decoder_sparse_step": 1}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {"head_dim": 32}),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {"head_dim": 32}),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM",
                {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 {"head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                  "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {}),
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM",
               {"head_dim": 32, "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                {"embedding_multiplier": 12.0, "attention_multiplier": 0.125, "residual_multiplier": 0.5,
                 "logits_scaling": 4.0}),
}  # fmt: skip
# Families nanosky refuses on the CPU at start-up, by name (`nanosky.preflight.check_architecture`): family ->
# (config class, model class, overrides, what the refusal says, the README table's reason). Exact on the CPU is impossible for these with
# vLLM 0.32; on CUDA the build probe decides.
REFUSED = {
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {}, "xIELU", "xIELU's alphas in bf16 in vLLM"),
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            "kv_lora_rank": 256,
            "q_lora_rank": 64,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 32,
            "v_head_dim": 32,
            "num_key_value_heads": 4,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "moe_intermediate_size": 64,
            "n_shared_experts": 1,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
        },
        "its multi-head latent attention",
        "MLA parts from transformers' after position 0",
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            "head_dim": 32,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        "takes no weight sync",
        "its engine takes no weight sync",
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {
            "head_dim": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 128,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "full_attention_interval": 2,
        },
        "Gated DeltaNet .* only in bf16",
        "in fp32: vLLM runs Gated DeltaNet in bf16 only",
    ),
    "qwen3_5": (
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        {
            "head_dim": 32,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "full_attention_interval": 2,
        },
        "Gated DeltaNet .* only in bf16",
        "in fp32: vLLM runs Gated DeltaNet in bf16 only",
    ),
}
TRANSFORMERS_BACKEND = {"olmo2", "starcoder2", "smollm3"}
"""Families vLLM 0.32 serves through its Transformers backend (which rewrites transformers' classes in place)."""


def build(family: str, out_dir: str, seed: int = 0, **overrides) -> str:
    """Save a random-weight `family` model with the bundled tokenizer into out_dir/family; returns the folder."""
    import transformers

    cfg_name, model_name, extra = (FAMILIES | REFUSED)[family][:3]
    tok_dir = resolve_model_path("tiny")
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    cfg = getattr(transformers, cfg_name)(
        **COMMON | extra | overrides,
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg)
    with torch.no_grad():  # larger than the default init: logprobs far from uniform, so a wrong one shows
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.1)
    out = os.path.join(out_dir, family)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    tmpl = os.path.join(tok_dir, "chat_template.jinja")
    if os.path.exists(tmpl):
        shutil.copy(tmpl, out)
    return out


def table(out_dir: str) -> str:
    """The README's supported-architectures table, from the families' configs as nanosky loads them: the attention
    the trainer uses and how packing masks each layer kind (`python tests/families.py` prints it)."""
    import transformers

    from nanosky.train import packing
    from nanosky.train.policy import attn_implementation

    groups: dict[tuple, list[str]] = {}  # the other columns -> the families that share them, in FAMILIES order
    for family in FAMILIES:
        path = build(family, out_dir)
        cfg = transformers.AutoConfig.from_pretrained(path)
        kinds, window = packing.attention_kinds(cfg)
        layers = (
            "full"
            if set(kinds) == {packing.FULL}
            else ("sliding" if set(kinds) == {packing.SLIDING} else "mixed full / sliding")
        )
        mask = "trie mask" + (", window per sliding layer" if window else "")
        mask += ", additive (eager)" if attn_implementation(path) == "eager" else ""
        backend = "Transformers backend" if family in TRANSFORMERS_BACKEND else "native"
        name = FAMILIES[family][1].removesuffix("ForCausalLM") + (" (window)" if family == "mixtral_swa" else "")
        groups.setdefault((attn_implementation(path), layers, mask, backend, "exact"), []).append(name)
    for _, model, _, _, reason in REFUSED.values():
        groups.setdefault(("", "", "", "native", f"refused at start-up ({reason})"), []).append(
            model.removesuffix("ForCausalLM")
        )
    rows = [
        "| families (…ForCausalLM, tested as) | trainer attention | layers | prefix packing | vLLM | on the CPU |",
        "|---|---|---|---|---|---|",
    ]
    rows += [f"| {', '.join(names)} | {' | '.join(cols)} |" for cols, names in groups.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    import tempfile

    print(table(tempfile.mkdtemp()))
