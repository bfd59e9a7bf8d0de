"""The families matrix in bf16 (`--precision bf16`'s numerics), one process: for every exact family of
tests/families.py (tiny, random weights) and the bundled model, the packed-vs-unpacked gap under bf16 rounding, the
trainer-vs-engine build gap (both in bf16, the same weights), and the gap after every weight is scaled by 1.1 and
synced (the bf16 gather, LoRA-free). Prints a markdown table (docs/gpu.md cites it).

    python bench/families_bf16.py [--only qwen2,mistral_swa]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile

import torch
from torch.distributed.fsdp import FSDPModule

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from families import FAMILIES, build  # noqa: E402

from nanosky import dist  # noqa: E402
from nanosky.bundled import resolve_model_path  # noqa: E402
from nanosky.precision import Precision  # noqa: E402
from nanosky.rollout.engine import Engine, EngineConfig  # noqa: E402
from nanosky.sync import probe_diffs  # noqa: E402
from nanosky.train import packing  # noqa: E402
from nanosky.train.lora import iter_merged_params  # noqa: E402
from nanosky.train.policy import load_model  # noqa: E402

BF16 = Precision("bf16", "cpu", "bench")


def one(family: str, out: str, info) -> dict:
    path = resolve_model_path("tiny") if family == "tiny" else build(family, out)
    policy = load_model(path, info, precision=BF16)
    try:
        packed = packing.verify(policy, packing.lm_forward(policy), tol=BF16.build_tol)
    except packing.PackingUnsupported as e:
        packed = f"refused: {e}"
    engine = Engine(
        EngineConfig(kv_cache_gib=1, max_model_len=256, max_batched_tokens=256, seed=0), path, info, precision=BF16
    )
    try:
        ids = torch.randint(3, policy.config.vocab_size, (80,), generator=torch.Generator().manual_seed(1)).tolist()
        build_gap = probe_diffs(policy, engine, ids, info.device)
        for m in policy.modules():  # the probe's forward left the bf16 copies gathered: change the fp32 masters
            if isinstance(m, FSDPModule):
                m.reshard()
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(1.1)
        stale = probe_diffs(policy, engine, ids, info.device)
        engine.load_weights(iter_merged_params(policy, torch.bfloat16), version=1)
        after = probe_diffs(policy, engine, ids, info.device)
    finally:
        del engine
        gc.collect()
    return {"packed": packed, "build": build_gap, "stale": stale, "after": after}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated families (default: all exact ones and tiny)")
    args = ap.parse_args()
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29541", "RANK": "0", "WORLD_SIZE": "1"})
    os.environ.setdefault("LOCAL_RANK", "0")
    info = dist.init_distributed(600)
    names = args.only.split(",") if args.only else [*sorted(FAMILIES), "tiny"]
    rows = []
    with tempfile.TemporaryDirectory() as out:
        for f in names:
            r = one(f, out, info)
            packed = r["packed"] if isinstance(r["packed"], str) else f"{r['packed']:.3f}"
            rows.append(
                f"| {f} | {packed} | {r['build'].mean():.5f} / {r['build'].max():.3f} | "
                f"{r['stale'].mean():.3f} | {r['after'].mean():.5f} / {r['after'].max():.3f} |"
            )
            print(rows[-1], flush=True)
    print(
        "\n| family | packed vs unpacked, max | build gap, mean / max | stale engine, mean | after sync, mean / max |"
    )
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
