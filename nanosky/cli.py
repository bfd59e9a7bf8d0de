"""run.py's command line: `--preset NAME` picks the base config, `--algo NAME` the algorithm preset, `--plugins`
are imported first, `--env-kwargs` merge over the preset's, and tyro parses every other flag into `TrainConfig`.

Every bad input raises `UsageError` with one line that names the flag as the user types it (`--rollout.group-size`,
not `rollout.group_size`): nanosky's own checks, and tyro's parse failures (unknown flags, bad values, a config's
`__post_init__` check), which a tyro hook turns into the same one line."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import importlib.util
import re
import sys

import algos
from nanosky.config import TrainConfig, import_plugins
from nanosky.preflight import UsageError
from nanosky.presets import ENV_PRESETS, PRESETS

_CORRECTION = "--algorithm.rollout-correction tis|mis|seq-tis|seq-mis|off|auto"
MOVED = {
    "probe.skip_sync": "--debug.skip-sync (a testing-only setting)",
    "dist.fail_rank": "--debug.fail-rank (a testing-only setting)",
    "dist.fail_step": "--debug.fail-step (a testing-only setting)",
    "algorithm.rollout_correction_level": f"{_CORRECTION} (seq- is the sequence level)",
    "algorithm.rollout_correction_mode": f"{_CORRECTION} (tis truncates, mis masks)",
    "algorithm.rollout_correction_threshold": "--algorithm.rollout-is-cap (the one cap of every correction)",
}
"""Flags that moved or were folded into another: the old spelling fails with the new one's name."""
ALIASES = {"--teacher.path": "--distill.teacher"}
"""Second spellings that stay valid: the flag as the config names it."""


def _aliases(argv: list[str]) -> list[str]:
    out = []
    for a in argv:
        name, eq, value = a.partition("=")
        out.append(ALIASES.get(name, name) + eq + value)
    return out


def _moved_flags(argv: list[str]) -> None:
    for a in argv:
        if a.startswith("--"):
            name = a[2:].partition("=")[0].replace("-", "_")
            if name in MOVED:
                raise UsageError(f"{a.partition('=')[0]} has moved: use {MOVED[name]}")


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
                raise UsageError(f"--env-kwargs takes KEY VALUE pairs, got {pairs}")
            extra |= {k.replace("-", "_"): v for k, v in zip(pairs[::2], pairs[1::2])}
            i = j
        elif a.startswith("--env-kwargs."):
            key, eq, value = a[len("--env-kwargs.") :].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{a} needs a value")
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


def flags(cls: type = TrainConfig, prefix: str = "") -> dict[str, str]:
    """Every config field's dotted path and the flag that sets it: {"rollout.group_size": "--rollout.group-size"};
    a component's fields by its class name too ("AlgoConfig.clip_low", as `algos` names them)."""
    out = {}
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(sub):
            inner = flags(type(sub), path + ".")
            out |= inner | {f"{type(sub).__name__}.{k[len(path) + 1 :]}": v for k, v in inner.items()}
        else:
            out[path] = "--" + path.replace("_", "-")
    return out


def flag_names(msg: str) -> str:
    """A config check's message with the fields it names written as flags: "optim.lr must be > 0" -> "--optim.lr must
    be > 0"; a top-level field at the start too ("steps must be >= 0" -> "--steps must be >= 0")."""
    known = flags()
    msg = re.sub(r"(?<![\w.-])([A-Za-z_]+\.[a-z_]+)\b", lambda m: known.get(m[1], m[1]), msg)
    head = re.match(r"([a-z_]+)\b", msg)
    if head and head[1] in known and not msg.startswith(known[head[1]]):
        msg = known[head[1]] + msg[head.end() :]
    return msg


