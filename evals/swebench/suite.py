"""The shipped mini SWE-style suite's command line (the suite itself, code and data, is `envs/swe/suite.py`).

python -m evals.swebench.suite --export mini.jsonl     # the suite's rows as a JSONL file
python -m evals.swebench.suite --refresh               # recompute FAIL_TO_PASS / PASS_TO_PASS by running tests
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from envs.swe.suite import build_suite, refresh_meta


@dataclass(kw_only=True)
class SuiteCli:
    export: str | None = None
    """Write the suite's rows (official schema + local_repo) to this JSONL file."""
    refresh: bool = False
    """Recompute FAIL_TO_PASS / PASS_TO_PASS in every meta.json by running the tests."""
    cache_dir: str | None = None
    """Where the git repositories are built (default ~/.cache/nanosky/swe_mini)."""


if __name__ == "__main__":
    import tyro

    cli = tyro.cli(SuiteCli, description=__doc__)
    if cli.refresh:
        refresh_meta(cli.cache_dir)
    rows = build_suite(cli.cache_dir)
    if cli.export:
        Path(cli.export).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(
        f"{len(rows)} instances in {len(set(r['repo'] for r in rows))} repos; git repos in {Path(rows[0]['local_repo']).parent}"
    )
