"""Environments from the ecosystem: work written for another framework trains here unchanged.

    --env dataset --env-data FILE          any parquet / jsonl / json file or saved HF dataset (verl, TRL, GSM8K rows)
    --env skyrl_gym --env-data FILE        SkyRL-Gym rows (`env_class`, `prompt`, `reward_spec`, `extra_info`)
    --env reasoning_gym --env-kwargs.tasks basic_arithmetic,chain_sum
    --env textarena --env-kwargs.game GuessTheNumber-v0

Each source is one adapter on `envs.base.Env` (reset / step / close); none adds a second env API. The packages are
the pinned extra `gyms` (`pip install 'nanosky[gyms]'`); a missing one is one line naming the extra, from
`require`. docs/ecosystem.md has a section per source.
"""

from __future__ import annotations

import importlib
import logging

EXTRA = "gyms"
PACKAGES = {  # import name -> distribution, pinned in pyproject's `gyms` extra
    "datasets": "datasets",
    "math_verify": "math-verify",
    "reasoning_gym": "reasoning-gym",
    "skyrl_gym": "skyrl-gym",
    "textarena": "textarena",
}


class MissingExtra(ImportError):
    """An ecosystem package is not installed; the message names the extra that brings it."""


def require(module: str):
    """Import `module` (one of PACKAGES), or raise MissingExtra with the install line."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        dist = PACKAGES.get(module, module)
        raise MissingExtra(
            f"{dist} is not installed ({e.msg}); install the ecosystem extra: pip install 'nanosky[{EXTRA}]'"
        ) from None


def quiet(*loggers: str) -> None:
    """Silence chatty third-party loggers (math-verify warns on every call without a timeout)."""
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)
