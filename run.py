"""nanosky entry point: parse → train → close.

torchrun --nproc_per_node 8 run.py --algo grpo --env math        # one GPU per rank (nccl)
torchrun --nproc_per_node 2 run.py --preset demo                  # CPU (gloo), the bundled tiny model
python run.py --help                                              # every flag
"""

import sys

from nanosky import dist, process, startup

if __name__ == "__main__":
    # flags, paths, data, resume, run dir, disk: a bad one is one line, printed once, exit 2; the models' folders
    cfg, folders = startup.start()
    # the trainer's imports (transformers, DTensor, peft: ~2 s a rank) after the checks: a bad flag fails fast
    from nanosky.sync import BuildRefused
    from nanosky.trainer import train

    process.freeze_heap()  # the imports' objects leave every collection's scan (vLLM's engine start runs three)

    dist.init_distributed(timeout_s=cfg.dist.timeout_s)
    try:
        train(cfg, folders)
    except BuildRefused as e:  # the engine does not compute the trainer's model: one line, every rank exits 2
        print(f"nanosky: {e}", file=sys.stderr, flush=True) if process.launch().rank == 0 else None
        sys.exit(2)
    finally:
        dist.shutdown()
    process.exit_now(0)  # a finished run skips the interpreter's ~2 s teardown a rank
