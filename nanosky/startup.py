"""run.py's start: parse the flags and run the start-up checks on every rank, before any model or engine exists. A bad
input is one line, printed once, and every rank exits with status 2.

    cfg, folders = startup.start()   # or: "nanosky: --rollout.group-size must be >= 2 ..." on stderr, exit 2

Under torchrun every rank checks the same flags and files, so every rank fails alike, and whichever exits first
makes torchrun kill the rest: a rank-0-prints rule alone would lose the line whenever another rank won that race.
So the ranks meet first. Each one joins the process group (the one the run would use next anyway), the ranks
all-gather their verdicts, rank 0 prints the first error (its own, else the lowest failing rank's, naming it),
and only after a barrier does any rank exit. torchrun then adds its own report of the failed ranks
("ChildFailedError ... exitcode: 2") and exits 1. nanosky's line comes first, after torchrun's launch banner.
"""

from __future__ import annotations

import sys

from nanosky import dist, preflight, process
from nanosky.bundled import Folders
from nanosky.cli import flag_names, parse_args
from nanosky.config import TrainConfig


def check(argv: list[str] | None, world: int, console: bool) -> tuple[TrainConfig, Folders]:
    """Parse and check: the config and its model folders, resolved (what the trainer loads), or a UsageError naming
    the flag. `world`: the launch's world size."""
    cfg = parse_args(argv, console=console)
    try:
        cfg.validate_for_world(world)
    except ValueError as e:
        raise preflight.UsageError(flag_names(str(e))) from None
    return cfg, preflight.check(cfg, world)


def start(argv: list[str] | None = None) -> tuple[TrainConfig, Folders]:
    process.record_launch()  # the launch geometry, before the engine can change the environment
    launch = process.launch()
    rank, world = launch.rank, launch.world
    error, cfg, folders = None, None, None
    try:
        cfg, folders = check(argv, world, console=rank == 0)
    except preflight.UsageError as e:
        error = str(e)
    except SystemExit as e:  # --help (0), or a parse failure tyro printed itself on rank 0 (2)
        if e.code in (0, None) or world == 1:
            raise
        error = ""
    if world > 1:  # meet before anyone exits (see the module docstring)
        dist.init_distributed(timeout_s=cfg.dist.timeout_s if cfg else 600.0)
        verdicts = dist.all_gather_objects(error)
        failed = [r for r, v in enumerate(verdicts) if v is not None]
        if failed:
            first = failed[0]
            if rank == 0 and verdicts[first]:
                where = "" if first == 0 else f" (rank {first})"
                print(f"nanosky{where}: {verdicts[first]}", file=sys.stderr, flush=True)
            dist.barrier()
            dist.shutdown()
            sys.exit(2)
    elif error is not None:
        print(f"nanosky: {error}", file=sys.stderr, flush=True)
        sys.exit(2)
    if rank == 0 and (warning := preflight.bf16_warning(cfg)):  # bf16 where it is emulated: said once, up front
        print(f"nanosky: {warning}", flush=True)
    if cfg.log.overwrite:  # every rank passed: only now does the earlier run move
        moved = preflight.move_aside(cfg.run_dir) if rank == 0 else None
        if moved:
            print(f"nanosky: moved the earlier run in {cfg.run_dir} to {moved} (--log.overwrite)", flush=True)
        if world > 1:
            dist.barrier()
    return cfg, folders
