"""tool_use trained through an external harness (the OpenAI Agents SDK, over the endpoint) against nanosky's own
loop: same seed, same steps, back to back (issue 36).

    python bench/compare_agent.py [--seeds 0 1] [--steps 40] [--agent examples.openai_agents_tool_use:solve]

Writes runs/compare_agent/{loop,agent}-s<seed>/ and prints a Markdown table: held-out accuracy at the start and
the end (the preset's eval: every held-out arith / python task, 4 samples each), the median step time, calls and
segments per episode, and the trainer-vs-engine |Δlogp| on the sampled tokens (train/mismatch/mismatch_abs_mean,
mean over steps).
"""

import argparse
import json
import os
import statistics
import sys

from launch import ROOT, run_py, scalars


def mean_of(s: dict, tag: str) -> float | None:
    pts = s.get(tag)
    return statistics.fmean(v for _, v in pts) if pts else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--agent", default="examples.openai_agents_tool_use:solve")
    ap.add_argument("--out", default="runs/compare_agent")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more run.py flags for every run")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        for name, flags in (("loop", []), ("agent", ["--rollout.agent", args.agent])):
            run_dir = os.path.join(args.out, f"{name}-s{seed}")
            cmd = [
                "--preset",
                "tool_use",
                "--seed",
                str(seed),
                "--steps",
                str(args.steps),
                "--eval.every",
                "20",
            ]
            r = run_py(2, [*cmd, "--log.run-dir", run_dir, "--log.overwrite", *flags, *args.extra])
            if r.returncode:
                sys.exit(f"{name} seed {seed} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
            summary = json.load(open(os.path.join(ROOT, run_dir, "summary.json")))
            s = scalars(os.path.join(ROOT, run_dir))
            rows.append(
                (
                    name,
                    seed,
                    summary["eval_accuracy_initial"],
                    summary["eval_accuracy_final"],
                    summary["median_step_s"],
                    mean_of(s, "agent/calls_per_episode"),
                    mean_of(s, "agent/segments_per_episode"),
                    mean_of(s, "train/mismatch/mismatch_abs_mean"),
                    mean_of(s, "rollout/turns_mean"),
                )
            )
            print(f"{name} seed {seed}: {rows[-1][2:5]}", flush=True)
    fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    # the loop's calls per episode are its turns (one engine call each); its rows are one segment each
    print(
        "\n| run | seed | held-out acc start | end | median step s | calls/ep | segments/ep | trainer-engine abs dlogp |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, seed, a0, a1, med, calls, segs, d, turns in rows:
        calls, segs = (calls, segs) if name == "agent" else (turns, 1.0)
        print(
            f"| {name} | {seed} | {fmt(a0)} | {fmt(a1)} | {fmt(med, 2)} | {fmt(calls, 2)} | {fmt(segs, 2)} | {fmt(d, 6)} |"
        )


if __name__ == "__main__":
    main()
