"""Weights read once (issue 45): every rank's shards from `load_sharded` against the per-rank read it replaced.

    torchrun --nproc_per_node 2 tests/scripts/load_once.py OUT.json MODEL_DIR

Each rank measures its RSS growth while `load_model` runs (rank 0 reads the checkpoint and broadcasts; the others
only receive their shards), then compares every local shard and buffer of the policy and of the critic with the
old way: each rank reading the whole checkpoint and sharding it. Rank 0 writes OUT.json.
"""

import json
import resource
import sys

import torch

from nanosky.precision import decide


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(out: str, path: str) -> None:
    from transformers import AutoModelForCausalLM

    from nanosky import dist
    from nanosky.train.critic import Critic, load_critic
    from nanosky.train.policy import load_model, shard_model

    info = dist.init_distributed()
    import gc

    gc.collect()
    before = rss_mib()
    new = load_model(path, info, precision=decide("fp32", info.device.type))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    grow = peak - before

    old = shard_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        info,
        precision=decide("fp32", info.device.type),
    )
    diffs, checked = [], 0
    for (n, a), (m, b) in zip(new.state_dict().items(), old.state_dict().items(), strict=True):
        assert n == m, (n, m)
        a, b = (x.to_local() if hasattr(x, "to_local") else x for x in (a, b))
        checked += 1
        if not torch.equal(a, b):
            diffs.append(n)
    for (n, a), (_, b) in zip(new.named_buffers(), old.named_buffers(), strict=True):  # RoPE's inv_freq, ...
        checked += 1
        if not torch.equal(a, b):
            diffs.append(n)
    tied = new.lm_head.weight is new.model.embed_tokens.weight
    critic_new, critic_old = (
        load_critic(path, info, precision=decide("fp32", info.device.type)),
        shard_model(Critic(path), info, precision=decide("fp32", info.device.type)),
    )
    for (n, a), (_, b) in zip(critic_new.state_dict().items(), critic_old.state_dict().items(), strict=True):
        checked += 1
        if not torch.equal(a.to_local(), b.to_local()):
            diffs.append("critic." + n)
    grows = [None] * info.world
    torch.distributed.all_gather_object(grows, grow)
    if info.is_main:
        full_mib = sum(t.numel() * 4 for t in old.state_dict().values() if t.dim()) / 2**20
        with open(out, "w") as f:
            json.dump({"grow_mib": grows, "full_mib": full_mib, "diffs": diffs, "checked": checked, "tied": tied}, f)
    dist.barrier()
    dist.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
