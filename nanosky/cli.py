"""run.py's command line: `--preset NAME` picks the base config, `--algo NAME` the algorithm preset, `--plugins`
are imported first, `--env-kwargs` merge over the preset's, and tyro parses every other flag into `TrainConfig`."""

from __future__ import annotations

import copy
import sys

import algos
from nanosky.config import TrainConfig, import_plugins
from nanosky.presets import ENV_PRESETS, PRESETS

MOVED = {
    "probe.skip_sync": "debug.skip-sync",
    "dist.fail_rank": "debug.fail-rank",
    "dist.fail_step": "debug.fail-step",
}
"""Flags that moved: the old spelling fails with the new one's name."""


def _moved_flags(argv: list[str]) -> None:
    for a in argv:
        if a.startswith("--"):
            name = a[2:].partition("=")[0].replace("-", "_")
            if name in MOVED:
                raise SystemExit(
                    f"{a.partition('=')[0]} has moved: use --{MOVED[name]} (a testing-only setting)"
                )


def _env_kwargs_flags(base: TrainConfig, argv: list[str]) -> tuple[TrainConfig, list[str]]:
    """Env kwargs from `--env-kwargs K V [K V ...]` and `--env-kwargs.K V` (K with - or _), merged over the
    preset's. Parsed here, not by tyro: tyro gives a dict with preset keys only per-key flags for those keys, so
    every other key (and the pairs form) would be refused on the presets that set any."""
    extra, rest, i = {}, [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--env-kwargs":
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            pairs = argv[i + 1 : j]
            if len(pairs) % 2:
                raise SystemExit(f"--env-kwargs takes KEY VALUE pairs, got {pairs}")
            extra |= {k.replace("-", "_"): v for k, v in zip(pairs[::2], pairs[1::2])}
            i = j
        elif a.startswith("--env-kwargs."):
            key, eq, value = a[len("--env-kwargs.") :].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{a} needs a value")
                value, i = argv[i + 1], i + 1
            extra[key.replace("-", "_")] = value
            i += 1
        else:
            rest.append(a)
            i += 1
    if extra:
        base = copy.copy(base)
        base.env_kwargs = base.env_kwargs | extra
    return base, rest


def parse_args(argv: list[str] | None = None, console: bool = True) -> TrainConfig:
    """`--preset NAME` picks the base config, `--algo NAME` the algorithm preset, `--plugins` are imported first (so
    their registered names are valid choices); tyro parses every other flag."""
    import argparse

    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    _moved_flags(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=None, choices=sorted(PRESETS))
    pre.add_argument("--algo", default=None)
    known, rest = pre.parse_known_args(argv)
    plugins = argparse.ArgumentParser(
        add_help=False
    )  # --plugins stays in `rest`: tyro records it in the config
    plugins.add_argument("--plugins", nargs="*", default=[])
    import_plugins(plugins.parse_known_args(rest)[0].plugins)  # first: --algo and tyro's checks look names up
    # `--env tool_use` alone starts from that env's preset (its model, context and budgets), as the agent envs need
    # the agent models; an explicit --preset always wins. --env itself is left for tyro to parse.
    env = argparse.ArgumentParser(add_help=False)
    env.add_argument("--env", default=None)
    env_name = env.parse_known_args(rest)[0].env
    preset = known.preset or (env_name if env_name in ENV_PRESETS else "default")
    base = PRESETS[preset]()
    base, rest = _env_kwargs_flags(base, rest)
    if known.algo is not None:
        if known.algo not in algos.PRESETS:
            raise SystemExit(f"--algo: unknown {known.algo!r}; valid: {', '.join(sorted(algos.PRESETS))}")
        # Set fields directly: cross-field checks must see the final flags (tyro re-validates the parsed config).
        base = copy.copy(base)
        base.algorithm = algos.preset(known.algo)
    return tyro.cli(
        TrainConfig,
        default=base,
        args=rest,
        console_outputs=console,
        description="nanosky: agentic RL with torchrun + colocated vLLM + FSDP2. "
        "--algo {" + ",".join(sorted(algos.PRESETS)) + "} picks the algorithm preset; "
        "--preset {"
        + ",".join(sorted(PRESETS))
        + "} picks a base config; --env "
        + "/".join(ENV_PRESETS)
        + " without --preset starts from that env's preset.",
    )
