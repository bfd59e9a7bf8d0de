"""Host time to pack one training step's micro-batches, by the attention the rows feed: the dense mask needs the
[R, 1, Lp, Lp] ancestor mask, prefix-grouped attention only the segments (`nanosky/train/packing.py`). On a GPU this
time is spent by the host before each forward and is not hidden behind the GPU's work.

    python bench/pack_time.py [--groups 8] [--group-size 8] [--prompt 512] [--rows 1024 4096 8192 0] [--reps 5]

The workload is bench/gpu_check.py's: GRPO groups of a `prompt`-token prompt and answers of 128-1024 tokens,
micro-batches of 8,192 tokens after sharing. Rows of 0 mean no cap (grouped attention's default). Prints, per row
cap, the median seconds per step of packing alone (what grouped attention pays) and of packing plus the mask (what
the dense mask pays).
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rows", type=int, nargs="+", default=[1024, 4096, 8192, 0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    import torch
    from gpu_check_parts import workload

    from nanosky.train import packing
    from nanosky.train.batch import to_batch
    from nanosky.train.update import OptimConfig, micro_batches, row_ids

    torch.set_num_threads(1)
    trajs = workload(151936, args.groups, args.group_size, args.prompt, (128, 1024))
    batch = to_batch(trajs, 0, torch.device("cpu"))
    print(f"{len(trajs)} sequences, {sum(len(t.ids) for t in trajs)} tokens, micro-batches of 8,192 after sharing")
    print("| rows | packed rows / step | packing s / step | packing + dense mask s / step |")
    print("|---|---|---|---|")
    for cap in args.rows:
        optim = OptimConfig(packing="prefix", micro_batch_tokens=8192, pack_row_tokens=cap)
        mbs = [m for _, m in micro_batches(batch, optim)]
        alone, masked, rows = [], [], 0
        for _ in range(args.reps):
            for out, mask in ((alone, False), (masked, True)):
                t0 = time.perf_counter()
                for m in mbs:
                    _, _, T = m.inputs()
                    p = packing.pack(row_ids(m), T, cap or None)
                    if mask:
                        p.attention_mask  # noqa: B018 -- built on first use
                    rows += p.input_ids.shape[0] if not mask else 0
                out.append(time.perf_counter() - t0)
        print(
            f"| {cap or 'no cap'} | {rows // args.reps} | {statistics.median(alone):.3f} | "
            f"{statistics.median(masked):.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
