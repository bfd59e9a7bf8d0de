"""Multi-node is torchrun's rendezvous: two single-process "nodes" on 127.0.0.1 train together (issue 7)."""

import json
import os
import socket
import subprocess
import sys

import pytest
from spawn import ROOT, child_env


@pytest.mark.slow
def test_two_nodes_over_c10d_rendezvous(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = str(tmp_path / "mn")
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc_per_node",
            "1",
            "--node_rank",
            str(node),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{port}",
            "--rdzv_id",
            "nanosky-test",
            "run.py",
            "--preset",
            "smoke",
            "--steps",
            "2",
            "--log.ckpt-every",
            "0",
            "--log.run-dir",
            run_dir,
            "--envpool.workers",
            "0",
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["world_size"] == 2 and summary["steps"] == 2
