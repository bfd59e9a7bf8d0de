"""The trainable policy: an HF causal LM sharded with FSDP2 (`fully_shard` per decoder layer + root).

Also the frozen reference model, the logprob / entropy computation the losses need, and the full-tensor stream. Every
trainer model is read from disk once, by rank 0, and broadcast into the shards (`load_sharded`). The HF export (plain
or LoRA-merged) is `nanosky.train.lora.save_merged`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from nanosky.dist import DistInfo
from nanosky.precision import Precision
from nanosky.train import head
from nanosky.train.shared_gather import SharedArena, aligned, node_arena, share_fsdp_collectives


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
    Those models train with eager attention (`packing` then passes an additive mask), as do models transformers
    implements without SDPA."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    if getattr(cfg, "attn_logit_softcapping", None):
        return "eager"
    from transformers import AutoModelForCausalLM

    cls = AutoModelForCausalLM._model_mapping.get(type(cfg), None)
    return "sdpa" if getattr(cls, "_supports_sdpa", True) else "eager"  # e.g. GPT-OSS (attention sinks)


ENGINE_WINDOW_OFFSET = {"cohere2": 1}
"""Sliding windows vLLM 0.32 counts differently from transformers, by `model_type`: its Command-R attention sees
sliding_window + 1 positions ("cohere swa layer sees [pos - sliding_window, pos]", `models/commandr.py`). The trainer
follows the engine, which samples the rollouts (with window 16, transformers at 17 matches vLLM to 4.8e-7, at 16 it
is 5.3e-3 off): its config's window, and so its attention and packing's masks, grow by the offset. Exports write
the checkpoint's value back (`checkpoint_config`)."""


