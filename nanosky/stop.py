"""Graceful stop: SIGINT (Ctrl-C) or SIGTERM (a cluster's pre-emption) finishes the current step, writes a checkpoint,
prints the resume command and exits 0; a second signal stops at once.

    with GracefulStop() as stop:
        for step in ...:
            if stop.requested():          # a collective: every rank calls it before every step
                ...checkpoint the last step, print resume_command(), return
            ...one step...

Under torchrun a signal can reach the ranks unevenly: a Ctrl-C reaches every rank twice (from the terminal, then
forwarded by torchrun), and a scheduler may signal only some. So repeats within `debounce_s` count as one, and
`requested()` all-reduces the flag so that every rank stops after the same step. torchrun itself also catches the
signal: it waits `--shutdown-timeout` seconds (default 30) for the ranks before killing them, and then exits
non-zero with its own "got signal" traceback whatever the ranks did; give it more time when a step takes longer.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time

from nanosky import dist, process

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """Signals are read by a watcher thread through `signal.set_wakeup_fd`, not acted on in the Python handler: the
    main thread can be blocked in C++ (a collective, a CUDA call) for as long as a step lasts, and a Python handler
    would run only after that, so "at once" would not be."""

    def __init__(self, debounce_s: float = 2.0, announce: bool = True):
        self.debounce_s, self.announce = debounce_s, announce
        self.signum, self._t, self._prev, self._fds = 0, 0.0, {}, None

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is not threading.main_thread():  # signals are the main thread's to set
            return self
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._fds = (r, w)
        self._prev_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        # The handler only keeps the default actions (exit, KeyboardInterrupt) from running; _watch decides.
        self._prev = {s: signal.signal(s, lambda *_: None) for s in SIGNALS}
        threading.Thread(target=self._watch, args=(r,), daemon=True, name="nanosky-stop").start()
        return self

    def __exit__(self, *exc) -> None:
        if self._fds is None:
            return
        for s, h in self._prev.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(self._prev_fd)
        os.close(self._fds[1])  # the watcher reads EOF and ends; it closes the read end
        self._prev, self._fds = {}, None

    def _watch(self, r: int) -> None:
        while data := os.read(r, 64):
            for signum in data:
                if signum in SIGNALS:
                    self._on_signal(signum)
        os.close(r)

    def _on_signal(self, signum: int) -> None:
        now, name = time.monotonic(), signal.Signals(signum).name
        if signum == signal.SIGTERM and _local_rank_died():  # torchrun ending a failed job: nothing to finish
            os._exit(128 + signum)
        if not self.signum:
            self.signum, self._t = signum, now
            if self.announce:
                print(f"nanosky: {name}: stopping after this step (send it again to stop at once)", flush=True)
        elif now - self._t > self.debounce_s:  # a second, deliberate signal
            print(f"nanosky: {name} again: stopping now", flush=True)
            os._exit(128 + signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def requested(self) -> bool:
        """Whether any rank got a signal. A collective when distributed: every rank calls it at the same point."""
        if dist.is_initialized() and dist.get_info().world > 1:
            got = dist.all_reduce_sum([float(self.signum != 0)])[0] > 0
            if got and not self.signum:
                self.signum = signal.SIGTERM  # another rank's signal: stop with it
            return got
        return self.signum != 0


def _local_rank_died() -> bool:
    """Whether a sibling worker of this torchrun agent is gone: torchrun then SIGTERMs the others, which may be
    blocked in a collective with the dead rank and could never finish their step."""
    n = process.recorded().local_world or 1
    if n <= 1 or not os.path.isdir("/proc"):
        return False
    parent, alive = os.getppid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # state, ppid, ...
        except (OSError, IndexError):
            continue
        alive += int(fields[1]) == parent and fields[0] != b"Z"
    return alive < n


def resume_command(argv: list[str] | None = None) -> str:
    """The command that continues this run: the same launcher as typed (torchrun with its `--nproc_per_node`,
    `--nnodes` and rendezvous flags, or the python that ran it, by path when it was run by path) and the same flags
    with `--resume latest`. A multi-node job prints node 0's command: each node reruns its own with `--resume
    latest` added."""
    args, skip = [], False
    for a in sys.argv[1:] if argv is None else argv:
        if skip:
            skip = False
        elif a == "--resume":
            skip = True
        elif not a.startswith("--resume="):
            args.append(a)
    script = shlex.quote(sys.argv[0] if sys.argv and sys.argv[0] else "run.py")
    launcher = process.launch_command() if argv is None else None
    if launcher:
        launch = " ".join([*map(shlex.quote, launcher), script])
    else:  # no /proc, or flags given by a caller: the geometry alone
        nproc = process.recorded().local_world
        launch = f"torchrun --nproc_per_node {nproc} {script}" if nproc else f"python {script}"
    return " ".join([launch, *map(shlex.quote, args), "--resume", "latest"])
