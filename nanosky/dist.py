"""Distributed setup: the one module that reads torchrun's environment variables.

`init_distributed()` joins the process group (nccl on CUDA, one device per rank; gloo on CPU) before anything else
is built — vLLM's `external_launcher` backend reuses this group, so it must exist before the engine. `python run.py`
is a world of 1 with the same code path (we create a 1-rank group ourselves).
"""

from __future__ import annotations

import datetime
import os
import random
import shutil
import socket
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


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
    if "RANK" not in os.environ:  # plain `python run.py`: a world of one, same code path as torchrun
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        # Two ranks on two cores: one intra-op thread each, or they fight over the cores.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
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


def launch_rank() -> int:
    """This process's rank as set by the launcher (0 for plain `python`), readable before the group exists."""
    return int(os.environ.get("RANK", 0))


_LAUNCH: dict[str, str | None] = {}


def record_launch() -> None:
    """Keep the launch as it was at start-up: torchrun's LOCAL_WORLD_SIZE, and the launcher's own command line.
    vLLM's CPU platform overwrites LOCAL_WORLD_SIZE when the engine starts, and the resume command printed at a
    graceful stop was then `torchrun --nproc_per_node 1` for a 2-rank job. run.py calls this first; later calls
    change nothing."""
    _LAUNCH.setdefault("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_WORLD_SIZE"))
    _LAUNCH.setdefault("launcher", launcher_argv())


def launcher_argv() -> list[str] | None:
    """The command that started this process, up to the script, as the user typed it: the torchrun agent's argv
    (this process's parent, read from /proc) with every rendezvous flag (`--standalone`, `--nnodes`, ...); for plain
    python, the interpreter as typed (`.venv/bin/python`). None where it cannot be read."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # not under torchrun
        return [getattr(sys, "orig_argv", [sys.executable])[0]]
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = [a.decode() for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return None
    tail = len(sys.argv)  # the parent's argv ends with ours: the script, then its flags
    if len(parent) <= tail or parent[-tail:][1:] != sys.argv[1:]:
        return None
    head = parent[:-tail]
    if len(head) > 1 and os.path.basename(head[1]).startswith("torchrun"):
        # `python /path/torchrun ...` is how the kernel runs the torchrun script: show the script
        head = head[1:]
        if shutil.which("torchrun") == os.path.abspath(head[0]):
            head[0] = "torchrun"  # the one on PATH: as typed
    return head


def launch_command() -> list[str] | None:
    """`launcher_argv()` as recorded at start-up."""
    return _LAUNCH["launcher"] if "launcher" in _LAUNCH else launcher_argv()


def launch_local_world() -> int | None:
    """The number of ranks torchrun started on this node (None for plain `python`), as recorded at start-up."""
    n = _LAUNCH["LOCAL_WORLD_SIZE"] if "LOCAL_WORLD_SIZE" in _LAUNCH else os.environ.get("LOCAL_WORLD_SIZE")
    return int(n) if n else None


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


def freeze_heap() -> None:
    """Take every object alive now out of the collector's scans: called once the imports are done and before any
    model loads, it freezes the modules of torch and transformers (~400k objects) and nothing large. vLLM's engine
    start runs three full collections; each then scans only what the run allocated since (0.17 s instead of 0.38 s a
    collection, a rank, on the 2-core CPU)."""
    import gc

    gc.freeze()


def exit_now(code: int = 0) -> None:
    """End a process whose run has closed everything it opened (pools, endpoint, logger, process group): run the
    atexit handlers (vLLM's engine shutdown, logging's flush, a plugin's own), then leave without the interpreter's
    teardown. With torch, vLLM and transformers loaded that teardown is ~2 s of CPU a rank, spent freeing a heap the
    OS frees anyway. vLLM's shutdown hook unfreezes the heap and collects it twice (~0.4 s each a rank): collections
    are made no-ops first, as nothing they would free outlives `os._exit`. Only buffered writes to files never closed
    would be lost: nanosky closes its own."""
    import atexit
    import gc

    gc.disable()
    gc.collect = lambda generation=2: 0
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
