"""A one-node CPU all-gather through shared memory. Over gloo, ranks on one machine still send their shards to each
other through loopback TCP (~0.7 GB/s on the 2-core box: 0.75 s to gather a 135M model's fp32 weights, plus a copy
of each tensor out of the gathered buckets). Here every rank maps the same files in /dev/shm instead, writes its own
rows of each tensor straight into the tensor's place, and after a barrier reads the whole tensor in place: one copy
of the rank's own shard, at memory speed.

    arena = node_arena(group)        # None: a group of one, not gloo, or NANOSKY_SHARED_GATHER=0
    arena.start()                    # a collective: every rank done reading the last gather's tensors
    buf = arena.take(nbytes)         # the same bytes on every rank (same calls, same order); None: no
                                     # room, or the ranks share no memory (on every rank alike)
    ...each rank writes its rows into buf...; arena.publish()   # a barrier: every rank's rows are in

The tensors read out are views of the shared memory: valid until the next `start()` (the sync's engine copies each
as it loads). The segments stay mapped for the run and are reused by every gather, so no page is faulted in twice:
the node holds one gathered copy of the weights (in the engine's dtype) for the run, plus FSDP2's staging buffer
(the largest module's gradients, world × world shards). Their files are unlinked as soon as every rank has mapped
them, so nothing is left in /dev/shm however the run ends.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllocMixin

SEGMENT_BYTES = 1 << 20
"""The least a new segment maps: a gather's bucket (up to the world × 64 MB) mostly gets a segment of its own size,
and the next gather's same buckets fit the same segments."""
ALIGN = 64
DIR = "/dev/shm"
_ARENAS: dict[object, SharedArena | None] = {}
_STAGING: dict[object, _Staging] = {}


def aligned(nbytes: int) -> int:
    """`nbytes` rounded up to ALIGN: where the next tensor in a segment may start, for any dtype."""
    return -(-nbytes // ALIGN) * ALIGN


def node_arena(group) -> SharedArena | None:
    """The shared arena of `group` (one per group, made on first use), or None where the gather must stay a
    collective: a group of one, a CUDA backend, or `NANOSKY_SHARED_GATHER=0`. Whether the ranks share memory at all (one
    node, one /dev/shm with room) is tested on each segment as it is mapped (`take`). Every rank of the group
    gets the same answer."""
    if group not in _ARENAS:
        on = (
            dist.get_world_size(group) > 1
            and dist.get_backend(group) == "gloo"
            and os.environ.get("NANOSKY_SHARED_GATHER", "1") != "0"
        )
        _ARENAS[group] = SharedArena(group) if on else None
    return _ARENAS[group]


class SharedArena:
    """Segments of /dev/shm mapped by every rank of `group`, handed out in call order from the start of each gather."""

    def __init__(self, group):
        self.group = group
        self.segments: list[torch.Tensor] = []  # uint8, each mapped shared by every rank
        self.seg, self.used = 0, 0  # the cursor: segment index, bytes used in it
        self.broken = False  # a segment could not be made (no room): every later take is None, on every rank

    def start(self) -> None:
        """Begin a gather: rewind to the first byte, once every rank is done with the last gather's tensors."""
        dist.barrier(group=self.group)
        self.seg, self.used = 0, 0

    def publish(self) -> None:
        """Every rank has written its rows of what it took since the last publish."""
        dist.barrier(group=self.group)

    def take(self, nbytes: int) -> torch.Tensor | None:
        """`nbytes` of shared memory (uint8), the same on every rank; None, on every rank alike, when no segment can
        be made (a full /dev/shm): the caller then gathers over the process group. Collective when it maps a new
        segment."""
        if self.broken:
            return None
        nbytes = aligned(nbytes)
        while self.seg < len(self.segments) and self.used + nbytes > self.segments[self.seg].numel():
            self.seg, self.used = self.seg + 1, 0
        if self.seg == len(self.segments):
            if (segment := self.new_segment(nbytes)) is None:
                return None
            self.segments.append(segment)
        out = self.segments[self.seg][self.used : self.used + nbytes]
        self.used += nbytes
        return out

    def new_segment(self, nbytes: int) -> torch.Tensor | None:
        """A new segment of at least `nbytes` (SEGMENT_BYTES at least), or None, on every rank alike, once one could
        not be made (`broken`). Collective."""
        if self.broken or (segment := self._map(max(SEGMENT_BYTES, nbytes))) is None:
            self.broken = True
            return None
        return segment

    def _map(self, nbytes: int) -> torch.Tensor | None:
        """A new segment, or None on every rank alike. The group's first rank makes the file and reserves its pages (a
        full /dev/shm fails here, not with SIGBUS at the first write) and writes a random token into it; every rank
        maps it and must read that token back (ranks on another node, or in a container with its own /dev/shm, do
        not); then the file is unlinked (the mappings live on)."""
        first = dist.get_global_rank(self.group, 0)
        mine = dist.get_rank() == first
        token = os.urandom(8)
        msg: list = [(_reserve(nbytes), token) if mine else None]
        dist.broadcast_object_list(msg, src=first, group=self.group)
        path, token = msg[0]
        segment = None
        if path is not None:
            try:
                segment = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
                if mine:
                    segment[:8].copy_(torch.frombuffer(bytearray(token), dtype=torch.uint8))
            except (OSError, RuntimeError):
                segment = None
        dist.barrier(group=self.group)  # the token is written
        ok = torch.tensor([segment is not None and bytes(segment[:8].tolist()) == token], dtype=torch.int32)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)
        if mine and path is not None:
            os.unlink(path)
        return segment if ok.item() else None


