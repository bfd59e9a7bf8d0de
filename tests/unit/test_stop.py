"""Graceful stop (nanosky/stop.py): a signal is noted and answered after the step, repeats within the debounce
count once, a later one stops at once; the resume command. The 2-rank stop + resume runs in test_resume.py."""

import os
import signal
import subprocess
import sys
import textwrap

from nanosky.stop import resume_command

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    from nanosky.stop import GracefulStop

    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a shell's background job
    with GracefulStop(debounce_s=0.5) as stop:
        assert not stop.requested()
        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C: noted, not fatal
        os.kill(os.getpid(), signal.SIGINT)   # torchrun's forwarded copy, within the debounce: the same stop
        time.sleep(0.1)
        print("alive", stop.requested(), stop.name, flush=True)
        if sys.argv[1] == "twice":
            time.sleep(0.6)
            os.kill(os.getpid(), signal.SIGTERM)  # a deliberate second signal: at once, even from a blocked main
            time.sleep(30)                        # the main thread waiting, as in a collective (GIL released)
            print("not reached", flush=True)
    assert signal.getsignal(signal.SIGINT) is before  # restored on exit
    print("restored", flush=True)
    """
)


def _run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60, cwd=os.getcwd()
    )


def test_a_signal_is_answered_after_the_step_and_a_second_one_stops_at_once():
    r = _run("once")
    assert r.returncode == 0, r.stderr
    assert "nanosky: SIGINT: stopping after this step" in r.stdout
    assert r.stdout.count("stopping after this step") == 1  # the repeat within the debounce is the same stop
    assert "alive True SIGINT" in r.stdout and "restored" in r.stdout
    r = _run("twice")  # stopped during the main thread's 30 s wait, not after it: "not reached" is never printed
    assert r.returncode == 128 + signal.SIGTERM and "not reached" not in r.stdout, (r.returncode, r.stdout)
    assert "SIGTERM again: stopping now" in r.stdout


def test_resume_command_repeats_the_flags_with_resume_latest(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["run.py"])
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert resume_command(["--env", "math", "--resume", "step_2"]) == "python run.py --env math --resume latest"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cmd = resume_command(["--resume=latest", "--log.run-dir", "runs/a b"])
    assert cmd == "torchrun --nproc_per_node 2 run.py --log.run-dir 'runs/a b' --resume latest"


def test_the_launch_geometry_is_read_once_at_start_up(monkeypatch):
    """vLLM's CPU platform rewrites LOCAL_WORLD_SIZE when the engine starts; the resume command keeps what the
    launcher set."""
    from nanosky import process

    monkeypatch.setattr(process, "_RECORDED", None)
    monkeypatch.setattr(sys, "argv", ["run.py"])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    process.record_launch()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # what the engine leaves behind
    process.record_launch()  # a second call (train() after run.py) keeps the first
    assert resume_command(["--env", "math"]) == "torchrun --nproc_per_node 2 run.py --env math --resume latest"
