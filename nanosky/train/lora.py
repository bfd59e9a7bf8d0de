"""LoRA / QLoRA for the policy through peft, FSDP2-sharded, with merged-weight streaming into vLLM.

    python run.py --lora.rank 16 --lora.alpha 32          # LoRA on every attention + MLP projection
    python run.py --lora.rank 16 --lora.qlora             # 4-bit NF4 base (bitsandbytes; CUDA, or slowly the CPU)

Build order matters: load the HF model → `apply_lora` (peft injects adapters, freezes the base) → `shard_model`
(FSDP2 per decoder layer + root; frozen and trainable parameters share the per-layer groups). `load_lora_model` does
all three. The inference engine never sees adapters: `iter_merged_params` streams the base model's HF names with
W + scaling·B@A computed on the fly from gathered full tensors, so vLLM serves exactly the policy being trained.

QLoRA under FSDP2: a 4-bit base weight is a bitsandbytes `Params4bit` (packed NF4 codes stored as bf16, [out·in/4, 1]),
whose dequantization state (`quant_state`: absmax, code book, shape) rides on the parameter. FSDP2 replaces every
parameter with a plain `nn.Parameter(DTensor)` sharded on dim 0, which drops that state; bitsandbytes keeps a copy on
the module (`Linear4bit.quant_state`, which its forward restores from). The merge reads that copy and dequantizes
the gathered packed tensor: exactly the weight the forward computes with.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import logging
import os
import re
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from nanosky.config.model import ALL_LINEAR, LoraConfig
from nanosky.dist import DistInfo
from nanosky.precision import Precision
from nanosky.train.policy import (
    attn_implementation,
    checkpoint_activations,
    checkpoint_config,
    checkpoint_names,
    decoder_layers,
    engine_config,
    gathered,
    hf_loader,
    load_model,
    load_sharded,
    shard_model,
)
from nanosky.train.unwrap import base_model  # noqa: F401 - lora.base_model, as its callers name it

_ADAPTER = "default"  # peft's name for the single adapter we train
_PEFT_PREFIX = "base_model.model."  # PeftModel state_dict keys = this + the base model's keys
_LORA_KEY = re.compile(r"^(.*)\.(lora_A|lora_B)\.([^.]+)\.weight$")
_BASE_KEY = re.compile(r"^(.*)\.base_layer\.(.+)$")
log = logging.getLogger("nanosky")


QLORA_DEVICES = ("cuda", "cpu")
"""Where bitsandbytes 0.50 runs 4-bit NF4 (the CPU path is slow: for tests and small models)."""


def check_platform(cfg: LoraConfig, device_type: str) -> None:
    """Fail at start-up, not at the first forward, when QLoRA cannot run here."""
    if not cfg.qlora:
        return
    if device_type not in QLORA_DEVICES:
        raise ValueError(f"lora.qlora needs CUDA or the CPU (bitsandbytes' NF4); not available on {device_type}")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(
            "lora.qlora needs the bitsandbytes package, which is not installed (pip install -e '.[qlora]')"
        )


# ---- build ---------------------------------------------------------------------------------------------------
def block_linears(model) -> dict[str, list[str]]:
    """The linear layers inside the decoder blocks, by leaf name -> their full names (the output head and the
    embeddings are never adapted)."""
    layers = decoder_layers(model)
    out: dict[str, list[str]] = {}
    for i, layer in enumerate(layers):
        for name, m in layer.named_modules():
            if isinstance(m, torch.nn.Linear) and name:
                out.setdefault(name.split(".")[-1], []).append(f"{i}.{name}")
    return out


def resolve_targets(model, cfg: LoraConfig) -> list[str]:
    """The leaf names to adapt on this architecture: with the default, every linear layer of the decoder blocks;
    otherwise `cfg.target_modules`, refused if one matches nothing, with a warning for the linear layers left out."""
    linears = block_linears(model)
    if tuple(cfg.target_modules) == ALL_LINEAR:
        return sorted(linears)
    unknown = [t for t in cfg.target_modules if t not in linears]
    if unknown:
        raise ValueError(
            f"lora.target_modules: {unknown} match no linear layer of {type(model).__name__}'s decoder blocks; "
            f"its linear layers are {sorted(linears)}"
        )
    left = sorted(set(linears) - set(cfg.target_modules))
    if left:
        log.warning("lora.target_modules leaves these linear layers without adapters: %s", left)
    return list(cfg.target_modules)


def apply_lora(model, cfg: LoraConfig):
    """Wrap an unsharded HF causal LM with peft adapters; only adapter parameters stay trainable. rank 0 = no-op."""
    if not cfg.enabled:
        return model
    import peft

    if cfg.qlora:  # fp32 norms and input grads for the 4-bit base; checkpointing stays the trainer's choice
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    pcfg = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=resolve_targets(model, cfg),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, pcfg, adapter_name=_ADAPTER)


def load_lora_model(
    path: str,
    cfg: LoraConfig,
    info: DistInfo,
    activation_checkpointing: bool = False,
    *,
    precision: Precision,
):
    """Load → apply_lora → shard: the LoRA counterpart of `nanosky.train.policy.load_model`. The weights are read once,
    by rank 0 (`load_sharded`); a 4-bit base (QLoRA) is read and quantized by every rank: bitsandbytes quantizes
    while transformers loads, and the packed base is an eighth of the fp32 model."""
    check_platform(cfg, info.device.type)

    def prepare(model):
        model.config.use_cache = False
        if activation_checkpointing:
            checkpoint_activations(model)
        if cfg.qlora:
            # Training mode for good: in eval mode bitsandbytes' CPU forward repacks a 4-bit weight's storage in
            # place for its inference kernel (`Linear4bit.forward`), which would overwrite the FSDP shard with another
            # layout. (Adapter dropout, when set, is then on in the no-grad passes too.)
            model.train()
        return apply_lora(model, cfg)

    if not cfg.qlora:
        return load_sharded(hf_loader(path), info, prepare, precision=precision)
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    # bitsandbytes' CPU backend warns at import when the optional `kernels` package (a faster inference gemv) is
    # missing; training never takes that path (see model.train() above)
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # bf16 quant storage: FSDP2 shards the packed 4-bit weights as bf16 tensors like every other parameter. The
    # 4-bit matmuls compute in the run's precision (as the rest of the model and the engine).
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=precision.compute_dtype,
        bnb_4bit_quant_storage=torch.bfloat16,
    )
    model = AutoModelForCausalLM.from_pretrained(
        path,
        config=engine_config(path),
        dtype=torch.bfloat16,
        attn_implementation=attn_implementation(path),
        device_map={"": info.device},
        quantization_config=quant,
    )
    return shard_model(prepare(model), info, precision=precision)


def load_policy(path: str, cfg: LoraConfig, info: DistInfo, activation_checkpointing: bool, *, precision: Precision):
    """The policy to train: LoRA adapters on the base (`--lora.rank` > 0), else the whole model."""
    if cfg.enabled:
        return load_lora_model(path, cfg, info, activation_checkpointing, precision=precision)
    return load_model(path, info, activation_checkpointing=activation_checkpointing, precision=precision)


def load_reference(path: str, cfg: LoraConfig, info: DistInfo, policy, *, precision: Precision):
    """The frozen reference of a KL term: the starting policy. Under LoRA that is the policy itself with its adapters
    off (`adapters_off`): no second copy of the weights, and for QLoRA the very 4-bit base the policy trains on.
    Otherwise a frozen, sharded copy of the checkpoint."""
    return policy if cfg.enabled else load_model(path, info, trainable=False, precision=precision)


@contextlib.contextmanager
def adapters_off(model):
    """Within the block, a LoRA model computes as its base (peft's `disable_adapter`); any other model as itself."""
    if hasattr(model, "peft_config"):
        with model.disable_adapter():
            yield model
    else:
        yield model


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """What the optimizer gets: the adapters under LoRA, everything otherwise."""
    return [p for p in model.parameters() if p.requires_grad]


# ---- merged weights --------------------------------------------------------------------------------------------
def _full(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole tensor, all-gathered in `dtype` when given: each shard is cast first, so a bf16 gather moves half
    the bytes of an fp32 one."""
    if dtype is not None and t.dtype == torch.float32:  # the master weights (a 4-bit base's packed storage stays)
        t = t.to(dtype)
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def quant_state(base) -> object | None:
    """A 4-bit (QLoRA) base layer's dequantization state, or None for a dense layer. Read from the module: FSDP2's
    parameter swap dropped the parameter's own copy (see the module docstring)."""
    return getattr(base.weight, "quant_state", None) or getattr(base, "quant_state", None)


def _dense_base_weight(layer, w: torch.Tensor) -> torch.Tensor:
    """The base weight as a dense tensor [out, in]: `w` itself, or dequantised from its gathered packed storage
    (QLoRA: [out·in/4, 1] NF4 codes in bf16 storage) into the layer's compute dtype, as its forward dequantizes
    (codes × absmax rounded once: to bf16 on CUDA, not at all in fp32 on the CPU)."""
    base = layer.get_base_layer()
    state = quant_state(base)
    if state is None:
        return w
    import bitsandbytes as bnb

    if w.numel() * w.element_size() * 2 != state.shape.numel():  # two 4-bit codes per byte
        raise ValueError(f"packed 4-bit weight of {w.numel()} elements does not hold shape {tuple(state.shape)}")
    state = copy.copy(state)
    state.dtype = getattr(base, "compute_dtype", None) or state.dtype
    return bnb.functional.dequantize_4bit(w.contiguous(), state)


def iter_merged_params(
    model, dtype: torch.dtype | None = None, shared: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """`merged_params` under the checkpoint's names and layouts: what `save_pretrained` would write, which is what
    vLLM's loaders read (`policy.checkpoint_names`; e.g. Mixtral's experts one by one, not stacked). What the sync
    streams and the exports write. `shared`: gathered through node-shared memory where it can be (`gathered`: each
    tensor valid until the next shared gather; the sync's)."""
    to_checkpoint = checkpoint_names(base_model(model))
    for name, t in merged_params(model, dtype, shared):
        yield from to_checkpoint(name, t)


def merged_params(model, dtype: torch.dtype | None = None, shared: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(base-model HF name, full tensor) with every adapter merged: W + scaling·B@A, in fp32, cast back to W's dtype.
    `dtype` (the engine's, e.g. bf16): tensors are gathered in it, except an adapted layer's base and its adapters,
    gathered in full precision and merged in fp32, so each merged weight is rounded to `dtype` once. A 4-bit base (QLoRA) is gathered packed and dequantized.

    For a plain model this is the model's own state. Names are exactly the base model's state_dict keys (in memory:
    `iter_merged_params` turns them into the checkpoint's); adapter keys are consumed, never yielded. The training model is not modified. Collective:
    each sharded tensor is all-gathered, so every rank must consume the iterator in the same order. The scaling is
    read from the layer peft built (alpha / rank, or rsLoRA's), so the merge matches the forward by construction.
    """
    is_peft = hasattr(model, "peft_config")
    modules = dict(base_model(model).named_modules())
    pending: dict[str, dict[str, torch.Tensor]] = {}  # LoRA module → {"weight", "lora_A", "lora_B"}, until complete

    def local(key: str, t: torch.Tensor) -> torch.Tensor:
        """The shard cast to what is gathered: an adapted layer's base and its adapters in full precision (the merge
        is rounded to `dtype` once), the rest in `dtype`."""
        name = key.removeprefix(_PEFT_PREFIX) if is_peft else key
        keep = _LORA_KEY.match(name) or _BASE_KEY.match(name)
        return t.to(dtype) if dtype is not None and not keep and t.dtype == torch.float32 else t

    state = ((key, local(key, t)) for key, t in model.state_dict().items())
    for key, t in gathered(state, shared=shared):  # same order on every rank, shards gathered a bucket at a time
        name = key.removeprefix(_PEFT_PREFIX) if is_peft else key
        if m := _LORA_KEY.match(name):
            mod, part, adapter = m.groups()
            if adapter != _ADAPTER:
                raise ValueError(f"unexpected adapter {adapter!r} in {key}: only one adapter is supported")
            pending.setdefault(mod, {})[part] = t
        elif m := _BASE_KEY.match(name):
            mod, leaf = m.groups()
            if leaf == "weight":
                pending.setdefault(mod, {})["weight"] = _dense_base_weight(modules[mod], t)
            elif leaf == "bias":  # held back so that the names come out in the base model's order
                pending.setdefault(mod, {})["bias"] = t
            # else: bitsandbytes quant-state entries of a 4-bit weight, folded into the dequantised weight
        elif ".lora_" in name:  # embedding adapters, DoRA magnitudes, ...: merging them here would be wrong
            raise NotImplementedError(f"cannot merge adapter parameter {key}")
        else:
            yield name, t
            continue
        if {"weight", "lora_A", "lora_B"} <= pending.get(mod, {}).keys():
            p = pending.pop(mod)
            w, a, b = p["weight"], p["lora_A"], p["lora_B"]  # w [out, in], a [r, in], b [out, r]
            scale = modules[mod].scaling[_ADAPTER]
            yield f"{mod}.weight", (w.float() + scale * (b.float() @ a.float())).to(dtype or w.dtype)
            if "bias" in p:
                yield f"{mod}.bias", p["bias"].to(dtype or p["bias"].dtype)
    if pending:
        raise RuntimeError(f"incomplete LoRA modules in state_dict: {sorted(pending)}")


# ---- export --------------------------------------------------------------------------------------------------
def _is_main() -> bool:
    return dist.get_rank() == 0


def save_adapter(model, out_dir: str) -> None:
    """peft format (adapter_config.json + adapter_model.safetensors), loadable by `PeftModel.from_pretrained` and by
    vLLM's LoRA loader. Collective: the adapter shards are gathered; rank 0 writes."""
    if not hasattr(model, "peft_config"):
        raise ValueError("save_adapter needs a peft-wrapped model (lora.rank > 0); use save_merged for a plain one")
    full = {k: _full(t).cpu() for k, t in model.state_dict().items() if ".lora_" in k}
    if _is_main():
        model.save_pretrained(out_dir, state_dict=full, safe_serialization=True)
    dist.barrier()


def save_merged(model, tok, out_dir: str, dtype: torch.dtype | None = None) -> None:
    """A plain HF model directory (safetensors + config + tokenizer), adapters merged in (a plain model: its own
    weights), for `--ckpt` evals and vLLM. `dtype`: the weights' dtype on disk (the run's exports: the checkpoint's,
    `policy.checkpoint_dtype`); None keeps the trainer's. Collective: each tensor is gathered in turn (in `dtype`),
    and only rank 0 keeps them and writes: no rank but rank 0 ever holds the whole model."""
    from safetensors.torch import save_file

    main, state = _is_main(), {}
    for n, t in iter_merged_params(model, dtype):
        if main:
            state[n] = t.cpu().contiguous()
    if main:
        os.makedirs(out_dir, exist_ok=True)
        hf = base_model(model)
        config = checkpoint_config(hf.config)  # a copy, with the checkpoint's own window
        if hasattr(config, "quantization_config"):  # the merged weights are dense
            del config.quantization_config
        config.dtype = next(iter(state.values())).dtype
        config.use_cache = True  # the trainer turned the KV cache off; generation wants it
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(out_dir)
        if getattr(hf, "generation_config", None) is not None:
            hf.generation_config.save_pretrained(out_dir)
        tok.save_pretrained(out_dir)
        if hasattr(model, "peft_config"):  # provenance, for humans
            with open(os.path.join(out_dir, "nanosky_lora.json"), "w") as f:
                json.dump({"merged_from_adapter": model.peft_config[_ADAPTER].to_dict()}, f, default=str, indent=1)
    dist.barrier()
