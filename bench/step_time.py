"""Step-time benchmark: 2 ranks, 32 prompts × 8 samples × 32 new tokens, GRPO on text_math, the bundled model.

    python bench/step_time.py [--nproc 2] [--steps 6]

Prints the per-phase medians (generate / logprob / train / sync) over the steps after the first (which pays vLLM's
warm-up), and as its last line `step_s=<median seconds per step>`.
"""

import argparse
import statistics
import sys
import tempfile

from launch import run_py


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--model", default="tiny")
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
    ]
    r = run_py(args.nproc, flags)
    if r.returncode != 0:
        sys.exit(r.stderr[-4000:])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir)
    acc.Reload()

    def med(tag: str) -> float:
        vals = [e.value for e in acc.Scalars(tag)][1:]  # drop the warm-up step
        return statistics.median(vals)

    print(
        f"shape: {args.nproc} ranks, 32 prompts x 8 samples x 32 new tokens, steps {args.steps} (first dropped)"
    )
    for tag in (
        "timing/generate_s",
        "timing/logprob_s",
        "timing/train_s",
        "timing/sync_s",
        "perf/tokens_per_s",
    ):
        print(f"{tag:22s} {med(tag):8.3f}")
    print(f"step_s={med('timing/step_s'):.3f}")


if __name__ == "__main__":
    main()
