"""The shipped mini SWE-style suite: small Python repos, each instance a real bug with an issue, a gold patch and
tests, stored as files under envs/data/swe_mini/ and turned into local git repositories at run time.

    rows = build_suite()                       # official-schema rows with `local_repo` (built once, cached)
    python -m evals.swebench.suite --export mini.jsonl     # the CLI: the same rows as a JSONL file

Layout: `repos/<name>/` is the fixed tree of each repo; `instances/<name>-<n>/` holds `issue.md`, `gold.patch`
(the fix), `test.patch` (tests that expose the bug) and `meta.json`. An instance's base is its repo's tree with the
gold patch reversed, committed as a parentless commit (fixed author and date, so `base_commit` is the same on every
machine) into `<cache>/<name>.git` and tagged with the instance id; the fixed tree itself is never committed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from envs.swe import harness
from envs.swe.build import commit_tree, git

SUITE_DIR = Path(__file__).resolve().parents[1] / "data" / "swe_mini"
CACHE_DIR = Path.home() / ".cache" / "nanosky" / "swe_mini"


def instance_dirs(suite_dir: Path = SUITE_DIR) -> list[Path]:
    """Instance directories in a stable order (repo, then number)."""
    dirs = [d for d in (suite_dir / "instances").iterdir() if d.is_dir()]
    return sorted(dirs, key=lambda d: (d.name.rsplit("-", 1)[0], int(d.name.rsplit("-", 1)[1])))


def _stamp(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for root in paths:
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root.parent)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _commit_base(git_dir: Path, repo_src: Path, inst: Path) -> str:
    """Commit repo_src with the gold patch reversed (the buggy base) into git_dir; returns the commit hash."""
    with tempfile.TemporaryDirectory(prefix="nanosky-swe-build-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(repo_src, tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        git("apply", "-R", str(inst / "gold.patch"), cwd=tree)
        return commit_tree(git_dir, tree, f"{repo_src.name}: base of {inst.name}", inst.name)


def _build_repo(name: str, insts: list[Path], suite_dir: Path, cache: Path) -> dict[str, str]:
    """instance dir name -> base commit, from the cache when the sources are unchanged."""
    git_dir, manifest = cache / f"{name}.git", cache / f"{name}.json"
    stamp = _stamp([suite_dir / "repos" / name, *insts])
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if m.get("stamp") == stamp and git_dir.exists():
            return m["commits"]
    shutil.rmtree(git_dir, ignore_errors=True)
    git("init", "-q", "--bare", str(git_dir))
    commits = {i.name: _commit_base(git_dir, suite_dir / "repos" / name, i) for i in insts}
    manifest.write_text(json.dumps({"stamp": stamp, "commits": commits}, indent=1))
    return commits


def build_suite(cache_dir: str | Path | None = None, suite_dir: Path = SUITE_DIR) -> list[dict]:
    """Official-schema rows for every shipped instance, `local_repo` pointing at the built git repositories."""
    cache = Path(cache_dir or CACHE_DIR)
    cache.mkdir(parents=True, exist_ok=True)
    by_repo: dict[str, list[Path]] = {}
    for d in instance_dirs(suite_dir):
        by_repo.setdefault(d.name.rsplit("-", 1)[0], []).append(d)
    with open(cache / ".lock", "w") as lock:  # two processes building at once would race on the git dirs
        fcntl.flock(lock, fcntl.LOCK_EX)
        commits = {n: _build_repo(n, ds, suite_dir, cache) for n, ds in by_repo.items()}
    rows = []
    for name, ds in by_repo.items():
        for d in ds:
            meta = json.loads((d / "meta.json").read_text())
            base = commits[name][d.name]
            rows.append(
                {
                    "instance_id": meta["instance_id"],
                    "repo": meta["repo"],
                    "base_commit": base,
                    "problem_statement": (d / "issue.md").read_text(),
                    "hints_text": "",
                    "created_at": meta["created_at"],
                    "version": meta["version"],
                    "patch": (d / "gold.patch").read_text(),
                    "test_patch": (d / "test.patch").read_text(),
                    "FAIL_TO_PASS": json.dumps(meta["FAIL_TO_PASS"]),
                    "PASS_TO_PASS": json.dumps(meta["PASS_TO_PASS"]),
                    "environment_setup_commit": base,
                    "local_repo": str(cache / f"{name}.git"),
                }
            )
    return rows


def _statuses(row: dict, with_gold: bool) -> dict[str, str]:
    """Test statuses of base + test_patch (+ gold patch) over the test files the test patch touches."""
    inst = harness.normalize_instance(row)
    workdir = tempfile.mkdtemp(prefix="nanosky-swe-refresh-")
    try:
        harness.checkout(inst["local_repo"], inst["base_commit"], workdir)
        for patch in ([inst["patch"]] if with_gold else []) + [inst["test_patch"]]:
            if not harness.apply_patch(workdir, patch)[0]:
                raise RuntimeError(f"{inst['instance_id']}: a shipped patch does not apply")
        return harness.run_tests(workdir, harness.test_files(inst))[0]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def refresh_meta(cache_dir: str | Path | None = None, workers: int = 2, suite_dir: Path = SUITE_DIR) -> None:
    """Recompute every meta.json's FAIL_TO_PASS (fails on the base, passes with the fix) and PASS_TO_PASS (passes
    on both) by running the tests; a test that fails with the fix is an authoring error."""
    rows = build_suite(cache_dir, suite_dir)
    dirs = {json.loads((d / "meta.json").read_text())["instance_id"]: d for d in instance_dirs(suite_dir)}

    def one(row: dict) -> None:
        before, after = _statuses(row, False), _statuses(row, True)
        broken = [t for t, s in after.items() if s != "PASSED"]
        if broken:
            raise RuntimeError(f"{row['instance_id']}: tests fail with the gold patch: {broken}")
        f2p = sorted(t for t in after if before.get(t) != "PASSED")
        if not f2p:
            raise RuntimeError(f"{row['instance_id']}: no test fails before the fix")
        meta_path = dirs[row["instance_id"]] / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["FAIL_TO_PASS"], meta["PASS_TO_PASS"] = f2p, sorted(t for t in after if t not in f2p)
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{row['instance_id']}: {len(f2p)} FAIL_TO_PASS, {len(meta['PASS_TO_PASS'])} PASS_TO_PASS")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, rows))
