"""What the bench scripts share: launching `run.py` under torchrun from the repo root."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(nproc: int, args: list[str]) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node NPROC run.py ARGS`, output captured."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        "run.py",
    ]
    return subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True)
