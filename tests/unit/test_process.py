"""The process's life (nanosky/process.py): the launch environment read in one place, the launch kept as it was at
start-up, the heap frozen, and an exit that runs the atexit handlers and nothing else."""

import subprocess
import sys
import textwrap

from nanosky import process
from nanosky.process import Launch, launch

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}


def test_plain_python_is_a_world_of_one():
    assert launch({}) == Launch(rank=0, world=1, local_rank=0, local_world=None, ranked=False, torchrun=False)
    assert launch({"PATH": "/bin"}).cpu_flags is None  # no override: /proc/cpuinfo's flags


def test_torchruns_variables_are_read_as_numbers():
    at = launch(TORCHRUN)
    assert (at.rank, at.world, at.local_rank, at.local_world) == (3, 4, 1, 2)
    assert at.ranked and at.torchrun
    assert launch({"RANK": "0", "WORLD_SIZE": "1"}) == Launch(ranked=True)  # set, but not by torchrun's agent


def test_the_cpu_flags_override_is_a_set_of_words_and_empty_means_none():
    assert launch({"NANOSKY_CPU_FLAGS": " avx2  fma "}).cpu_flags == frozenset({"avx2", "fma"})
    assert launch({"NANOSKY_CPU_FLAGS": ""}).cpu_flags == frozenset()  # an override naming no flags: not /proc's


def test_launch_reads_the_environment_now_and_the_record_keeps_the_first(monkeypatch):
    """vLLM's engine rewrites LOCAL_WORLD_SIZE; `recorded()` answers as at start-up, `launch()` as now."""
    monkeypatch.setattr(process, "_RECORDED", None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert process.recorded().local_world == 2  # nothing recorded yet: as now
    process.record_launch()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    process.record_launch()
    assert process.recorded().local_world == 2 and launch().local_world == 1


def test_exit_now_runs_the_atexit_handlers_flushes_and_keeps_the_status():
    """run.py's last line (`process.exit_now`): leaving without the interpreter's teardown must still run every
    atexit handler (vLLM's, logging's, a plugin's), flush what was written and unflushed, and exit with the given
    status."""
    code = textwrap.dedent(
        """
        import atexit, sys
        from nanosky.process import exit_now
        atexit.register(lambda: print("handler ran"))
        sys.stdout.write("written, not flushed | ")
        exit_now(3)
        print("never")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert r.stdout == "written, not flushed | handler ran\n"


def test_exit_now_spends_nothing_on_garbage_collection():
    """vLLM's shutdown hook unfreezes the heap and collects it twice: under `exit_now` a handler's collection must
    not run, since `os._exit` frees it all."""
    code = textwrap.dedent(
        """
        import atexit, gc
        from nanosky.process import exit_now, freeze_heap
        freeze_heap()
        assert gc.get_freeze_count() > 0
        gc.callbacks.append(lambda phase, info: print(phase, info["generation"]) if phase == "start" else None)
        gc.collect()  # before exit_now: a real collection, seen by the callback
        atexit.register(lambda: (gc.unfreeze(), gc.collect(), print("handler ran")))  # what vLLM's hook does
        exit_now(0)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "start 2\nhandler ran\n", r.stdout


def test_the_suite_runs_with_the_heap_frozen():
    """tests/conftest.py freezes the heap before each test through `process.freeze_heap`, as run.py does after its
    imports."""
    import gc

    assert gc.get_freeze_count() > 0


def test_a_cpu_rank_reuses_the_pages_of_a_freed_large_block():
    """With `keep_freed_memory()` (a CPU rank's default) a freed 64 MiB block is served again from the heap: its
    second allocation faults in almost no page. glibc's default (NANOSKY_KEEP_FREED=0) maps such a block on its own
    and unmaps it when freed, so every allocation faults all of its 16k pages in again."""
    script = textwrap.dedent(
        """
        import resource, sys
        from nanosky import process
        print(process.keep_freed_memory({"NANOSKY_KEEP_FREED": sys.argv[1]}))
        def faults():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            x = b"x" * (64 << 20)  # malloc'd and written: every page touched
            after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            del x
            return after - before
        print(faults(), faults())
        """
    )
    got = {}
    for keep in ("1", "0"):
        r = subprocess.run([sys.executable, "-c", script, keep], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        applied, first, second = r.stdout.split()
        got[keep] = (applied, int(first), int(second))
    # against the first allocation's own faults: 16384 pages of 4 KiB, or ~32 where the kernel backs it with 2 MiB
    # transparent huge pages
    applied, first, second = got["1"]
    assert applied == "True" and second < first / 4  # the freed block's pages, reused
    applied, first, second = got["0"]
    assert applied == "False" and second > first / 2  # turned off: mapped and faulted in afresh
    assert not process.keep_freed_memory({"NANOSKY_KEEP_FREED": "0"})  # turned off
