"""nanosky entry point: parse → train → close.

    torchrun --nproc_per_node 8 run.py --algo grpo --env math        # one GPU per rank (nccl)
    torchrun --nproc_per_node 2 run.py --preset demo                  # CPU (gloo), the bundled tiny model
    python run.py --help                                              # every flag
"""

from nanosky import dist
from nanosky.config import parse_args
from nanosky.trainer import train

if __name__ == "__main__":
    info = dist.init_distributed()
    try:
        train(parse_args(console=info.is_main))
    finally:
        dist.shutdown()
