"""A repository given as a tarball (`local_repo: repo.tar.gz`): extracted once into the cache, and a member that
would land outside the cache folder refused as the row's error, on Pythons with tarfile's extraction filters (3.11.4+)
and on those without (3.11.0-3.11.3, Debian 12's), where nanosky checks the members itself."""

import io
import subprocess
import tarfile

import pytest

from envs.swe import harness


def _repo_tar(tmp_path, extra: tarfile.TarInfo | None = None):
    repo = tmp_path / "src" / "repo"
    repo.mkdir(parents=True)
    (repo / "a.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    tar = tmp_path / "repo.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        tf.add(repo, arcname="repo")
        if extra is not None:
            tf.addfile(extra, io.BytesIO(b"x") if extra.isfile() else None)
    return tar, commit


def _evil(kind: str) -> tarfile.TarInfo:
    if kind == "dotdot":
        m = tarfile.TarInfo("repo/../../../escaped.txt")  # cache/<tmp>/repo/../../..: tmp_path
        m.size = 1
    elif kind == "absolute":
        m = tarfile.TarInfo("/tmp/nanosky-absolute.txt")
        m.size = 1
    else:  # a symlink out of the folder
        m = tarfile.TarInfo("repo/link")
        m.type, m.linkname = tarfile.SYMTYPE, "../../../etc"
    return m


@pytest.fixture(params=["filters", "no filters"])
def python_tarfile(request, monkeypatch):
    if request.param == "no filters":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no extraction filters")
    return request.param


def test_a_tarball_extracts_once_and_holds_its_commit(tmp_path, monkeypatch, python_tarfile):
    monkeypatch.setattr(harness, "TAR_CACHE", tmp_path / "cache")
    tar, commit = _repo_tar(tmp_path)
    path = harness.resolve_repo(str(tar), commit)
    assert (tmp_path / "cache") in harness.Path(path).parents and harness.Path(path, "a.py").read_text() == "x = 1\n"
    assert harness.resolve_repo(str(tar), commit) == path  # cached: the same folder


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_a_member_outside_the_folder_is_the_rows_error(kind, tmp_path, monkeypatch, python_tarfile):
    monkeypatch.setattr(harness, "TAR_CACHE", tmp_path / "cache")
    tar, commit = _repo_tar(tmp_path, _evil(kind))
    if (kind, python_tarfile) == ("absolute", "filters"):  # the "data" filter strips the leading /: inside
        with pytest.raises(ValueError):  # the tarball no longer holds one folder: no repository at its top
            harness.resolve_repo(str(tar), commit)
        assert list((tmp_path / "cache").rglob("nanosky-absolute.txt"))
    else:
        with pytest.raises(ValueError, match=r"local_repo .*repo\.tar\.gz.*outside"):
            harness.resolve_repo(str(tar), commit)
        assert list((tmp_path / "cache").iterdir()) == []  # nothing half-extracted left in the cache
    assert not (tmp_path / "escaped.txt").exists() and not harness.Path("/tmp/nanosky-absolute.txt").exists()