def _reserve(nbytes: int) -> str | None:
    """A new file of `nbytes` in /dev/shm with its pages reserved, or None where there is no room."""
    try:
        fd, path = tempfile.mkstemp(prefix="nanosky-gather-", dir=DIR)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, nbytes)
        return path
    except OSError:
        os.unlink(path)
        return None
    finally:
        os.close(fd)


SMALL_BYTES = 512 << 10
"""FSDP2 collectives of fewer bytes a rank stay on the process group: there gloo's latency, not its bandwidth, is the
cost (on the 2-core box a barrier took 0.64 ms, an all-gather of 1-256 KB a rank 0.7-1.2 ms, of 1 MB 2.3 ms)."""


class _Staging:
    """Two shared slots for collectives that are done with their buffer when they return (FSDP2's), used in turn, so
    one barrier a call suffices: a rank writes a slot again two calls later, after every rank reached the barrier of
    the call between, that is, after every rank finished reading it. Grown, collectively, to the largest call."""

    def __init__(self, group):
        self.arena = SharedArena(group)  # maps the segments
        self.segment: torch.Tensor | None = None  # the two slots, its halves
        self.calls = 0

    def slot(self, nbytes: int) -> torch.Tensor | None:
        """The next call's `nbytes` (uint8); None on every rank alike where there is no room or no shared memory."""
        if self.segment is None or self.segment.numel() < 2 * aligned(nbytes):
            # a bigger segment (collective, the same sizes on every rank); the smaller one is unmapped
            if (segment := self.arena.new_segment(2 * aligned(nbytes))) is None:
                return None
            self.segment = segment
        at = (self.calls % 2) * (self.segment.numel() // 2)
        self.calls += 1
        return self.segment[at : at + nbytes]


class SharedAllGather(DefaultAllocMixin, AllGather):
    """FSDP2's all-gather (`FSDPModule.set_custom_all_gather`) through node-shared memory: each rank writes its
    shard into the call's slot, a barrier, each reads the others'. Small calls (`SMALL_BYTES`), or no room, go to the
    process group."""

    def __init__(self, staging: _Staging):
        self.staging = staging  # FSDP2's own buffers come from torch.empty (DefaultAllocMixin)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        world, rank = group.size(), group.rank()
        n, item = input_tensor.numel(), input_tensor.element_size()
        buf = self.staging.slot(world * n * item) if n * item >= SMALL_BYTES else None
        if buf is None:
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        slots = buf.view(input_tensor.dtype).view(world, n)
        slots[rank].copy_(input_tensor.reshape(-1))
        dist.barrier(group=group)
        output_tensor.view(world, n).copy_(slots)
        return None


class SharedReduceScatter(DefaultAllocMixin, ReduceScatter):
    """FSDP2's reduce-scatter (`FSDPModule.set_custom_reduce_scatter`, SUM or AVG) through node-shared memory: each
    rank writes its whole input into the call's slot, a barrier, each sums its own chunk of every rank's input in
    rank order. Other reductions, small calls, or no room, go to the process group."""

    def __init__(self, staging: _Staging):
        self.staging = staging  # FSDP2's own buffers come from torch.empty (DefaultAllocMixin)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        world, rank = group.size(), group.rank()
        n, item = output_tensor.numel(), output_tensor.element_size()
        ok = op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) and n * item >= SMALL_BYTES
        buf = self.staging.slot(world * world * n * item) if ok else None
        if buf is None:
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        slots = buf.view(input_tensor.dtype).view(world, world, n)  # [writer, chunk, n]
        slots[rank].copy_(input_tensor.view(world, n))
        dist.barrier(group=group)
        out = output_tensor.view(n)
        out.copy_(slots[0, rank])
        for r in range(1, world):
            out.add_(slots[r, rank])
        if op == dist.ReduceOp.AVG:
            out.div_(world)
        return None


def share_fsdp_collectives(modules, group) -> bool:
    """Route the FSDP2 modules' all-gathers and reduce-scatters through one node-shared staging buffer, where
    `node_arena(group)` allows it (whether the ranks share memory is tested at the first call, and a failure falls
    back to the process group). True where they were routed."""
    if node_arena(group) is None:
        return False
    if group not in _STAGING:  # one buffer for every model on the group: their collectives never overlap
        _STAGING[group] = _Staging(group)
    gather, scatter = SharedAllGather(_STAGING[group]), SharedReduceScatter(_STAGING[group])
    for m in modules:
        m.set_custom_all_gather(gather)
        m.set_custom_reduce_scatter(scatter)
    return True
