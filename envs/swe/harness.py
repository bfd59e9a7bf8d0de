"""Local SWE-bench evaluation: check out `base_commit`, apply the model patch, apply `test_patch`, run the
FAIL_TO_PASS and PASS_TO_PASS tests with pytest in the sandbox, grade with SWE-bench's rule.

    result = evaluate_instance(instance, model_patch)      # {"resolution": "RESOLVED_FULL", "resolved": True, ...}

The rule (as in the official harness): FULL when every FAIL_TO_PASS and every PASS_TO_PASS test passes; PARTIAL
when some but not all FAIL_TO_PASS tests pass and every PASS_TO_PASS test passes; NO otherwise. Only FULL counts as
resolved. An empty patch is graded NO without running anything; a patch that applies by none of `git apply`,
`git apply --3way`, `patch --fuzz` is an error. Everything that touches a work tree after an untrusted patch or
agent has been in it (apply, test run, diff) runs in `envs.tools.sandbox` with git hooks disabled.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from envs.tools.sandbox import SandboxResult, repo_env, run_sandboxed

REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
FULL, PARTIAL, NO = "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"
PASSING = ("PASSED", "XFAIL")
EXCLUDES = "__pycache__/\n*.pyc\n.pytest_cache/\n"
TAR_CACHE = Path.home() / ".cache" / "nanosky" / "swe_repos"
# Untrusted work trees: no hooks, no fsmonitor, no pager, whatever .git/config says.
_GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.pager=cat"]


# ---------------------------------------------------------------------------------------------- instances


def normalize_instance(row: dict, base_dir: Path | None = None) -> dict:
    """Check the official fields and parse FAIL_TO_PASS / PASS_TO_PASS (lists or JSON strings, as on the Hub).
    A relative `local_repo` is taken relative to the instances file's directory. Raises ValueError."""
    missing = [k for k in REQUIRED if k not in row or row[k] is None]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    out = dict(row)
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        tests = json.loads(row[key]) if isinstance(row[key], str) else row[key]
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"{key} must be a list of test ids")
        out[key] = tests
    if not str(out["instance_id"]).strip() or not re.fullmatch(r"[0-9a-fA-F]{7,40}", str(out["base_commit"])):
        raise ValueError("instance_id must be non-empty and base_commit a commit hash")
    if out.get("local_repo"):
        p = Path(out["local_repo"]).expanduser()
        if not p.is_absolute() and base_dir is not None and (base_dir / p).exists():
            p = base_dir / p
        out["local_repo"] = str(p.resolve())
    return out


