"""`python -m nanosky.tiny [--variant base|agent|tool|swe] [TinyConfig flags]`: build a bundled model if needed and
print its directory on the last line (the recipes and their flags: `nanosky/tiny/__init__.py`)."""

import argparse

import tyro

from nanosky.tiny import VARIANTS, TinyConfig, ensure_tiny_model


def main() -> None:
    # --variant picks the defaults (as run.py's --preset does); every TinyConfig flag still overrides them.
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--variant", default="base", choices=sorted(VARIANTS))
    known, argv = pre.parse_known_args()
    variant = known.variant
    c = tyro.cli(TinyConfig, args=argv, default=VARIANTS[variant][0]())
    if c.force and c.out is None:
        c.out = str(VARIANTS[variant][1])
    print(ensure_tiny_model(c, variant))


if __name__ == "__main__":
    main()
