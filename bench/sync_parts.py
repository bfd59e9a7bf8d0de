"""The sync's parts, each timed alone on a built run (no training): the gather (gloo and node-shared memory), vLLM's
reload of tensors already gathered, and the probe's two forwards. Run under torchrun from the repo root:

    torchrun --standalone --nproc_per_node 2 bench/sync_parts.py [--repeat 3] [-- EXTRA RUN.PY FLAGS]

Prints rank 0's best of `--repeat` for each part, in seconds. The probe's trainer forward here runs on parameters a
previous forward left gathered (models under 1B keep them between forward and backward); in a step it follows the
optimizer's resharding and gathers them first.
"""

import argparse
import contextlib
import sys
import tempfile
import time

from launch import ROOT

sys.path.insert(0, ROOT)

import torch  # noqa: E402

from nanosky import process  # noqa: E402

process.record_launch()  # before the engine rewrites LOCAL_WORLD_SIZE

from nanosky.startup import start  # noqa: E402
from nanosky.sync import sync_weights  # noqa: E402
from nanosky.train.lora import iter_merged_params  # noqa: E402
from nanosky.train.policy import token_logprobs  # noqa: E402
from nanosky.trainer import build  # noqa: E402


def best(f, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="more run.py flags (after --)")
    args = ap.parse_args()
    run_dir = tempfile.mkdtemp(prefix="nanosky-sync-parts-")
    argv = ["--preset", "bench", "--model.path", args.model, "--engine.max-model-len", "512"]
    cfg, folders = start([*argv, "--log.run-dir", run_dir, *args.extra])
    with contextlib.ExitStack() as resources:
        run = build(cfg, resources, folders)
        policy, engine, n = run.policy, run.engine, args.repeat
        dtype = getattr(torch, engine.dtype)
        parts = {
            "gather (gloo)": best(lambda: [None for _ in iter_merged_params(policy, dtype)], n),
            "gather (shared memory)": best(lambda: [None for _ in iter_merged_params(policy, dtype, shared=True)], n),
        }
        full = list(iter_merged_params(policy, dtype))
        mbytes = sum(t.numel() * t.element_size() for _, t in full) / 1e6
        parts["vLLM reload of gathered tensors"] = best(lambda: engine.load_weights(iter(full), run.version), n)
        ids = run.probe.current
        x = torch.tensor([ids])
        parts["probe: trainer forward"] = best(lambda: token_logprobs(policy, x, torch.ones_like(x)), n)
        parts["probe: engine prompt log-probs"] = best(lambda: engine.prompt_logprobs(ids), n)
        parts["whole sync (sync_weights)"] = best(lambda: sync_weights(policy, engine, run.version, run.probe), n)
        m = sync_weights(policy, engine, run.version, run.probe)
        parts["  its push (one more sync)"], parts["  its probe"] = m["sync/push_s"], m["sync/probe_s"]
        if run.info.is_main:
            print(
                f"model {args.model}, {run.info.world} ranks, engine {engine.dtype}, {mbytes:.0f} MB a rank, probe "
                f"{len(ids)} tokens; best of {n}, rank 0:"
            )
            for name, s in parts.items():
                print(f"  {name:34s} {s:.3f} s")


if __name__ == "__main__":
    main()
