"""Side-by-side comparison of every --algo preset on text_math with the bundled model (issue 3).

    python bench/compare_algos.py [--seeds 0 1] [--steps 15] [--algos grpo sapo ...]

Same seeds, data and step budget for every preset, 2 CPU ranks each. Writes runs/compare/<algo>-s<seed>/ (one
TensorBoard dir per run: `tensorboard --logdir runs/compare` shows all curves side by side), prints a Markdown table
and, with --log, adds it as a dated entry at the top of docs/experiments/algo_compare.md.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import time

from launch import ROOT, run_py, scalars

ALGOS = ["grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo", "dapo", "gspo", "sapo", "cispo"]


def last_scalar(run_dir: str, tag: str) -> float | None:
    points = scalars(run_dir).get(tag)
    return points[-1][1] if points else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", nargs="+", default=ALGOS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--out", default="runs/compare")
    ap.add_argument("--log", action="store_true", help="add the table to docs/experiments/algo_compare.md")
    ap.add_argument(
        "--reuse", action="store_true", help="keep finished runs (summary.json present) instead of rerunning"
    )
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more run.py flags for every run")
    args = ap.parse_args()
    rows = []
    for algo in args.algos:
        res = []
        for seed in args.seeds:
            run_dir = os.path.join(args.out, f"{algo}-s{seed}")
            cmd = ["--preset", "compare", "--algo", algo, "--seed", str(seed), "--steps", str(args.steps)]
            # --algorithm.track-ref-kl: load the reference only to log train/kl (drift from the start policy)
            cmd += ["--log.run-dir", run_dir, "--log.overwrite", "--algorithm.track-ref-kl", *args.extra]
            done = os.path.exists(os.path.join(ROOT, run_dir, "summary.json"))
            r = None if args.reuse and done else run_py(args.nproc, cmd)
            if r is not None and r.returncode != 0:
                print(f"{algo} seed {seed} FAILED:\n{r.stderr[-2000:]}", file=sys.stderr)
                continue
            s = json.load(open(os.path.join(ROOT, run_dir, "summary.json")))
            res.append(
                (
                    s,
                    last_scalar(os.path.join(ROOT, run_dir), "train/kl"),
                    last_scalar(os.path.join(ROOT, run_dir), "train/entropy"),
                )
            )
            print(
                f"{algo} seed {seed}: {s['eval_accuracy_initial']:.3f} -> {s['eval_accuracy_final']:.3f}",
                flush=True,
            )
        if res:
            mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
            kls = [k for _, k, _ in res if k is not None]
            rows.append(
                (
                    algo,
                    mean([s["eval_accuracy_initial"] for s, _, _ in res]),
                    [s["eval_accuracy_final"] for s, _, _ in res],
                    mean(kls) if kls else None,
                    mean([e for _, _, e in res if e is not None]),
                    mean([s["median_step_s"] for s, _, _ in res]),
                )
            )
    table = [
        "| algo | eval acc start | eval acc end (mean) | per seed | final KL to start | final entropy | median step s |",
        "|---|---|---|---|---|---|---|",
    ]
    for algo, a0, finals, kl, ent, st in rows:
        kl_s = f"{kl:.4f}" if kl is not None else "–"
        per = ", ".join(f"{a:.3f}" for a in finals)
        table.append(
            f"| {algo} | {a0:.3f} | **{statistics.mean(finals):.3f}** | {per} | {kl_s} | {ent:.3f} | {st:.2f} |"
        )
    flags = shlex.join(a for a in sys.argv[1:] if a not in ("--log", "--reuse"))  # quoted as typed
    table.insert(0, f"Measured: `python bench/compare_algos.py {flags}` ({len(args.seeds)} seeds per row).\n")
    text = "\n".join(table)
    print(text)
    if args.log:  # a new dated entry, newest first: after the file's title and introduction
        path = os.path.join(ROOT, "docs", "experiments", "algo_compare.md")
        log = open(path).read()
        at = log.index("\n## ") + 1 if "\n## " in log else len(log)
        entry = f"## {time.strftime('%Y-%m-%d')}: make compare, every preset\n\n{text}\n\n"
        open(path, "w").write(log[:at] + entry + log[at:])


if __name__ == "__main__":
    main()
