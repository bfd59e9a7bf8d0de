"""Partial rollouts against the synchronous step, back to back: for each shape and each (K, F), one 2-rank run;
prints the median step time (steps after the first), the tail share of the rollout phase (`rollout/tail_s` over
`timing/generate_s`), the engine's mean batch, staleness, and the correction's truncated and masked fractions.

    python bench/partial_rollouts.py [--shapes longtail,tool_use,swe] [--configs 0:1,1:1,1:1.5,2:1.5] [--steps 6]

Shapes: `longtail` (bench/longtail.py: text_math episodes of a heavy-tailed number of turns, every turn
--rollout.max-new-tokens long), `tool_use` and `swe` (their presets, smaller batches), and `agent` (tool_use played
by an external agent through the endpoint, tests/scripts/pondering_agent.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from launch import run_py, scalars

SHAPES = {
    "longtail": "--plugins bench.longtail --env longtail_math --rollout.ignore-eos --rollout.max-new-tokens 48 "
    "--rollout.max-total-tokens 512 --engine.max-model-len 512 --rollout.prompts-per-step 32 "
    "--rollout.group-size 8 --eval.every 0 --eval.limit 8 --eval.n-samples 1 --log.ckpt-every 0",
    "tool_use": "--preset tool_use --rollout.prompts-per-step 16 --rollout.group-size 8 --eval.every 0 "
    "--eval.limit 8 --eval.n-samples 1",
    "swe": "--preset swe --rollout.prompts-per-step 4 --rollout.group-size 4 --eval.every 0 --eval.limit 2 "
    "--envpool.workers 1",
    # an external agent that thinks 0.2-1.0 s between its two calls: the engine idles while it thinks
    "agent": "--preset tool_use --rollout.agent tests.scripts.pondering_agent:solve --rollout.prompts-per-step 16 "
    "--rollout.group-size 4 --eval.every 0 --eval.limit 8 --eval.n-samples 1 --log.ckpt-every 0",
}


def median(s: dict, tag: str, skip_first: bool = True) -> float:
    vals = [v for st, v in s.get(tag, []) if not (skip_first and st == 1)]
    return statistics.median(vals) if vals else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="longtail,tool_use")
    ap.add_argument("--configs", default="0:1,1:1,1:1.5,2:1,2:1.5", help="K:F pairs")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        for kf in args.configs.split(","):
            k, f = kf.split(":")
            run_dir = tempfile.mkdtemp(prefix=f"nanosky-partial-{shape}-")
            flags = SHAPES[shape].split() + ["--steps", str(args.steps), "--seed", str(args.seed)]
            flags += ["--rollout.max-staleness", k, "--rollout.oversample", f, "--log.run-dir", run_dir]
            r = run_py(2, flags)
            if r.returncode != 0:
                sys.exit(f"{shape} K={k} F={f} failed:\n{r.stderr[-4000:]}")
            s = scalars(run_dir)
            gen = median(s, "timing/generate_s")
            row = (
                f"| {shape} | {k} | {f} | {median(s, 'timing/step_s'):.2f} | {gen:.2f} | "
                f"{median(s, 'rollout/tail_s') / gen:.2f} | {median(s, 'rollout/engine_batch_mean'):.1f} | "
                f"{median(s, 'rollout/staleness_mean'):.2f} / {max((v for _, v in s.get('rollout/staleness_max', [])), default=0):.0f} | "
                f"{median(s, 'rollout/carried'):.0f} | {median(s, 'train/rc/frac_corrected'):.3f} | "
                f"{median(s, 'train/is_masked_frac'):.3f} | {s['eval/accuracy'][-1][1]:.3f} |"
            )
            rows.append(row)
            print(row, flush=True)
    print(
        "\n| shape | K | F | step s | generate s | tail share | engine batch | staleness mean / max | carried "
        "| truncated | masked | final eval |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
