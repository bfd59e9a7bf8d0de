"""The worker side of the env pool (`envpool.py`): what runs inside each spawned env process. It builds envs on
request, resets and steps them, replays a lost worker's envs from their action logs (checked against digests of
the original results), and closes each env when its episode ends or the worker stops. The parent never imports an
env's code into its own process for a pooled env; a worker process imports only this module and `envs`.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from typing import Any

import envs
from envs.base import StepResult


def digest(result: Any) -> str:
    """Fingerprint of what the agent saw from a reset/step (not `info`: it may hold latencies)."""
    if isinstance(result, StepResult):
        result = [result.observations, result.reward, result.done]
    return hashlib.sha1(json.dumps(result, sort_keys=True, default=repr).encode()).hexdigest()


def describe(env) -> tuple[list[dict], int]:
    return [t.schema for t in env.tools], int(env.max_turns)


def build(spec: tuple) -> Any:
    name, factory, split, seed, kwargs = spec
    envs.register_env(name)(factory)  # user-registered envs are unknown to a freshly spawned interpreter
    return envs.make(name, split=split, seed=seed, **kwargs)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)  # its envs' stdio servers see EOF and exit; OpenEnv app servers watch this worker the same way


def worker_main(conn) -> None:
    """Serve (op, handle, payload) requests until "stop" or the parent goes away."""
    # Ctrl-C and a scheduler's SIGTERM are the parent's to handle (it finishes its step, which needs these envs);
    # a worker ends with its parent (EOF on the pipe) or by SIGKILL from the pool; and, should the parent die while
    # this worker is busy in an env (starting servers, a long step), by the watch below: an orphaned worker would
    # keep its envs' servers and processes alive.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    conn.send(("ready", os.getpid()))
    live: dict[int, Any] = {}
    while True:
        try:
            op, handle, payload = conn.recv()
        except (EOFError, OSError):
            op = "stop"
        if op == "stop":  # the envs still open release what they hold before the worker goes
            for env in live.values():
                close_env(env)
            return
        if op == "close":
            close_env(live.pop(handle, None))
            continue
        try:
            if op == "make":
                live[handle] = build(payload)
                reply = ("ok", describe(live[handle]))
            elif op == "reset":
                reply = ("ok", live[handle].reset())
            elif op == "step":
                reply = ("ok", live[handle].step(payload))
            elif op == "state_key":
                reply = ("ok", live[handle].state_key())
            elif op == "action_constraint":
                reply = ("ok", live[handle].action_constraint())
            elif op == "expert_action":
                reply = ("ok", live[handle].expert_action())
            elif op == "replay":  # payload: (spec, log) -> digest of every reset (None) / step (action)
                spec, log = payload
                env = live[handle] = build(spec)
                reply = ("ok", [digest(env.reset() if a is None else env.step(a)) for a in log])
            else:
                reply = ("env_error", f"unknown op {op!r}")
        except BaseException as e:  # noqa: BLE001 - anything an env does must stay in this process
            reply = ("raise", e) if op == "make" else ("env_error", f"env raised in {op}: {e!r}"[:500])
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable result or exception
            conn.send(("env_error", f"{op} result could not be sent to the parent: {e!r}"[:500]))


def close_env(env) -> None:
    """`env.close()`, never raising: a failing close costs nothing but its own clean-up."""
    if env is not None:
        try:
            env.close()
        except Exception:  # noqa: BLE001
            pass
