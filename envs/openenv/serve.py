"""An OpenEnv app served for one env worker: `python -m envs.openenv.serve APP FD PARENT_PID`, uvicorn on the
listening socket FD its parent bound (no port race); it exits when the parent is gone."""

from __future__ import annotations

import os
import socket
import sys
import time


def _load_app(spec: str):
    """MODULE:ATTR (imported from the run's folder) or FILE.py:ATTR."""
    import importlib
    import importlib.util

    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ValueError(f"OpenEnv app {spec!r}: give MODULE:APP or FILE.py:APP")
    if target.endswith(".py"):
        loader = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(target))[0], target)
        module = importlib.util.module_from_spec(loader)
        sys.modules[loader.name] = module
        loader.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(target)
    return getattr(module, attr)


def serve(app: str, fd: str, parent: str) -> None:
    """The child: uvicorn on the socket the parent bound; it exits when the parent (the env worker) is gone."""
    import threading

    import uvicorn

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    sock = socket.socket(fileno=int(fd))
    config = uvicorn.Config(_load_app(app), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    serve(*sys.argv[1:4])
