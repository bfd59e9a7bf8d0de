"""The one-node shared-memory collectives (`nanosky.train.shared_gather`) against gloo's, on 2 CPU ranks.

    torchrun --nproc_per_node 2 tests/scripts/shared_gather.py OUT.json

Rank 0 writes OUT.json: for each case, what the shared path gave against the process group's result.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

from nanosky.train import shared_gather
from nanosky.train.policy import gathered


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)  # the same weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(12, 7), torch.nn.Tanh(), torch.nn.Linear(7, 5), torch.nn.Linear(5, 3))


def sharded(seed: int, mesh, shared: bool) -> torch.nn.Module:
    m = model(seed)
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(m, mesh=mesh, reshard_after_forward=True)
    if shared:
        modules = [x for x in m if isinstance(x, torch.nn.Linear)] + [m]
        assert shared_gather.share_fsdp_collectives(modules, mesh.get_group())
    return m


def items(m, mesh) -> list:
    """Every parameter (fp32), each cast to bf16 too, and shapes that leave rank 1 fewer rows (3 over 2 ranks) or
    none (1 row)."""
    odd = [distribute_tensor(torch.arange(15.0).view(3, 5), mesh, [Shard(0)])]
    odd.append(distribute_tensor(torch.arange(4.0).view(1, 4), mesh, [Shard(0)]))
    sd = [(n, distribute_tensor(t.full_tensor(), mesh, [Shard(0)])) for n, t in m.state_dict().items()]
    return sd + [(f"{n}.bf16", t.to(torch.bfloat16)) for n, t in sd] + [(f"odd{i}", t) for i, t in enumerate(odd)]


def compare(its, **kw) -> list[str]:
    """The names whose shared gather differs from `full_tensor()` (or is missing)."""
    got = list(gathered(its, bucket_bytes=256, shared=True, **kw))
    bad = [n for (n, t), (m, g) in zip(its, got) if n != m or not torch.equal(g, t.full_tensor())]
    return bad + ([] if len(got) == len(its) else ["<count>"])


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    res: dict = {}

    # 1. the sync's gather: every tensor equal to full_tensor(), through the arena, several buckets and segments
    shared_gather.SEGMENT_BYTES = 1024
    m = sharded(0, mesh, shared=False)
    res["gather_diffs"] = compare(items(m, mesh))
    arena = shared_gather.node_arena(mesh.get_group())
    res["arena"] = arena is not None and not arena.broken
    res["segments"] = len(arena.segments) if arena else 0
    with torch.no_grad():  # a second gather after an update: new values, the same segments
        for p in m.parameters():
            p.add_(1.0)
    res["gather_diffs_after_update"] = compare(items(m, mesh))
    res["segments_after"] = len(arena.segments) if arena else 0

    # 2. FSDP2's all-gather and reduce-scatter through shared memory: the same training step as gloo's
    calls = {"SharedAllGather": 0, "SharedReduceScatter": 0, "staged": 0}
    for cls in (shared_gather.SharedAllGather, shared_gather.SharedReduceScatter):

        def counted(self, *a, _orig=cls.__call__, **k):
            calls[type(self).__name__] += 1
            return _orig(self, *a, **k)

        cls.__call__ = counted
    slot = shared_gather._Staging.slot

    def staged(self, nbytes):  # a call that went through shared memory, not the process group
        out = slot(self, nbytes)
        calls["staged"] += out is not None
        return out

    shared_gather._Staging.slot = staged
    small = shared_gather.SMALL_BYTES
    shared_gather.SMALL_BYTES = 0  # this model's collectives are a few hundred bytes: stage them all
    states = []
    for shared in (False, True):
        net = sharded(1, mesh, shared)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        torch.manual_seed(10 + rank)  # each rank its own batch: the gradients must be reduced
        for _ in range(2):
            net(torch.randn(4, 12)).square().sum().backward()
            opt.step()
            opt.zero_grad()
        states.append({n: t.full_tensor() for n, t in net.state_dict().items()})
    res["fsdp_max_diff"] = max(float((states[0][n] - states[1][n]).abs().max()) for n in states[0])
    res["fsdp_moved"] = max(float((states[1][n] - model(1).state_dict()[n]).abs().max()) for n in states[1])
    res["fsdp_calls"] = dict(calls)
    # at the default threshold, calls this small stay on gloo (its latency beats two ranks' barrier)
    shared_gather.SMALL_BYTES, calls["staged"] = small, 0
    net = sharded(1, mesh, shared=True)
    net(torch.randn(4, 12)).square().sum().backward()
    res["small_staged"] = calls["staged"]

    # 3. ranks that do not share the file (another node, or a container with its own /dev/shm): rank 1 maps a
    # private file instead; every rank must fall back to gloo, alike, and still gather right
    real_from_file, private = torch.from_file, []
    if rank == 1:

        def private_map(path, shared, size, dtype):
            with open(path + ".rank1", "wb") as f:
                f.truncate(size)
            private.append(path + ".rank1")
            return real_from_file(path + ".rank1", shared=shared, size=size, dtype=dtype)

        torch.from_file = private_map
    res["unshared_diffs"], res["unshared_broken"] = fresh_group_gather(m)
    torch.from_file = real_from_file
    for p in private:
        os.unlink(p)

    # 4. no room in /dev/shm (rank 0 cannot reserve): every rank falls back, alike
    real_reserve = shared_gather._reserve
    shared_gather._reserve = lambda nbytes: None
    res["full_diffs"], res["full_broken"] = fresh_group_gather(m)
    shared_gather._reserve = real_reserve

    dist.barrier()
    res["left_in_shm"] = [f for f in os.listdir(shared_gather.DIR) if f.startswith("nanosky-gather-")]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def fresh_group_gather(m) -> tuple[list[str], list[bool]]:
    """The gather's differences on a new group (its own arena), and every rank's `broken` flag after it."""
    mesh = DeviceMesh.from_group(dist.new_group([0, 1]), "cpu")
    diffs = compare(items(m, mesh))
    arena = shared_gather.node_arena(mesh.get_group())
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, arena is not None and arena.broken)
    return diffs, flags


if __name__ == "__main__":
    main(sys.argv[1])
