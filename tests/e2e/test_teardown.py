"""Teardown once (nanosky/trainer.py: `train` closes its resources in one place): a run that fails mid-step still
shuts its env pool down, closes the endpoint and the rank's event loop, and leaves no worker process behind."""

import json

from spawn import python


def test_a_run_that_raises_closes_its_pool_endpoint_and_loop(tmp_path):
    flags = [
        "--preset",
        "smoke",
        "--log.run-dir",
        str(tmp_path / "run"),
        "--steps",
        "2",
        "--eval.every",
        "0",
        "--envpool.workers",
        "1",
        "--debug.fail-rank",
        "0",
        "--debug.fail-step",
        "1",
        "--rollout.agent-cmd",
        "echo '{\"reward\": 1}'",
        "--log.no-tqdm",
    ]
    r = python(flags, script="tests/scripts/teardown_on_error.py")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["raised"] and "injected failure" in out["raised"]
    assert out["closed"].count("rollout") == 1 and "loop" in out["closed"] and "pool" in out["closed"]
    assert out["url"][0].startswith("http://127.0.0.1:") and not out["answers"]  # the endpoint is gone
    # the env pool's worker went with it (multiprocess's resource tracker is the process's own, and ends with it)
    assert [c for c in out["children"] if "resource_tracker" not in c] == []
