"""Where a step's train and sync phases spend their time: one step of `bench/step_time.py`'s shape run under
`--log.profile-step`, each rank's operator self times grouped into parts.

    python bench/profile_step.py [--model smollm2-135m] [--prompts 8] [--step 3] [-- EXTRA RUN.PY FLAGS]
    python bench/profile_step.py --run-dir DIR --step 3      # a run already profiled

Parts: matmuls (forward and backward), attention, the chunked LM head (every op under it, its matmuls too), dtype
casts and copies, collectives (FSDP2's all-gather / reduce-scatter, gloo), the optimizer step, the rest (norms,
activations, other elementwise ops), and "outside ops": the phase's wall time that no operator covers (Python between
them). Self times: an op's time minus its child ops', so nothing counts twice.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
from collections import defaultdict

from launch import run_py
from shapes import MAX_TOTAL, SYSTEM

HEAD = ("nanosky::head", "TargetLogprobs")  # the chunked head's forward range and its backward node
OPTIM = ("Optimizer.step", "Optimizer.zero_grad")
COLLECTIVE = re.compile(
    r"FSDP::all_gather|FSDP::post_backward|reduce_scatter|all_gather|broadcast|all_reduce|gloo|c10d"
)
MATMUL = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_weight_int4pack_mm|mkldnn_.*linear)$")
ATTENTION = re.compile(r"scaled_dot_product|flash_attention|_efficient_attention|softmax_backward_data|aten::_softmax$")
CAST = re.compile(r"^aten::(_to_copy|to|copy_|_copy_from|_copy_from_and_resize|clone|contiguous)$")
PARTS = ("matmul", "attention", "head", "cast/copy", "collective", "optimizer", "elementwise/other", "outside ops")


def self_times(events: list[dict]) -> list[tuple[dict, float, list[str]]]:
    """(event, self µs, names of the ranges around it) for every complete CPU event, per thread."""
    by_tid = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "python_function", None):
            by_tid[(e.get("pid"), e.get("tid"))].append(e)
    out = []
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [event, children's µs]
        for e in evs:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                done = stack.pop()
                out.append((done[0], done[0]["dur"] - done[1], [s[0]["name"] for s in stack]))
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0])
        while stack:
            done = stack.pop()
            out.append((done[0], done[0]["dur"] - done[1], [s[0]["name"] for s in stack]))
    return out


def part_of(name: str, outer: list[str]) -> str:
    around = " ".join(outer)
    if any(h in around or h in name for h in HEAD):
        return "head"
    if any(o in around or o in name for o in OPTIM):
        return "optimizer"
    if COLLECTIVE.search(name) or COLLECTIVE.search(around):
        return "collective"
    if ATTENTION.search(name) or ATTENTION.search(around):
        return "attention"
    if MATMUL.match(name):
        return "matmul"
    if CAST.match(name):
        return "cast/copy"
    return "elementwise/other"


def breakdown(trace: str, wall_s: float | None) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Seconds by part, and the top ops by self time, of one rank's phase trace."""
    events = json.load(open(trace))["traceEvents"]
    parts, ops = defaultdict(float), defaultdict(float)
    for e, us, outer in self_times(events):
        if e.get("cat") != "cpu_op":  # a range's own time is the Python inside it: counted as outside ops
            continue
        parts[part_of(e["name"], outer)] += us / 1e6
        ops[e["name"]] += us / 1e6
    if wall_s is not None:
        parts["outside ops"] = max(0.0, wall_s - sum(parts.values()))
    return dict(parts), sorted(ops.items(), key=lambda kv: -kv[1])[:12]


def wall_time(run_dir: str, step: int, phase: str) -> float | None:
    from launch import scalars

    for s, v in scalars(run_dir).get(f"timing/{phase}_s", []):
        if s == step:
            return v
    return None


def report(run_dir: str, step: int) -> None:
    for phase in ("train", "sync", "logprob"):
        traces = sorted(glob.glob(os.path.join(run_dir, "profile", f"step{step}.rank*.{phase}.trace.json")))
        if not traces:
            continue
        wall = wall_time(run_dir, step, phase)
        print(f"\n{phase} phase, step {step}: {wall:.3f} s wall (rank 0)" if wall else f"\n{phase} phase, step {step}")
        for t in traces:
            rank = re.search(r"rank(\d+)", t).group(1)
            parts, top = breakdown(t, wall)
            total = sum(parts.values())
            print(f"  rank {rank}: " + ", ".join(f"{p} {parts.get(p, 0):.3f} s" for p in PARTS))
            if rank == "0":
                print("  " + " | ".join(f"{p} {100 * parts.get(p, 0) / total:.0f} %" for p in PARTS))
                print("  top ops (rank 0, self s): " + ", ".join(f"{n} {s:.3f}" for n, s in top))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--step", type=int, default=3, help="the profiled step (the first pays vLLM's warm-up)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--run-dir", help="report on this run (profiled at --step) instead of launching one")
    ap.add_argument("extra", nargs="*", help="more run.py flags (after --)")
    args = ap.parse_args()
    if args.run_dir is None:
        args.run_dir = tempfile.mkdtemp(prefix="nanosky-profile-")
        flags = ["--preset", "bench", "--steps", str(args.step), "--model.path", args.model]
        flags += ["--log.run-dir", args.run_dir, "--log.profile-step", str(args.step)]
        flags += ["--env-kwargs", "system_prompt", json.dumps(SYSTEM["math"])]
        flags += ["--rollout.max-total-tokens", str(MAX_TOTAL["math"]), "--engine.max-model-len", "512"]
        flags += ["--rollout.prompts-per-step", str(args.prompts), "--optim.no-skip-zero-adv"]
        flags += ["--optim.micro-batch-size", str(args.prompts * 8 // (2 * args.nproc)), *args.extra]
        r = run_py(args.nproc, flags)
        if r.returncode != 0:
            sys.exit(r.stderr[-4000:])
        print(f"run dir {args.run_dir}")
    report(args.run_dir, args.step)


if __name__ == "__main__":
    main()
