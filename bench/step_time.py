"""Step-time benchmark: 2 ranks, 32 prompts × 8 samples × 32 new tokens, GRPO on text_math, the bundled model.

    python bench/step_time.py [--nproc 2] [--steps 6] [--shape math|agent] [--packing prefix|flat|none]
                              [--algo grpo|ppo] [--lora] [-- EXTRA RUN.PY FLAGS]

`--shape agent` puts the problems behind a ~370-token agent system prompt with tool schemas (bench/shapes.py).
Prints the per-phase medians (generate / logprob / train / sync) and the throughput figures over the steps after
the first (which pays vLLM's warm-up); the sync's megabytes a rank and rate against a plain 1-thread copy of as
many bytes; and as its last line `step_s=<median seconds per step>`.
"""

import argparse
import json
import statistics
import sys
import tempfile

from launch import run_py, scalars
from shapes import MAX_TOTAL, SYSTEM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--prompts", type=int, default=32, help="prompts a step (x 8 samples), 2 micro-batches a rank")
    ap.add_argument("--shape", choices=sorted(SYSTEM), default="math")
    ap.add_argument("--packing", choices=["prefix", "flat", "none"], default="prefix")
    ap.add_argument("--algo", default="grpo")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("extra", nargs="*", help="more run.py flags (after --)")
    args = ap.parse_args()
    run_dir = tempfile.mkdtemp(prefix="nanosky-bench-")
    flags = [
        "--preset",
        "bench",
        "--steps",
        str(args.steps),
        "--model.path",
        args.model,
        "--log.run-dir",
        run_dir,
        "--algo",
        args.algo,
        "--optim.packing",
        args.packing,
        "--env-kwargs",
        "system_prompt",
        json.dumps(SYSTEM[args.shape]),
        "--rollout.max-total-tokens",
        str(MAX_TOTAL[args.shape]),
        "--engine.max-model-len",
        "512",
        "--rollout.prompts-per-step",
        str(args.prompts),
        "--optim.micro-batch-size",
        str(args.prompts * 8 // (2 * args.nproc)),  # 2 a rank, as TRL's gradient_accumulation_steps=2
        *(["--lora.rank", "8"] if args.lora else []),
        *args.extra,
    ]
    r = run_py(args.nproc, flags)
    if r.returncode != 0:
        sys.exit(r.stderr[-4000:])
    logged = scalars(run_dir)

    def med(tag: str) -> float:
        vals = [v for _, v in logged[tag]][1:]  # drop the warm-up step
        return statistics.median(vals)

    print(
        f"model {args.model}, shape: {args.shape}, {args.nproc} ranks, {args.prompts} prompts x 8 samples x 32 new tokens, {args.algo}"
        f"{' + LoRA' if args.lora else ''}, packing {args.packing}, steps {args.steps} (first dropped)"
    )
    for tag in (
        "timing/generate_s",
        "timing/logprob_s",
        "timing/train_s",
        "timing/sync_s",
        "perf/tokens_per_s",
        "perf/rollout_tokens_per_s",
        "perf/train_tokens_per_s",
        "perf/prefix_saved_frac",
        "perf/train_tflops",
    ):
        print(f"{tag:26s} {med(tag):10.4f}")
    if "memory/train_gib" in logged:  # rank 0's peak RSS (ru_maxrss) after the train phase
        print(f"{'memory/train_gib (peak)':26s} {max(v for _, v in logged['memory/train_gib']):10.4f}")
    if "sync/mbytes" in logged:  # what a rank's push moved, against a plain copy of as many bytes
        mb, push = med("sync/mbytes"), med("sync/push_s")
        copy = copy_mb_per_s(mb)
        print(
            f"sync: {mb:.0f} MB a rank, pushed in {push:.3f} s ({mb / push:.0f} MB/s; probe {med('sync/probe_s'):.3f} s); "
            f"a plain 1-thread torch copy of the same bytes: {copy:.0f} MB/s, {mb / copy:.3f} s ({copy * push / mb:.1f}x faster)"
        )
    print(f"step_s={med('timing/step_s'):.3f}")


def copy_mb_per_s(mb: float, reps: int = 5) -> float:
    """A plain `torch` copy of `mb` megabytes, one thread (a rank's share of the box), median of `reps`."""
    import time

    import torch

    torch.set_num_threads(1)
    src = torch.ones(int(mb * 1e6), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    dst.copy_(src)  # first touch of dst's pages
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return mb / statistics.median(times)


if __name__ == "__main__":
    main()
