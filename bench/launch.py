"""What the bench scripts share: launching `run.py` under torchrun from the repo root, and reading its scalars."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(nproc: int, args: list[str]) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node NPROC run.py ARGS`, output captured. The run's checkpoints are
    deleted after it (a bench reads the logs and traces; SmolLM2-135M's final checkpoint is 2.2 GB, in /tmp)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        "run.py",
    ]
    try:
        return subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True)
    finally:
        if "--log.run-dir" in args:
            run_dir = os.path.join(ROOT, args[args.index("--log.run-dir") + 1])  # relative: to the repo root
            shutil.rmtree(os.path.join(run_dir, "checkpoints"), ignore_errors=True)


def scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a run's TensorBoard events: tag -> [(step, value)] in logged order, none sampled away."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
