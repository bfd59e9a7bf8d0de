"""Start-up validation (nanosky/preflight.py): bad paths, data, resume, run dir and disk fail in one line naming the
flag, with exit status 2 and no traceback, before any model or engine is built."""

import json
import subprocess
import sys

import pytest
from spawn import ROOT, child_env

from nanosky import preflight
from nanosky.cli import parse_args


def _cfg(tmp_path, *flags):
    return parse_args(["--preset", "smoke", "--log.run-dir", str(tmp_path / "run"), *flags], console=False)


def _fails(cfg, match):
    with pytest.raises(preflight.UsageError, match=match):
        preflight.check(cfg, world=1)


def test_model_path(tmp_path):
    _fails(
        _cfg(tmp_path, "--model.path", "/nonexistent/model"),
        r"--model.path /nonexistent/model: no such directory",
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(_cfg(tmp_path, "--model.path", str(empty)), "no config.json")
    (empty / "config.json").write_text("{}")
    _fails(_cfg(tmp_path, "--model.path", str(empty)), "no weights")
    _fails(_cfg(tmp_path, "--model.path", "no-such-org/no-such-model"), "hub cannot be reached|no network")
    preflight.check(_cfg(tmp_path), world=1)  # the bundled model passes


def test_env_data(tmp_path):
    _fails(
        _cfg(tmp_path, "--env-data", str(tmp_path / "missing.jsonl")),
        r"--env-data .*missing.jsonl: no such file",
    )
    data = tmp_path / "gsm.jsonl"
    good = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})
    data.write_text(
        "\n".join([good, "{not json", good, json.dumps({"question": "q", "answer": "no marker"})])
    )
    _fails(
        _cfg(tmp_path, "--env-data", str(data)), r"2 bad row\(s\) among the first 4: line 2: not JSON.*line 4"
    )
    data.write_text(good + "\n" + good)
    preflight.check(_cfg(tmp_path, "--env-data", str(data)), world=1)
    _fails(_cfg(tmp_path, "--env", "alfworld_lite", "--env-data", str(data)), "takes no data file")


def test_resume_run_dir_and_disk(tmp_path):
    _fails(_cfg(tmp_path, "--resume", "latest"), "--resume latest requested but no complete checkpoint")
    _fails(_cfg(tmp_path, "--resume", str(tmp_path / "nope")), "no such checkpoint directory")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(preflight.UsageError, match="--log.run-dir .*: not writable"):
        preflight.check_run_dir(str(blocker / "run"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (model / "model.safetensors").write_bytes(b"\0" * 2_000_000)  # 1M bf16 parameters
    cfg = _cfg(tmp_path, "--model.path", str(model), "--log.keep-ckpts", "3")
    with pytest.raises(preflight.UsageError, match=r"3 checkpoints \(--log.keep-ckpts\) need about"):
        preflight.check_disk(cfg, free_bytes=60_000_000)  # 4 × 16 B × 1M = 64 MB
    preflight.check_disk(cfg, free_bytes=70_000_000)


@pytest.mark.parametrize(
    "flags,flag",
    [
        (["--model.path", "/nonexistent"], "--model.path"),
        (["--env-data", "missing.jsonl"], "--env-data"),
        (["--resume", "latest"], "--resume"),
    ],
)
def test_run_py_exits_2_with_one_line(flags, flag, tmp_path):
    cmd = [sys.executable, "run.py", "--preset", "smoke", "--log.run-dir", str(tmp_path / "run"), *flags]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=child_env())
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith(f"nanosky: {flag}") and "Traceback" not in r.stderr
    assert "vLLM" not in r.stdout + r.stderr  # failed before the engine was built
