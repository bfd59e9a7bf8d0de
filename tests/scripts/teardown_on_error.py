"""One rank trains the smoke preset with an external agent (so the endpoint serves) and an env pool of one worker,
and fails at step 1 on purpose (--debug). Prints, as JSON: what `train` raised, which closes ran, the env-pool
worker processes still alive, and whether the endpoint's port still answers. Run by tests/e2e/test_teardown.py."""

import json
import os
import socket
import sys

from nanosky.cli import parse_args
from nanosky.collect import Rollout
from nanosky.rollout import envpool, loop
from nanosky.trainer import train

closed: list[str] = []
urls: list[str] = []


def spy(cls, name: str, label: str) -> None:
    orig = getattr(cls, name)

    def wrapped(self, *a, **k):
        closed.append(label)
        if label == "rollout":
            urls.append(getattr(self.player, "base_url", ""))
        return orig(self, *a, **k)

    setattr(cls, name, wrapped)


spy(Rollout, "close", "rollout")
spy(loop.RankLoop, "close", "loop")
spy(envpool.EnvPool, "shutdown", "pool")


def children() -> list[str]:
    """Live child processes of this one, as their command lines (the env pool's workers)."""
    me, out = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(status["PPid"]) == me and status["State"].split()[0] != "Z":
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace").strip())
    return out


cfg = parse_args(sys.argv[1:], console=False)
try:
    train(cfg)
    raised = None
except RuntimeError as e:
    raised = str(e)
host, port = urls[0].split("//")[1].split("/")[0].split(":") if urls and urls[0] else ("", "0")
try:
    socket.create_connection((host, int(port)), timeout=2).close()
    answers = True
except OSError:
    answers = False
print(json.dumps({"raised": raised, "closed": closed, "children": children(), "url": urls, "answers": answers}))