def engine_config(path: str):
    """The checkpoint's config as the trainer builds its models: aligned with the engine (`ENGINE_WINDOW_OFFSET`)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    off = ENGINE_WINDOW_OFFSET.get(getattr(cfg, "model_type", ""), 0)
    if off and getattr(cfg, "sliding_window", None):
        cfg.sliding_window += off
    return cfg


def checkpoint_config(cfg):
    """The inverse of `engine_config`, on a copy: what an export writes."""
    import copy

    cfg = copy.deepcopy(cfg)
    off = ENGINE_WINDOW_OFFSET.get(getattr(cfg, "model_type", ""), 0)
    if off and getattr(cfg, "sliding_window", None):
        cfg.sliding_window -= off
    return cfg


def hf_loader(path: str, cls=None, **kw) -> Callable[[bool], torch.nn.Module]:
    """`build(real)` for `load_sharded`: the checkpoint's model in fp32 (the master weights; on GPU the FSDP
    mixed-precision policy computes in bf16), read from disk, or only its structure from the config; either way
    with the engine-aligned config (`engine_config`)."""
    from transformers import AutoModelForCausalLM

    cls = cls or AutoModelForCausalLM
    kw = {"dtype": torch.float32, "attn_implementation": attn_implementation(path)} | kw

    def build(real: bool) -> torch.nn.Module:
        cfg = engine_config(path)
        return cls.from_pretrained(path, config=cfg, **kw) if real else cls.from_config(cfg, **kw)

    return build


def checkpoint_names(hf) -> Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]:
    """in-memory (name, tensor) -> what `save_pretrained` writes for it: transformers 5 converts some checkpoints on
    load (Mixtral's `block_sparse_moe.experts.N.w1/w2/w3` become one stacked `mlp.experts.gate_up_proj` [E, 2I, H])
    and reverts it on save, with its own conversion tables. vLLM's loaders read the checkpoint's names, so the sync
    and the exports go through the same reversion. The identity for the many models without a conversion."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange, revert_weight_conversion

    convs = getattr(hf, "_weight_conversions", None) or get_model_conversion_mapping(hf, add_legacy=False)
    if not [c for c in convs if not isinstance(c, PrefixChange)]:
        return lambda name, t: ((name, t),)
    return lambda name, t: revert_weight_conversion(hf, {name: t}).items()


def checkpoint_dtype(path: str) -> torch.dtype:
    """The dtype the checkpoint declares for its weights (config.json's `dtype`, as vLLM's "auto" reads it; fp32 when
    absent): the exports keep it, so a bf16 base exports bf16, not the trainer's fp32 master weights."""
    from transformers import AutoConfig

    d = getattr(AutoConfig.from_pretrained(path), "dtype", None)
    d = getattr(torch, d) if isinstance(d, str) else d
    return d if isinstance(d, torch.dtype) else torch.float32


def load_model(
    path: str,
    info: DistInfo,
    trainable: bool = True,
    activation_checkpointing: bool = False,
    *,
    precision: Precision,
):
    def prepare(model):
        model.config.use_cache = False
        if not trainable:
            model.requires_grad_(False)
        elif activation_checkpointing:
            checkpoint_activations(model)
        return model

    return load_sharded(hf_loader(path), info, prepare, precision=precision)


def load_sharded(
    build: Callable[[bool], torch.nn.Module],
    info: DistInfo,
    prepare: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m,
    *,
    precision: Precision,
) -> torch.nn.Module:
    """The model, read from disk once for all ranks: every rank builds `prepare(build(False))` on the meta device
    and shards it with FSDP2; rank 0 alone reads the checkpoint (`prepare(build(True))`) and broadcasts it tensor by
    tensor, each rank keeping its shard and rank 0 freeing each full tensor once sent. The host then holds one full
    copy at the peak, not one per rank (a 7B in fp32 on 8 ranks: 30 GB, not 244 GB). `prepare` must give the same
    names on both (e.g. adapters injected, layers marked for checkpointing)."""
    with torch.device("meta"):
        model = prepare(build(False))
    model = shard_model(model, info, precision=precision)  # materialized empty on the device, shard by shard
    if info.is_main:
        real = prepare(build(True))
        src, bufs = real.state_dict(), dict(real.named_buffers())
        if hasattr(real, "generation_config"):  # exports write it (rank 0)
            model.generation_config = real.generation_config
        del real  # `src` holds the only references: popping an entry frees it
    with torch.no_grad():
        sd = model.state_dict()
        for name, dst in sd.items():  # the same order on every rank
            _receive(dst, src.pop(name, None) if info.is_main else None, info)
        persistent = set(sd)
        # non-persistent buffers (RoPE's inv_freq) are in no state_dict: rank 0's values too
        for name, buf in model.named_buffers():
            if name not in persistent:
                _receive(buf, bufs[name] if info.is_main else None, info)
    return model


def _receive(dst: torch.Tensor, full: torch.Tensor | None, info: DistInfo) -> None:
    """Broadcast rank 0's `full` tensor and copy this rank's part of it into `dst` (an FSDP2 shard, or a whole
    tensor)."""
    shape = dst.shape  # a DTensor's global shape
    empty = full is None
    t = torch.empty(shape, dtype=dst.dtype, device=info.device) if empty else full.to(info.device, dst.dtype)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"checkpoint tensor {tuple(t.shape)} does not fit the model's {tuple(shape)}")
    torch.distributed.broadcast(t, src=0)
    if isinstance(dst, DTensor):  # this rank's chunk along the sharded dim, as FSDP2 placed it
        dst.to_local().copy_(distribute_tensor(t, dst.device_mesh, dst.placements, src_data_rank=None).to_local())
    else:
        dst.copy_(t)


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


