"""A generated task as a SWE-bench instance: its buggy base committed into a local git repository, the gold patch
and the hidden test patch as git diffs, and the official fields, so the harness of `evals.swebench` grades it like
any other instance.

    row = to_instance(generate(3, level=1))   # {"instance_id", "base_commit", "patch", "test_patch", ...,
                                              #  "local_repo": ~/.cache/nanosky/swe_gen/train.git, "level": 1}

All instances of a split share one bare repository; each base is a parentless commit with a fixed author and date
(so `base_commit` is the same on every machine), tagged with the instance id. Building is idempotent and
safe when several env workers build the same instance at once (a file lock).
"""

from __future__ import annotations

import difflib
import fcntl
import json
import os
import subprocess
import tempfile
from pathlib import Path

from envs.swe.generate import Task

CACHE_DIR = Path.home() / ".cache" / "nanosky" / "swe_gen"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "nanosky",
    "GIT_AUTHOR_EMAIL": "nanosky@localhost",
    "GIT_COMMITTER_NAME": "nanosky",
    "GIT_COMMITTER_EMAIL": "nanosky@localhost",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
}
"""A fixed author and date: a commit of the same tree has the same hash on every machine."""


def unified_diff(old: dict[str, str], new: dict[str, str]) -> str:
    """A git-style patch taking the files `old` to `new` (path -> text; a path missing from `old` is created)."""
    out = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path, "")
        if a == b:
            continue
        head = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if a is None else "")
        body = difflib.unified_diff(
            (a or "").splitlines(keepends=True),
            b.splitlines(keepends=True),
            "/dev/null" if a is None else f"a/{path}",
            f"b/{path}",
            n=3,
        )
        out.append(head + "".join(body))
    return "".join(out)


def git(*args: str, cwd: str | Path | None = None, env: dict | None = None) -> str:
    """`git args...` (stdout, stripped); RuntimeError with git's message when it fails."""
    r = subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])}: {r.stderr.strip()[:500]}")
    return r.stdout.strip()


def commit_tree(git_dir: str | Path, tree: str | Path, message: str, tag: str) -> str:
    """Commit the directory `tree` as a parentless commit (fixed author and date, one file mode) into the bare
    repository `git_dir`, tagged `tag`; returns its hash. The same files give the same hash on every machine."""
    tree = Path(tree)
    for p in tree.rglob("*"):  # one file mode everywhere: the tree hash must not depend on the umask
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    with tempfile.TemporaryDirectory(prefix="nanosky-git-index-") as tmp:
        env = {"GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(tree), "GIT_INDEX_FILE": str(Path(tmp, "index"))}
        git("add", "-A", ".", cwd=tree, env=env)
        commit = git(
            "commit-tree", git("write-tree", cwd=tree, env=env), "-m", message, cwd=tree, env={**env, **GIT_ENV}
        )
    git("tag", "-f", tag, commit, env={"GIT_DIR": str(git_dir)})
    return commit


def commit_base(task: Task, cache_dir: str | Path | None = None) -> tuple[str, str]:
    """(repository path, base commit) of the task's buggy tree, committed once and reused."""
    cache = Path(cache_dir or CACHE_DIR)
    cache.mkdir(parents=True, exist_ok=True)
    git_dir = cache / f"{task.split}.git"
    with open(cache / f"{task.split}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (git_dir / "HEAD").exists():
            git("init", "-q", "--bare", "--template=", str(git_dir))
        try:
            return str(git_dir), git(
                "rev-parse", "-q", "--verify", f"refs/tags/{task.instance_id}", env={"GIT_DIR": str(git_dir)}
            )
        except RuntimeError:
            pass
        with tempfile.TemporaryDirectory(prefix="nanosky-swe-gen-") as tmp:
            for path, text in task.files.items():
                p = Path(tmp, path)
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text)
            commit = commit_tree(git_dir, tmp, f"{task.package}: base of {task.instance_id}", task.instance_id)
        return str(git_dir), commit


def to_instance(task: Task, cache_dir: str | Path | None = None) -> dict:
    """The task as a SWE-bench row (FAIL_TO_PASS / PASS_TO_PASS as JSON strings, as on the Hub) plus `local_repo`,
    `level` and `bug`."""
    repo, commit = commit_base(task, cache_dir)
    return {
        "instance_id": task.instance_id,
        "repo": f"nanosky-gen/{task.package}",
        "base_commit": commit,
        "problem_statement": task.problem_statement,
        "hints_text": "",
        "created_at": "2025-01-01T00:00:00Z",
        "version": "0.1",
        "patch": unified_diff(task.files, task.fixed_files),
        "test_patch": unified_diff({p: task.files[p] for p in task.test_files}, task.test_files),
        "FAIL_TO_PASS": json.dumps(task.fail_to_pass),
        "PASS_TO_PASS": json.dumps(task.pass_to_pass),
        "environment_setup_commit": commit,
        "local_repo": repo,
        "level": task.level,
        "bug": task.bug,
    }