def resolve_repo(local_repo: str, commit: str) -> str:
    """A git repository path holding `commit`: the directory itself, or a tarball's extracted copy (cached).
    Raises ValueError when it is unreadable or lacks the commit."""
    path = Path(local_repo)
    if path.is_file() and tarfile.is_tarfile(path):
        path = _extract(path)
    if not path.is_dir():
        raise ValueError(f"local_repo {local_repo} is not a directory or a tarball of a git repository")
    r = subprocess.run(["git", "-C", str(path), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if r.returncode != 0:
        raise ValueError(f"local_repo {local_repo} has no commit {commit}")
    return str(path)


def _extract_all(tf: tarfile.TarFile, dest: Path, tar: Path) -> None:
    """`tf` into `dest` under tarfile's "data" filter; on Pythons without extraction filters (3.11.0-3.11.3, e.g.
    Debian 12's), its refusals by hand first: a member or link outside `dest`, a device or a FIFO."""
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, filter="data")
        return
    root = os.path.realpath(dest)

    def inside(path: str) -> bool:
        return os.path.commonpath([root, os.path.realpath(os.path.join(root, path))]) == root

    for m in tf.getmembers():
        link = os.path.join(os.path.dirname(m.name), m.linkname) if m.issym() else m.linkname
        if os.path.isabs(m.name) or not inside(m.name) or (m.issym() or m.islnk()) and not inside(link):
            raise tarfile.TarError(f"{tar}: {m.name!r} would be written outside the folder it is extracted to")
        if m.isdev():
            raise tarfile.TarError(f"{tar}: {m.name!r} is a device or a FIFO")
    tf.extractall(dest)


def _extract(tar: Path) -> Path:
    st = tar.stat()
    key = hashlib.sha1(f"{tar.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = TAR_CACHE / key
    if not dest.exists():
        TAR_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=TAR_CACHE))  # same filesystem: the rename below is atomic
        try:
            with tarfile.open(tar) as tf:
                _extract_all(tf, tmp, tar)
        except tarfile.TarError as e:  # a member the "data" filter refuses, or a broken archive: the row's error
            shutil.rmtree(tmp, ignore_errors=True)
            raise ValueError(f"local_repo {tar}: {e}") from None
        try:
            os.replace(tmp, dest)
        except OSError:  # another process extracted it first
            shutil.rmtree(tmp, ignore_errors=True)
    entries = [p for p in dest.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest  # "repo/" inside, or the tree itself


def checkout(repo: str, commit: str, dest: str) -> None:
    """A fresh work tree of `commit` alone at `dest`: a depth-1 fetch, so later commits (the fix) are not in it."""
    run = lambda *a: subprocess.run(["git", *a], cwd=dest, check=True, capture_output=True, text=True)  # noqa: E731
    os.makedirs(dest, exist_ok=True)
    run("init", "-q")
    run("fetch", "-q", "--no-tags", "--depth=1", Path(repo).resolve().as_uri(), commit)
    run("checkout", "-q", "--detach", "FETCH_HEAD")
    with open(os.path.join(dest, ".git", "info", "exclude"), "a") as f:
        f.write(EXCLUDES)


# ---------------------------------------------------------------------------------------------- sandboxed steps


def sandboxed(
    argv: list[str], workdir: str, stdin: str | None = None, timeout_s: float = 60.0, python: str = sys.executable
) -> SandboxResult:
    """Run in the sandbox with only `workdir` writable; `python` (and its bin dir) first on PATH."""
    return run_sandboxed(
        argv,
        cwd=workdir,
        stdin=stdin,
        timeout_s=timeout_s,
        writable_dirs=[workdir],
        mem_mb=4096,
        max_procs=128,
        env=repo_env(python),
    )


def reset_tree(workdir: str) -> None:
    sandboxed(_GIT + ["reset", "-q", "--hard"], workdir)
    sandboxed(_GIT + ["clean", "-q", "-fdx", "-e", ".git"], workdir)


def apply_patch(workdir: str, patch: str) -> tuple[bool, str, str]:
    """(applied, method, log), trying `git apply`, then `git apply --3way`, then `patch --fuzz=5`; the tree is
    reset between attempts so a half-applied patch never survives."""
    if not patch.endswith("\n"):
        patch += "\n"  # a patch cut at its last newline still applies
    attempts = [
        ("git apply", _GIT + ["apply", "--verbose", "--whitespace=nowarn", "-"]),
        ("git apply --3way", _GIT + ["apply", "--verbose", "--3way", "-"]),
        ("patch --fuzz", ["patch", "--batch", "--forward", "--fuzz=5", "-p1", "--no-backup-if-mismatch", "-r", "-"]),
    ]
    logs = []
    for method, argv in attempts:
        r = sandboxed(argv, workdir, stdin=patch)
        logs.append(f"$ {method}\n{(r.stdout + r.stderr)[-1500:]}")
        if r.returncode == 0:
            return True, method, "\n".join(logs)
        reset_tree(workdir)
    return False, "", "\n".join(logs)


def diff_against(workdir: str, commit: str) -> str:
    """The work tree's changes since `commit` (new files included), as a patch."""
    sandboxed(_GIT + ["add", "-A"], workdir)
    r = sandboxed(_GIT + ["diff", "--cached", "--no-color", "--no-ext-diff", commit], workdir)
    return r.stdout if r.returncode == 0 else ""


# ---------------------------------------------------------------------------------------------- tests


def test_files(instance: dict) -> list[str]:
    """Test files to run: those the test patch touches, plus the files named in the test ids."""
    files = re.findall(r"^diff --git a/(\S+) b/", instance["test_patch"], flags=re.MULTILINE)
    files += [t.split("::")[0] for t in instance["FAIL_TO_PASS"] + instance["PASS_TO_PASS"] if "::" in t]
    return [f for f in dict.fromkeys(files) if f.endswith(".py")]


def parse_pytest_log(text: str) -> dict[str, str]:
    """test id -> PASSED | FAILED | ERROR | SKIPPED | XFAIL | XPASS, from pytest's `-rA` summary. A test reported
    twice (e.g. passed, then errored in teardown) keeps the failing status."""
    status: dict[str, str] = {}
    # "SKIPPED [1] tests/x.py:9: reason" names a location, not a test id: `[` cannot start an id.
    for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ([^\s\[]\S*)", text, flags=re.MULTILINE):
        state, test = m.groups()
        if status.get(test) not in ("FAILED", "ERROR"):
            status[test] = state
    return status


def run_tests(
    workdir: str, files: list[str], timeout_s: float = 120.0, python: str = sys.executable
) -> tuple[dict, str]:
    """(status by test id, log) for pytest over `files` in the sandbox."""
    argv = [python, "-m", "pytest", "-rA", "--tb=short", "-p", "no:cacheprovider", "-o", "addopts=", *files]
    r = sandboxed(argv, workdir, timeout_s=timeout_s, python=python)
    log = r.stdout + r.stderr + (f"\n[killed: {r.killed_reason}]" if r.killed_reason else "")
    return parse_pytest_log(r.stdout), log


def grade(fail_to_pass: list[str], pass_to_pass: list[str], status: dict[str, str]) -> dict:
    """SWE-bench's rule over the test statuses; a test missing from the log counts as failed."""
    report = {}
    for key, tests in (("FAIL_TO_PASS", fail_to_pass), ("PASS_TO_PASS", pass_to_pass)):
        ok = [t for t in tests if status.get(t) in PASSING]
        report[key] = {"success": ok, "failure": [t for t in tests if t not in ok]}

    def rate(key: str) -> float:  # no tests of a kind = all of them pass, as in the official harness
        n = len(report[key]["success"]) + len(report[key]["failure"])
        return len(report[key]["success"]) / n if n else 1.0

    f2p, p2p = rate("FAIL_TO_PASS"), rate("PASS_TO_PASS")
    if f2p == 1.0 and p2p == 1.0:
        resolution = FULL
    elif 0.0 < f2p < 1.0 and p2p == 1.0:
        resolution = PARTIAL
    else:
        resolution = NO
    return {"resolution": resolution, "tests_status": report}


def evaluate_instance(
    instance: dict, model_patch: str | None, timeout_s: float = 120.0, python: str = sys.executable
) -> dict:
    """Grade one patch against one (normalised) instance with a `local_repo`. Never raises."""
    out = {
        "instance_id": instance["instance_id"],
        "resolution": NO,
        "resolved": False,
        "patch_applied": False,
        "apply_method": None,
        "empty_patch": False,
        "error": None,
    }
    if not (model_patch or "").strip():
        out["empty_patch"] = True
        return out
    workdir = tempfile.mkdtemp(prefix="nanosky-swe-eval-")
    try:
        checkout(resolve_repo(instance["local_repo"], instance["base_commit"]), instance["base_commit"], workdir)
        ok, method, log = apply_patch(workdir, model_patch)
        out["patch_applied"], out["apply_method"] = ok, method or None
        if not ok:
            out["error"], out["apply_log"] = "patch did not apply", log[-2000:]
            return out
        ok, _, log = apply_patch(workdir, instance["test_patch"])
        if not ok:
            out["error"], out["apply_log"] = "test_patch did not apply", log[-2000:]
            return out
        status, log = run_tests(workdir, test_files(instance), timeout_s, python)
        out.update(grade(instance["FAIL_TO_PASS"], instance["PASS_TO_PASS"], status))
        out["resolved"] = out["resolution"] == FULL
        out["test_log"] = log[-3000:]
    except Exception as e:  # noqa: BLE001 - one broken instance is reported, never fatal
        out["error"] = f"{type(e).__name__}: {e}"[:500]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------- official harness


def official_harness(instances_path: str, predictions_path: str, ids: list[str], run_id: str, workers: int = 2) -> str:
    """Hand instances without `local_repo` to SWE-bench's docker harness when it is installed; else say why not."""
    import importlib.util

    if not shutil.which("docker") or importlib.util.find_spec("swebench") is None:
        return (
            f"{len(ids)} instance(s) have no local_repo and were not evaluated: local evaluation needs "
            "local_repo (a git repository or tarball containing base_commit); the official harness needs "
            "docker and `pip install swebench`. Predictions were written for them."
        )
    cmd = [
        sys.executable,
        "-m",
        "swebench.harness.run_evaluation",
        "--dataset_name",
        instances_path,
        "--predictions_path",
        predictions_path,
        "--run_id",
        run_id,
        "--max_workers",
        str(workers),
        "--instance_ids",
        *ids,
    ]
    r = subprocess.run(cmd)
    return f"official harness exited with {r.returncode}: {' '.join(cmd[:8])} ..."