def _suggest(token: str) -> str:
    name = token.partition("=")[0]
    close = difflib.get_close_matches(name, [*flags().values(), "--preset", "--algo"], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _tyro_failure(event) -> None:
    """tyro's parse-failure hook: the failure as one UsageError line instead of tyro's error box."""
    from tyro import _errors as e

    if isinstance(event, e.UnrecognizedArgs):
        flag = next((t for t in event.tokens if t.startswith("-")), None)
        if flag is None:  # a value with no flag to take it: `--log.tqdm 3` (a switch), or a missing `--`
            raise UsageError(
                f"unexpected value {event.tokens[0]!r}: no flag takes it (a switch such as "
                "--log.tqdm takes no value; --log.no-tqdm turns it off)"
            )
        raise UsageError(f"unknown flag {flag}{_suggest(flag)}; run.py --help lists every flag")
    name = getattr(getattr(event, "argument", None), "display_name", lambda: None)()
    if isinstance(event, e.InstantiationFailure):
        msg = flag_names(re.sub(r"\s+", " ", event.message).strip())
        raise UsageError(f"{name}: {msg}" if name and not msg.startswith(name) else msg)
    if isinstance(event, e.InvalidChoice):
        raise UsageError(f"{name} {event.value!r}: expected one of {', '.join(map(str, event.choices))}")
    if isinstance(event, e.BadValue):
        raise UsageError(f"{name}: {'takes no value' if event.reason == 'fixed' else 'needs a value'}")
    # any other failure: tyro prints its own message box and exits 2


def _one_line_errors():
    """tyro's parse-failure hook, where this tyro has it (a hook module tyro marks unstable: without it, tyro's own
    box still names the flag and exits 2)."""
    try:
        from tyro._errors import on_parse_error
    except ImportError:
        return contextlib.nullcontext()
    return on_parse_error(_tyro_failure)


def import_user_plugins(modules: list[str]) -> None:
    """`--plugins` (run.py and the evals): a module that is not there is one line (UsageError); one that fails
    inside keeps its traceback."""
    import_plugins([])  # the working directory on sys.path, as the import will have it
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            raise UsageError(
                f"--plugins {module}: no module named {module!r} in the working directory or on PYTHONPATH"
            )
    import_plugins(modules)


def help_text() -> str:
    """run.py's own flags, read before tyro's (which lists every config field)."""
    return "\n".join(
        [
            "run.py also takes (before every other flag is read):",
            f"  --preset {{{','.join(sorted(PRESETS))}}}",
            "        the base config (default: `default`; `--env NAME` alone starts from NAME's preset where one exists)",
            f"  --algo {{{','.join(sorted(algos.PRESETS))}}}",
            "        the algorithm preset (from algos.PRESETS); every --algorithm.* flag still overrides it",
            "  --plugins MODULE [MODULE ...]",
            "        modules imported first (from the working directory too), whose registered envs, losses and",
            "        estimators become valid --env / --algorithm.* values",
        ]
    )


def parse_args(argv: list[str] | None = None, console: bool = True) -> TrainConfig:
    """`--preset NAME` picks the base config, `--algo NAME` the algorithm preset, `--plugins` are imported first (so
    their registered names are valid choices); tyro parses every other flag. Raises UsageError (one line naming the
    flag) on bad input; `--help` prints and exits 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _moved_flags(argv)
    argv = _aliases(argv)
    try:
        cfg = _parse(argv, console)
    except SystemExit as e:
        if e.code == 0 and console and ("--help" in argv or "-h" in argv):
            print("\n" + help_text())
        raise
    return cfg


def _parse(argv: list[str], console: bool) -> TrainConfig:
    import argparse

    import tyro

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=None)
    pre.add_argument("--algo", default=None)
    known, rest = pre.parse_known_args(argv)
    if known.preset is not None and known.preset not in PRESETS:
        raise UsageError(f"--preset {known.preset!r}: unknown; valid: {', '.join(sorted(PRESETS))}")
    plugins = argparse.ArgumentParser(add_help=False)  # --plugins stays in `rest`: tyro records it in the config
    plugins.add_argument("--plugins", nargs="*", default=[])
    import_user_plugins(plugins.parse_known_args(rest)[0].plugins)  # first: --algo and tyro's checks look names up
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
            raise UsageError(f"--algo {known.algo!r}: unknown; valid: {', '.join(sorted(algos.PRESETS))}")
        # Set fields directly: cross-field checks must see the final flags (tyro re-validates the parsed config).
        base = copy.copy(base)
        base.algorithm = algos.preset(known.algo)
        if base.demonstrations:  # the preset's group size, not the user's: `--rollout.group-size 4` is refused
            base.rollout = dataclasses.replace(base.rollout, group_size=1)
    with _one_line_errors():
        return tyro.cli(
            TrainConfig,
            default=base,
            args=rest,
            console_outputs=console,
            description="nanosky: agentic RL with torchrun + colocated vLLM + FSDP2. run.py's own flags "
            "(--preset, --algo, --plugins) and their choices are listed at the end.",
        )
