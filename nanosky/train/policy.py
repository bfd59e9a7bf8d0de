"""The trainable policy: an HF causal LM sharded with FSDP2 (`fully_shard` per decoder layer + root).

Also the frozen reference model and the logprob / entropy computation the losses need, the full-tensor stream
used for weight sync, and HF-format export (`save_pretrained` + tokenizer, loadable by vLLM and transformers).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from nanosky.dist import DistInfo


def private_classes(model: torch.nn.Module) -> torch.nn.Module:
    """Give the model's inner transformers modules classes of their own, which vLLM never sees.

    vLLM serves OLMo 2, Phi, GPT-NeoX, Starcoder2, ... through its Transformers backend, which rewrites transformers'
    decoder class in place when the engine starts (new bases, `__init__`, `__call__`): a trainer model of that class
    then breaks at its next forward ("no attribute 'do_not_compile'"). Each inner `PreTrainedModel` (the decoder
    under a causal LM, the critic's backbone) becomes an instance of a same-named copy of its class, with the same
    methods; call this before the engine is built. The root keeps its class (FSDP subclasses it)."""
    from transformers import PreTrainedModel

    for m in list(model.modules())[1:]:
        if isinstance(m, PreTrainedModel) and not getattr(type(m), "_nanosky_private", False):
            cls = type(m)
            ns = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
            m.__class__ = type(cls.__name__, cls.__bases__, ns | {"_nanosky_private": True})
    return model


def attn_implementation(path: str) -> str:
    """SDPA, except where transformers' SDPA computes something other than the model: its SDPA path drops attention
    logit soft-capping (Gemma 2; measured on a tiny Gemma 2: 0.014 max |Δlogp| against eager), which vLLM applies.
    Those models train with eager attention (`packing` then passes an additive mask)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    return "eager" if getattr(cfg, "attn_logit_softcapping", None) else "sdpa"


def load_model(path: str, info: DistInfo, trainable: bool = True, activation_checkpointing: bool = False):
    from transformers import AutoModelForCausalLM

    # fp32 master weights everywhere; on GPU the FSDP mixed-precision policy computes in bf16.
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=attn_implementation(path)
    )
    model.config.use_cache = False
    if not trainable:
        model.requires_grad_(False)
    elif activation_checkpointing:
        checkpoint_activations(model)
    return shard_model(model, info)


def checkpoint_activations(model) -> None:
    """`--optim.activation-checkpointing`: each decoder layer is recomputed in backward (torch's non-reentrant
    checkpoint, through transformers' own layers: parameter names do not change, and under FSDP2 the recompute
    all-gathers its layer again). Before sharding."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # transformers checkpoints only in training mode (these models have no dropout)


def decoder_layers(model) -> torch.nn.ModuleList:
    """The transformer blocks of an HF model, found by name so one function serves the causal LM (`model.layers`),
    the critic's backbone, and a peft-wrapped LoRA model (`base_model.model.model.layers`)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in ("layers", "h"):
            return module
    raise ValueError(f"no decoder layer list (`layers` / `h`) found in {type(model).__name__}")


def shard_model(model, info: DistInfo, reshard_after_forward: bool | None = None):
    """FSDP2 per decoder layer + root: the one wrapping of the policy, the reference, the critic and LoRA models
    (frozen and trainable parameters share the per-layer groups). Resharding after forward (ZeRO-3) saves memory on
    big models; the default keeps small models (< 1B params) gathered between forward and backward (ZeRO-2-like),
    which halves the all-gathers per micro-batch."""
    private_classes(model)  # before any engine starts: immune to vLLM's in-place class rewrite
    mesh = torch.distributed.device_mesh.init_device_mesh(info.device.type, (info.world,))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if info.is_cuda else None
    )
    if reshard_after_forward is None:
        reshard_after_forward = sum(p.numel() for p in model.parameters()) > 1e9
    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward} | ({"mp_policy": mp} if mp else {})
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model.to(info.device) if info.is_cuda else model


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    temperature: float = 1.0,
    allowed: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(ids[:, t] | ids[:, <t]) for t = 1..L-1, aligned with `loss_mask[:, 1:]`. `allowed` (positions [N, 2],
    bitmasks [N, W]): constrained positions, scored under their masks (`nanosky.train.constrain`).

    input_ids, attention_mask: [B, L] (right-padded). Returns logprobs [B, L-1] and entropy [B, L-1] (no grad).
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()  # [B, L-1, V]
    if temperature != 1.0:
        logits = logits / temperature  # sampling temperature: score what the engine actually sampled from
    logp = torch.log_softmax(logits, dim=-1)  # [B, L-1, V]
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp.exp() * logp).sum(-1)  # [B, L-1]
    if allowed is not None:
        from nanosky.train import constrain

        b, t = allowed[0].unbind(-1)
        lp, ent = constrain.apply(logits[b, t], input_ids[b, t + 1], allowed, (b, t), lp, ent, entropy_grad)
    return lp, ent


def iter_full_params(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) one parameter at a time: each DTensor shard is all-gathered (a collective: every rank
    must consume the iterator in the same order)."""
    for name, t in model.state_dict().items():
        if isinstance(t, DTensor):
            t = t.full_tensor()
        yield name, t.detach()


def save_hf(model, tokenizer, out_dir: str, info: DistInfo) -> None:
    """HF checkpoint (safetensors + config + tokenizer). Collective; rank 0 writes."""
    state = {n: t.cpu() for n, t in iter_full_params(model)}
    if info.is_main:
        os.makedirs(out_dir, exist_ok=True)
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        model.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
    torch.distributed.barrier()