def shard_model(model, info: DistInfo, reshard_after_forward: bool | None = None, *, precision: Precision):
    """FSDP2 per decoder layer + root: the one wrapping of the policy, the reference, the critic and LoRA models
        (frozen and trainable parameters share the per-layer groups). Resharding after forward (ZeRO-3) saves memory on
        big models; the default keeps small models (< 1B params) gathered between forward and backward (ZeRO-2-like),
        which halves the all-gathers per micro-batch. `precision` (`nanosky.precision.decide`): bf16 is FSDP2's mixed
    precision over fp32 masters; fp32 casts nothing."""
    private_classes(model)  # before any engine starts: immune to vLLM's in-place class rewrite
    mesh = torch.distributed.device_mesh.init_device_mesh(info.device.type, (info.world,))
    mp = precision.mixed_policy()
    if reshard_after_forward is None:
        reshard_after_forward = sum(p.numel() for p in model.parameters()) > 1e9
    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward} | ({"mp_policy": mp} if mp else {})
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    if not info.is_cuda:  # one CPU node: FSDP2's collectives through shared memory, not gloo's loopback TCP
        share_fsdp_collectives([*decoder_layers(model), model], mesh.get_group())
    model._nanosky_accumulates = not reshard_after_forward  # `accumulate`: gradients kept whole across micro-batches
    head.install(model)  # the chunked LM head, as an FSDP forward method (`nanosky.train.head`)
    if any(p.is_meta for p in model.parameters()):  # a skeleton (`load_sharded`): storage for the shards only
        return model.to_empty(device=info.device)
    return model.to(info.device) if info.is_cuda else model


def accumulate(model, last: bool) -> None:
    """Before each micro-batch's backward: gradient accumulation as FSDP2 does it for a model that keeps its
    parameters gathered between forward and backward (`shard_model`: < 1B parameters). Before the step's last
    micro-batch the gradients are reduced and the parameters resharded as usual; before the others both stay whole
    (the gradients summed in the reduce dtype, fp32), so a step pays one reduce-scatter and one all-gather, not one
    per micro-batch (over gloo a reduce-scatter is an all-reduce of the whole gradient). Every rank runs the same
    number of micro-batches (`packing.plan_micro_batches`). A no-op for a model that reshards, or none FSDP wraps."""
    if getattr(model, "_nanosky_accumulates", False):
        model.set_requires_gradient_sync(last)
        model.set_reshard_after_backward(last)


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


BUCKET_BYTES = 64 << 20
"""`gathered`: the shards one collective gathers together (each rank's part, before the gather)."""


