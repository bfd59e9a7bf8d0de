"""Distributed setup: the process group, and the rank's facts every other module asks for.

`init_distributed()` joins the process group (nccl on CUDA, one device per rank; gloo on CPU) before anything else
is built — vLLM's `external_launcher` backend reuses this group, so it must exist before the engine. `python run.py`
is a world of 1 with the same code path (we create a 1-rank group ourselves). The launch environment it joins from
is read by `nanosky.process`.
"""

from __future__ import annotations

import datetime
import os
import random
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nanosky import process


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


_INFO: DistInfo | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(timeout_s: float = 600.0) -> DistInfo:
    """Join (or create) the process group. Idempotent. `timeout_s` bounds every collective."""
    global _INFO
    if _INFO is not None:
        return _INFO
    if not process.launch().ranked:  # plain `python run.py`: a world of one, same code path as torchrun
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    launch = process.launch()
    rank, world, local_rank = launch.rank, launch.world, launch.local_rank
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        # Two ranks on two cores: one intra-op thread each, or they fight over the cores.
        local_world = launch.local_world or world
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        process.keep_freed_memory()  # a step's large tensors reuse freed pages (NANOSKY_KEEP_FREED=0: not)
    # In-process vLLM engine core: colocation needs the engine in this process, and it keeps vLLM from spawning.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    _INFO = DistInfo(rank, world, local_rank, device, backend)
    return _INFO


def is_initialized() -> bool:
    """Whether init_distributed() has run in this process."""
    return _INFO is not None


def get_info() -> DistInfo:
    if _INFO is None:
        raise RuntimeError("init_distributed() has not been called")
    return _INFO


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def barrier() -> None:
    dist.barrier()


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (pickled; fine for trajectories at our scale)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=get_info().device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(values: list[float]) -> list[float]:
    """Element-wise max over ranks (the values themselves outside a process group)."""
    if not is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=get_info().device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def memory_gib() -> float:
    """Peak memory since the last call: device memory on GPU, process RSS high-water mark on CPU (GiB)."""
    if get_info().is_cuda:
        peak = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux; monotonic on CPU


def shutdown() -> None:
    global _INFO
    import sys

    if "vllm" in sys.modules:
        # vLLM's engine holds sub-groups of our process group: tear those down first, or its exit hook fails on a
        # group that no longer exists.
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    if dist.is_initialized():
        dist.destroy_process_group()
    _INFO = None
