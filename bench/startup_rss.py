"""Host memory at start-up: the policy read once by rank 0 and broadcast (`load_sharded`) vs every rank reading the
whole checkpoint (the loader before issue 45), on a random Qwen2-shaped model, 2 ranks by default.

    python bench/startup_rss.py [--nproc 2] [--params 300]      # millions of parameters, ≥ 300 for the issue

Each way runs in its own torchrun job (peak RSS cannot be reset inside a process). Every rank reports how much its
RSS grew while the policy loaded (peak − before), and the parent samples the sum of the ranks' RSS every 10 ms.
Prints both ways back to back, and as its last line `ratio=<old total peak / new total peak>`.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

from nanosky.precision import decide

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()
    kids = [int(p) for p in out]
    return kids + [g for k in kids for g in _descendants(k)]


def worker(method: str, path: str, out: str) -> None:
    """One rank: load the policy `method`'s way, report the RSS growth."""
    import torch
    from transformers import AutoModelForCausalLM

    from nanosky import dist
    from nanosky.train.policy import load_model, shard_model

    info = dist.init_distributed()
    before = _rss_mib(os.getpid())
    dist.barrier()
    t0 = time.perf_counter()
    if method == "new":
        model = load_model(path, info, precision=decide("fp32", info.device.type))
    else:  # every rank reads the whole checkpoint in fp32, then shards it
        model = shard_model(
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            info,
            precision=decide("fp32", info.device.type),
        )
    dist.barrier()
    secs = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {"rank": info.rank, "grow_mib": peak - before, "load_s": secs}
    rows = [None] * info.world
    torch.distributed.all_gather_object(rows, row)
    if info.is_main:
        full = sum(p.numel() for p in model.parameters()) * 4 / 2**20
        with open(out, "w") as f:
            json.dump({"ranks": rows, "full_mib": full}, f)
    dist.shutdown()


def run(method: str, path: str, nproc: int) -> dict:
    out = tempfile.mktemp(suffix=".json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    cmd += [__file__, "--worker", method, path, out]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak_total = 0.0

    def sample():
        nonlocal peak_total
        while proc.poll() is None:
            peak_total = max(peak_total, sum(_rss_mib(p) for p in _descendants(proc.pid)))
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    err = proc.communicate()[1]
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"{method}: torchrun failed\n{err[-3000:]}")
    with open(out) as f:
        res = json.load(f)
    return res | {"total_peak_mib": peak_total}


def make_model(params_m: int, d: str) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layers = max(2, round(params_m / 12.6))  # hidden 1024 / intermediate 2816 / GQA 16:2 ≈ 12.6M per layer
    cfg = Qwen2Config(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    path = os.path.join(d, "model")
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)  # bf16 on disk, as Qwen ships
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--params", type=int, default=320, help="millions of parameters")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = make_model(args.params, d)
        res = {m: run(m, path, args.nproc) for m in ("old", "new")}
    full = res["new"]["full_mib"]
    print(f"model: {full * 2**20 / 4 / 1e6:.0f}M params, {full:.0f} MiB in fp32; {args.nproc} ranks")
    for m, label in (("old", "every rank reads"), ("new", "rank 0 reads, broadcast")):
        r = res[m]
        grows = " ".join(f"{x['grow_mib']:.0f}" for x in r["ranks"])
        secs = max(x["load_s"] for x in r["ranks"])
        print(
            f"{label:>24}: total peak RSS {r['total_peak_mib']:.0f} MiB | per-rank growth [{grows}] MiB | {secs:.1f} s"
        )
    print(f"ratio={res['old']['total_peak_mib'] / res['new']['total_peak_mib']:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    else:
        main()
