"""Issue 14's table, back to back in one run: nanosky packed vs unpacked vs TRL's GRPOTrainer, on both shapes,
plus LoRA and PPO (critic) packed vs unpacked.

    python bench/throughput.py [--steps 6] [--only math,agent,lora,ppo]

Each row is a separate `bench/step_time.py` / `bench/trl_grpo.py` run (first step dropped, medians). TRL rows need
`pip install trl==1.16.0` (`make bench-trl` installs it); without it they are skipped. Run on an idle machine.
"""

import argparse
import importlib.util
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script: list[str]) -> dict[str, float]:
    r = subprocess.run(script, cwd=os.path.dirname(HERE), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(script)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    out = {}
    for line in r.stdout.splitlines():
        if m := re.match(r"^(step_s)=([\d.]+)$", line) or re.match(r"^(\S+(?: \([^)]*\))?)\s+([\d.]+)$", line):
            out[m.group(1).split(" ")[0]] = float(m.group(2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", default="math,agent,lora,ppo")
    args = ap.parse_args()
    py, steps = sys.executable, ["--steps", str(args.steps)]
    nano = [py, os.path.join(HERE, "step_time.py"), *steps]
    trl = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    trl += [os.path.join(HERE, "trl_grpo.py"), *steps]
    has_trl = importlib.util.find_spec("trl") is not None
    rows = []
    for part in args.only.split(","):
        shape = "agent" if part == "agent" else "math"
        extra = {"lora": ["--lora"], "ppo": ["--algo", "ppo"]}.get(part, [])
        base = [*nano, "--shape", shape, *extra]
        got = {p: run([*base, "--packing", p]) for p in ("prefix", "none")}
        ref = run([*trl, "--shape", shape]) if has_trl and part in ("math", "agent") else None
        rows.append((part, got, ref))
        print(f"done: {part}", file=sys.stderr, flush=True)
    print(
        "| run | step s (packed) | train s (packed) | step s (unpacked) | train s (unpacked) | train speed-up | "
        "prefix saved | TRL step s | TRL train s | packed step / TRL step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for part, got, ref in rows:
        p, n = got["prefix"], got["none"]
        cells = [
            f"{p['step_s']:.2f}",
            f"{p['timing/train_s']:.2f}",
            f"{n['step_s']:.2f}",
            f"{n['timing/train_s']:.2f}",
            f"{n['timing/train_s'] / p['timing/train_s']:.1f}x",
            f"{p['perf/prefix_saved_frac']:.0%}",
        ]
        if ref:
            cells += [f"{ref['step_s']:.2f}", f"{ref['train_s']:.2f}", f"{p['step_s'] / ref['step_s']:.2f}"]
        else:
            cells += ["–", "–", "–"]
        print(f"| {part} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
