"""`python -m nanosky.view RUN_DIR [--out FILE] [--serve [--host H] [--port P]]` (see `nanosky.view`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated

import tyro

from nanosky.view.data import MAX_MIB


@dataclass
class ViewConfig:
    run_dir: Annotated[str, tyro.conf.Positional]
    """A run directory (rollouts.jsonl) or an eval's output folder (examples.jsonl)."""
    out: str | None = None
    """Where to write the page; default RUN_DIR/view.html."""
    serve: bool = False
    """Serve the page instead, re-read on every load while the run goes on."""
    host: str = "127.0.0.1"
    """The address --serve binds (this machine only, unless told otherwise)."""
    port: int = 8765
    """--serve's port (0: any free one)."""
    max_mb: int = MAX_MIB
    """The most episode data one page embeds, in MiB: past it, older steps lose token values, then steps thin."""


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(ViewConfig, args=argv)
    from nanosky.view import write
    from nanosky.view.server import serve

    try:
        if cfg.serve:
            serve(cfg.run_dir, cfg.host, cfg.port, cfg.max_mb << 20)
            return 0
        dest = write(cfg.run_dir, cfg.out, cfg.max_mb << 20)
    except FileNotFoundError as e:
        print(f"nanosky.view: {e}", file=sys.stderr)
        return 2
    print(f"rollout viewer: {dest}  (open it in a browser; nothing is loaded from the network)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
