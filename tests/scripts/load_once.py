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
    # the sync's bucketed gather (`policy.gathered`) against one full_tensor per parameter: small buckets (several
    # collectives), a bf16 cast of each shard, and shapes whose dim 0 leaves rank 1 fewer rows, or none
    from torch.distributed.tensor import Shard, distribute_tensor

    from nanosky.train.policy import gathered

    odd = [distribute_tensor(torch.arange(15.0).view(3, 5), new.model.embed_tokens.weight.device_mesh, [Shard(0)])]
    odd.append(distribute_tensor(torch.arange(4.0).view(1, 4), odd[0].device_mesh, [Shard(0)]))
    items = [(n, t.to(torch.bfloat16)) for n, t in new.state_dict().items()] + [
        (f"odd{i}", t) for i, t in enumerate(odd)
    ]
    got = list(gathered(items, bucket_bytes=1 << 20))
    gather_checked, gather_diffs = len(got), [n for n, _ in items if n not in dict(got)]
    for (n, t), (m, g) in zip(items, got, strict=True):
        if n != m or not torch.equal(g, t.full_tensor()):
            gather_diffs.append(n)
    grows = [None] * info.world
    torch.distributed.all_gather_object(grows, grow)
    if info.is_main:
        full_mib = sum(t.numel() * 4 for t in old.state_dict().values() if t.dim()) / 2**20
        with open(out, "w") as f:
            res = {"grow_mib": grows, "full_mib": full_mib, "diffs": diffs, "checked": checked, "tied": tied}
            json.dump(res | {"gather_checked": gather_checked, "gather_diffs": gather_diffs}, f)
    dist.barrier()
    dist.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
