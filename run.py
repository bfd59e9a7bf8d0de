"""nanosky entry point: parse → train → close.

torchrun --nproc_per_node 8 run.py --algo grpo --env math        # one GPU per rank (nccl)
torchrun --nproc_per_node 2 run.py --preset demo                  # CPU (gloo), the bundled tiny model
python run.py --help                                              # every flag
"""

import sys

from nanosky import dist, preflight
from nanosky.cli import parse_args
from nanosky.trainer import train

if __name__ == "__main__":
    dist.record_launch()  # the launch geometry, before the engine can change the environment
    cfg = parse_args(console=dist.launch_rank() == 0)  # bad flags fail here, before anything is built
    try:  # bad paths, data, resume, run dir, disk: one line, exit 2
        preflight.check(cfg)
    except preflight.UsageError as e:
        if dist.launch_rank() == 0:
            print(f"nanosky: {e}", file=sys.stderr)
        sys.exit(2)
    dist.init_distributed(timeout_s=cfg.dist.timeout_s)
    try:
        train(cfg)
    finally:
        dist.shutdown()
