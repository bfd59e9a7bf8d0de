"""The trained model's configs: `--model.*` (what to load), `--lora.*` (adapters, QLoRA) and `--optim.*` (the
optimizer, micro-batches, packing). Used by `nanosky/train/`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class ModelConfig:
    path: str = "tiny"
    """HF model directory or hub id; "tiny" = the bundled tiny Qwen2 model, "tiny-agent" = its agent variant
    (tool calls, webshop/alfworld demos, 1536-token context), "tiny-tool" = its tool_use variant (copies its
    arguments and tool outputs); all built on first use if missing, no network."""
    chat_template: str | None = None
    """A Jinja chat-template file that replaces the model's own, or gives a base model without one a template
    (nanosky/assets/chatml.jinja is ChatML); the export keeps it. Checked at start-up: it must render system /
    user / assistant turns, and in concat mode append turns without rewriting earlier ones."""


ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(kw_only=True)
class LoraConfig:
    rank: int = 0
    """LoRA rank r (0 = full fine-tuning, no adapters)."""
    alpha: float = 16
    """LoRA alpha: the adapter update is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter input (only active in train mode)."""
    target_modules: tuple[str, ...] = ALL_LINEAR
    """Module names that get adapters. The default means every linear layer of the decoder blocks, whatever the
    architecture calls them (Phi-3's fused qkv_proj / gate_up_proj too); a list of your own is checked at start-up:
    a name that matches no module is refused, and linear layers it leaves out are named in a warning."""
    qlora: bool = False
    """Quantise the frozen base to 4-bit NF4 (bitsandbytes: `pip install -e '.[qlora]'`). CUDA, or slowly the CPU
    (tests). The engine gets the dequantized base with the adapters merged in."""

    def __post_init__(self):
        if self.rank < 0:
            raise ValueError(f"lora.rank must be >= 0, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module")
        if self.qlora and self.rank == 0:
            raise ValueError("lora.qlora needs lora.rank > 0 (a 4-bit base can only be trained through adapters)")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 1e-4
    """AdamW learning rate for the policy."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    """Clip the global grad norm to this (0 = off)."""
    warmup_steps: int = 0
    """Linear LR warm-up, in optimizer steps."""
    micro_batch_size: int = 16
    """Sequences per forward/backward on each rank (when `micro_batch_tokens` is 0); the loss is normalised over
    the global batch, so this only trades memory for speed."""
    micro_batch_tokens: int = 0
    """> 0: size micro-batches by tokens instead, counted after prefix sharing (the same number of micro-batches on
    every rank). The gradient does not change with it."""
    packing: Literal["prefix", "flat", "none"] = "prefix"
    """How a micro-batch reaches the model (`nanosky.train.packing`): "prefix" computes a prefix that sequences share
    (a group's prompt, an episode's opening) once; "flat" packs without sharing (no padding); "none" pads each
    sequence to the longest (the plain HF path, for attention backends without 4-D masks)."""
    packed_attention: Literal["auto", "grouped", "mask"] = "auto"
    """How packed rows attend: "grouped" by segment (each shared prompt once, each completion over its prompt and
    itself: `nanosky/train/grouped_attention.py`; on CUDA through SDPA's flash kernels); "mask" one dense [L, L] score
    matrix under the trie's mask. "auto": grouped (on a Zen 4 CPU it trained SmolLM2-135M's math shape 8-14 % faster
    than the mask in bf16 and fp32: docs/experiments/speed.md). Models on eager attention (soft-capped) always use
    the mask."""
    head_chunk_tokens: int = 1024
    """The LM head scores this many tokens at a time in training, recomputing each chunk in backward (unless the
    call's log p fit in 128 MiB: `nanosky.train.head.KEEP_BYTES`): never the [tokens, vocab] fp32 logits at once
    (1.8 GB per 1k tokens on a 152k vocabulary). 0 = the plain head."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them: activation memory per layer
    drops to its input, for about a third more compute. For long rows of big models (a 7B keeps ~7 MB per token)."""
    pack_row_tokens: int = 0
    """Packed row length cap; 0 = by the attention the model runs: none with prefix-grouped attention (one row per
    micro-batch: attention is computed by segment, so a row's length costs nothing, while a shorter cap splits
    groups, repeating their prompt, and pads every row to the longest), 1024 under the dense mask (its [L, L] score
    matrix costs a row's length squared). The figures at 7B width, where longer rows trained faster:
    docs/experiments/speed.md."""
    skip_zero_adv: bool = True
    """Leave rows whose advantages are all 0 (a group whose rewards were all equal) out of the policy's forward and
    backward passes; the loss normalisers still count them, so the gradient is unchanged. Applied only where that
    is exact: a loss registered `zero_at_zero_adv` (every built-in), no entropy bonus, no KL loss term. The logged
    train/entropy, clip_frac, ... are then means over the rows that were trained."""

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.micro_batch_size < 1:
            raise ValueError(f"optim.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.micro_batch_tokens < 0 or self.pack_row_tokens < 0:
            raise ValueError("optim.micro_batch_tokens and optim.pack_row_tokens must be >= 0 (0 = the default)")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("optim.grad_clip, optim.weight_decay and optim.warmup_steps must be >= 0")
        if self.head_chunk_tokens < 0:
            raise ValueError(f"optim.head_chunk_tokens must be >= 0 (0 = the plain head), got {self.head_chunk_tokens}")

    def grouped(self) -> bool:
        """Whether packed rows use prefix-grouped attention (CUDA and CPU alike)."""
        return self.packing != "none" and self.packed_attention != "mask"

    def row_tokens(self, grouped: bool) -> int | None:
        """The packed row cap for a model on grouped attention or the dense mask (None: no cap)."""
        return self.pack_row_tokens or (None if grouped else 1024)

    def describe(self) -> str:
        size = f"{self.micro_batch_tokens} tokens" if self.micro_batch_tokens else str(self.micro_batch_size)
        return size + ("" if self.packing == "none" else f", {self.packing}-packed")
