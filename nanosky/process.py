"""The process's life, start to end: what the launcher said, the heap frozen once the imports are done, and an exit
that skips the interpreter's teardown. The one module that reads the launch environment; the rest of nanosky asks
`launch()` (dist.py joins the process group from it).

    process.record_launch()     # run.py's first call: the launch as it was, before vLLM's engine rewrites it
    process.launch().rank       # RANK, WORLD_SIZE, LOCAL_RANK, ... as a frozen `Launch` (a world of 1 under python)
    process.freeze_heap()       # once the imports are done, before any model loads
    process.keep_freed_memory() # CPU ranks: freed tensors' pages reused, not unmapped and faulted again
    process.exit_now(0)         # the atexit handlers, then `os._exit`

A leaf: the standard library only, so that dist.py and precision.py can stand on it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for each rank, and what `dist.init_distributed` sets for a world of one: a child process that
must start its own process group is started without them."""


@dataclass(frozen=True)
class Launch:
    """The launch environment: torchrun's variables (their defaults: plain `python`, a world of one), and the CPU
    flags' override."""

    rank: int = 0  # RANK
    world: int = 1  # WORLD_SIZE
    local_rank: int = 0  # LOCAL_RANK
    local_world: int | None = None  # LOCAL_WORLD_SIZE: the ranks started on this node
    ranked: bool = False  # RANK is set: a launcher (or dist, for a world of one) numbered this process
    torchrun: bool = False  # TORCHELASTIC_RUN_ID is set: torchrun's agent is this process's parent
    cpu_flags: frozenset[str] | None = None  # NANOSKY_CPU_FLAGS (space-separated): stands in for /proc/cpuinfo's


def launch(environ: Mapping[str, str] = os.environ) -> Launch:
    """The launch environment as it is now (read on every call: dist.py fills it in for a world of one, and vLLM's
    engine rewrites LOCAL_WORLD_SIZE; `recorded()` is the launch as it was at start-up)."""
    local_world, flags = environ.get("LOCAL_WORLD_SIZE"), environ.get("NANOSKY_CPU_FLAGS")
    return Launch(
        rank=int(environ.get("RANK", 0)),
        world=int(environ.get("WORLD_SIZE", 1)),
        local_rank=int(environ.get("LOCAL_RANK", 0)),
        local_world=int(local_world) if local_world else None,
        ranked="RANK" in environ,
        torchrun="TORCHELASTIC_RUN_ID" in environ,
        cpu_flags=frozenset(flags.split()) if flags is not None else None,
    )


_RECORDED: tuple[Launch, list[str] | None] | None = None


def record_launch() -> None:
    """Keep the launch as it was at start-up, and the launcher's own command line. vLLM's CPU platform overwrites
    LOCAL_WORLD_SIZE when the engine starts, and the resume command printed at a graceful stop was then
    `torchrun --nproc_per_node 1` for a 2-rank job. run.py calls this first; later calls change nothing."""
    global _RECORDED
    if _RECORDED is None:
        _RECORDED = (launch(), launcher_argv())


def recorded() -> Launch:
    """The launch as `record_launch()` kept it (as it is now, where nothing was recorded)."""
    return _RECORDED[0] if _RECORDED is not None else launch()


def launch_command() -> list[str] | None:
    """`launcher_argv()` as recorded at start-up."""
    return _RECORDED[1] if _RECORDED is not None else launcher_argv()


def launcher_argv() -> list[str] | None:
    """The command that started this process, up to the script, as the user typed it: the torchrun agent's argv
    (this process's parent, read from /proc) with every rendezvous flag (`--standalone`, `--nnodes`, ...); for plain
    python, the interpreter as typed (`.venv/bin/python`). None where it cannot be read."""
    if not launch().torchrun:
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


def freeze_heap() -> None:
    """Take every object alive now out of the collector's scans. Called once the imports are done and before any
    model loads, it freezes the modules of torch and transformers and nothing large: vLLM's engine start runs full
    collections, and each then scans only what the run allocated since (docs/experiments/speed.md)."""
    import gc

    gc.freeze()


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """glibc's malloc from now on serves every allocation from its heap and keeps what is freed (up to 2 GiB free at
    the top) instead of giving it back. By default a large block (over 128 KiB, a threshold that rises to 32 MiB at
    most) is its own mapping, unmapped when freed, so each step's large tensors (gradients, the head's [tokens,
    vocab] chunks, FSDP2's buffers) were fresh pages: a fault and a zeroing per 4 KiB page, every time. Kept, the
    real model's train phase ran 10-21 % faster on a Zen 4 for 0.1 GiB more peak RSS (docs/experiments/speed.md);
    memory freed after the peak is not returned to the OS. CPU ranks only (dist.init_distributed);
    NANOSKY_KEEP_FREED=0 leaves malloc as it is. False where it did not apply (not glibc, or turned off)."""
    if environ.get("NANOSKY_KEEP_FREED", "1") == "0":
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl, macOS: no glibc mallopt
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def exit_now(code: int = 0) -> None:
    """End a process whose run has closed everything it opened (pools, endpoint, logger, process group): run the
    atexit handlers (vLLM's engine shutdown, logging's flush, a plugin's own), then leave without the interpreter's
    teardown, which with torch, vLLM and transformers loaded spends seconds a rank freeing a heap the OS frees
    anyway. vLLM's shutdown hook unfreezes the heap and collects it twice: collections are made no-ops first, as
    nothing they would free outlives `os._exit`. Only buffered writes to files never closed would be lost: nanosky
    closes its own."""
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
