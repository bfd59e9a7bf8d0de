"""What this CPU's matmuls do at a model's shapes, one thread (as one rank of the 2-rank runs), in fp32 and bf16: the
rate the train phase's `perf/train_tflops` is measured against (issue 74).

    python bench/matmul_rate.py [--model smollm2-135m] [--tokens 1024] [--threads 1]

The shapes are a decoder layer's projections (q, k/v, o, gate/up, down) over `--tokens` rows and the LM head over
the same rows, forward (x·Wᵀ) and the two backward products (dy·W, dyᵀ·x), weighted by how many of each a layer
has. Prints TFLOP/s per dtype, and the 1024² square product for reference.
"""

from __future__ import annotations

import argparse
import time

import torch


def rate(shapes: list[tuple[int, int, int, int]], dtype: torch.dtype, reps: int) -> float:
    """TFLOP/s over `shapes` (m, k, n, count): each m×k · k×n product `count` times, after a warm-up."""
    mats = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype), c) for m, k, n, c in shapes]
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] * c for a, b, c in mats)
    for a, b, _ in mats:
        a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for a, b, c in mats:
            for _ in range(c):
                a @ b
        best = min(best, time.perf_counter() - t0)
    return flops / best / 1e12


def model_shapes(path: str, tokens: int) -> list[tuple[int, int, int, int]]:
    from transformers import AutoConfig

    from nanosky.bundled import resolve_model_path

    cfg = AutoConfig.from_pretrained(resolve_model_path(path))
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    layer = [(h, h, 2), (h, kv, 2), (h, i, 2), (i, h, 1)]  # (in, out, count): q+o, k+v, gate+up, down
    out = []
    for k, n, c in layer + [(h, v, 0)]:
        c = c * cfg.num_hidden_layers if c else 1  # the head once
        out += [(tokens, k, n, c), (tokens, n, k, c), (n, tokens, k, c)]  # forward, d input, d weight
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = model_shapes(args.model, args.tokens)
    for dtype in (torch.float32, torch.bfloat16):
        print(
            f"{args.threads} thread(s) {str(dtype).removeprefix('torch.'):8s} model shapes "
            f"{rate(shapes, dtype, args.reps):.3f} TFLOP/s   1024² {rate([(1024, 1024, 1024, 8)], dtype, args.reps):.3f}"
        )


if __name__ == "__main__":
    main()
