"""Grouped attention's CPU calls in bf16: torch's SDPA (its CPU flash kernel) against `scores_attention` (fp32 with
the scores materialised), one thread, alternating A and B so that the box's drift hits both alike.

    python bench/attention_cpu.py [--model smollm2-135m] [--prompts 2] [--pairs 12]

Prints, per path, the forward + backward of one attention call at a GRPO group's shape (the completions of a
micro-batch over their prompt), then of a whole micro-batch of the model (`--prompts` prompts x 8 completions of
random tokens, packed as the trainer packs them), and the median ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from launch import ROOT

sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

from nanosky.bundled import resolve_model_path  # noqa: E402
from nanosky.train import grouped_attention, packing  # noqa: E402


def alternate(a, b, pairs: int) -> tuple[list[float], list[float]]:
    """Seconds of `a()` and `b()`, run in turn (a b, b a, ...) `pairs` times after one warm-up each."""
    a(), b()
    ta, tb = [], []
    for i in range(pairs):
        for f, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)
    return ta, tb


def report(what: str, ta: list[float], tb: list[float]) -> None:
    ma, mb = statistics.median(ta), statistics.median(tb)
    faster = sum(b < a for a, b in zip(ta, tb))
    print(f"{what}: SDPA {ma * 1e3:.1f} ms, scores {mb * 1e3:.1f} ms (median), ratio {mb / ma:.2f}; ", end="")
    print(f"scores faster in {faster} of {len(ta)} pairs")


def one_call(S: int, n: int, lk: int, H: int, Hkv: int, d: int, pairs: int) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(S, H, n, d, generator=g).bfloat16().requires_grad_()
    k, v = (torch.randn(S, Hkv, lk, d, generator=g).bfloat16().requires_grad_() for _ in range(2))
    mask = torch.ones(n, lk, dtype=torch.bool).tril(lk - n).repeat(S, 1, 1, 1)
    grad = torch.randn(S, H, n, d, generator=g).bfloat16()

    def run(f):
        return lambda: f(q, k, v).backward(grad)

    ta, tb = alternate(
        run(lambda q, k, v: sdpa(q, k, v, attn_mask=mask, scale=d**-0.5, enable_gqa=True)),
        run(lambda q, k, v: grouped_attention.scores_attention(q, k, v, mask, False, d**-0.5)),
        pairs,
    )
    report(f"one call, {S} segments x {n} queries over {lk} keys, {H}/{Hkv} heads of {d}", ta, tb)


def micro_batch(model_name: str, prompts: int, pairs: int) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(model_name), dtype=torch.bfloat16, attn_implementation="sdpa"
    )
    grouped_attention.enable(model)
    rng, V, seqs = random.Random(0), model.config.vocab_size, []
    for _ in range(prompts):
        prompt = [rng.randrange(3, V) for _ in range(rng.randrange(45, 75))]
        seqs += [prompt + [rng.randrange(3, V) for _ in range(rng.randrange(20, 33))] for _ in range(8)]
    p = packing.pack(seqs, max(map(len, seqs)) - 1, row_tokens=1024)
    full = grouped_attention.SCORES_BYTES

    def step(limit: int):
        def f():
            grouped_attention.SCORES_BYTES = limit
            lp, _ = packing.logprobs(model, p)
            lp.float().sum().backward()
            model.zero_grad(set_to_none=True)

        return f

    ta, tb = alternate(step(0), step(full), pairs)
    grouped_attention.SCORES_BYTES = full
    report(f"{model_name} forward + backward, {len(seqs)} sequences, {p.unique_tokens} tokens", ta, tb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=2, help="prompts in the micro-batch (8 completions each)")
    ap.add_argument("--pairs", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(1)
    one_call(14, 32, 92, 9, 3, 64, args.pairs * 4)  # SmolLM2's heads; 2 prompts' completions over prompt + itself
    micro_batch(args.model, args.prompts, args.pairs)


if __name__ == "__main__":
    main()