def gathered(
    items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES, shared: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) for (name, tensor) items: consecutive FSDP2 shards (DTensors sharded on dim 0, one dtype
    and mesh) gathered in one all-gather per bucket of `bucket_bytes`, not one per tensor (a 135M model's 272 tensors:
    273 collectives, each paying gloo's latency); other DTensors alone; plain tensors as they are. Collective: every
    rank must consume it in the same order.

    `shared` (the sync): where every rank is on this node on CPU, the buckets go through node-shared memory
    (`shared_gather`) instead of gloo, and the tensors are views of it, valid until the next shared gather: consume
    each before asking for the next gather (the engine copies them as it loads)."""
    arena = None
    bucket: list[tuple[str, DTensor]] = []
    size = 0
    for name, t in items:
        if bucket and not _joins(bucket[-1][1], t, size, bucket_bytes):
            yield from _gather_bucket(bucket, arena)
            bucket, size = [], 0
        if shared and arena is None and isinstance(t, DTensor) and _gatherable(t):
            arena = node_arena(t.device_mesh.get_group()) if t.device.type == "cpu" else None
            if arena is not None:
                arena.start()
            shared = False  # decided, once
        if isinstance(t, DTensor) and _gatherable(t):
            bucket.append((name, t))
            size += _shard_bytes(t)
            continue
        yield name, (t.full_tensor() if isinstance(t, DTensor) else t).detach()
    yield from _gather_bucket(bucket, arena)


def _gatherable(t: DTensor) -> bool:
    from torch.distributed.tensor import Shard

    return t.ndim >= 1 and len(t.placements) == 1 and t.placements[0] == Shard(0)


def _shard_bytes(t: DTensor) -> int:
    """The bytes of the largest rank's shard of `t`: the same on every rank, so every rank cuts the buckets alike (the
    local shard's own size differs where dim 0 does not divide: a bucket boundary drawn from it would pair different
    collectives on different ranks)."""
    return _chunk(t.shape[0], t.device_mesh.size()) * math.prod(t.shape[1:]) * t.element_size()


def _joins(last: DTensor, t: torch.Tensor, size: int, cap: int) -> bool:
    return (
        isinstance(t, DTensor)
        and _gatherable(t)
        and t.dtype == last.dtype
        and t.device_mesh == last.device_mesh
        and size + _shard_bytes(t) <= cap
    )


def _chunk(d0: int, world: int) -> int:
    """The rows of the largest dim-0 shard (torch.chunk's split): rank r's rows start at r × this."""
    return -(-d0 // world)


def _rows(d0: int, r: int, world: int) -> int:
    """Rank r's rows of a dim-0 shard of d0 rows (torch.chunk's split: the last ranks get fewer rows, or none)."""
    c = _chunk(d0, world)
    return max(0, min(c, d0 - r * c))


def _gather_bucket(
    bucket: list[tuple[str, DTensor]], arena: SharedArena | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The bucket's whole tensors from one all-gather of every rank's shards, flattened end to end (each rank's
    part padded to the longest: torch.chunk's split of dim 0 gives the last ranks fewer rows, or none); through
    `arena`'s shared memory where there is one with room."""
    if not bucket:
        return
    if arena is not None and (out := _gather_shared(bucket, arena)) is not None:
        yield from out
        return
    mesh = bucket[0][1].device_mesh
    world, group = mesh.size(), mesh.get_group()
    local = [t.to_local().detach() for _, t in bucket]
    per_row = [math.prod(t.shape[1:]) for _, t in bucket]
    sizes = [[_rows(t.shape[0], r, world) * n for (_, t), n in zip(bucket, per_row)] for r in range(world)]
    width = max(sum(x) for x in sizes)
    flat = torch.empty(width, dtype=local[0].dtype, device=local[0].device)
    torch.cat([x.reshape(-1) for x in local], out=flat[: sum(x.numel() for x in local)])
    out = torch.empty(world * width, dtype=flat.dtype, device=flat.device)
    torch.distributed.all_gather_into_tensor(out, flat, group=group)
    starts = [0] * world
    for i, (name, t) in enumerate(bucket):
        parts = []
        for r in range(world):
            parts.append(out[r * width + starts[r] : r * width + starts[r] + sizes[r][i]])
            starts[r] += sizes[r][i]
        yield name, torch.cat(parts).view(t.shape)


def _gather_shared(bucket: list[tuple[str, DTensor]], arena: SharedArena) -> list[tuple[str, torch.Tensor]] | None:
    """The bucket's whole tensors in `arena`: each rank writes its rows into each tensor's place, then (a barrier)
    reads every tensor whole, in place. None (on every rank alike) where the arena has no room left."""
    world, rank = bucket[0][1].device_mesh.size(), bucket[0][1].device_mesh.get_local_rank()
    dtype = bucket[0][1].dtype
    item = dtype.itemsize
    spans = [aligned(t.numel() * item) for _, t in bucket]
    buf = arena.take(sum(spans))
    if buf is None:
        return None
    out, at = [], 0
    for (name, t), span in zip(bucket, spans):
        whole = buf[at : at + t.numel() * item].view(dtype).view(t.shape)
        start, n = rank * _chunk(t.shape[0], world), _rows(t.shape[0], rank, world)
        if n:
            whole[start : start + n].copy_(t.to_local().detach())
        out.append((name, whole))
        at += span
    arena.publish()
    return out


def iter_full_params(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) one parameter at a time, the shards all-gathered a bucket at a time (`gathered`: a
    collective, every rank must consume the iterator in the same order)."""
    yield from gathered(model.state_dict().items())
