"""Checkpoint test worker: a tiny random Qwen2 sharded with FSDP2, trained on data drawn from the global RNGs.

    torchrun --nproc_per_node 2 tests/scripts/ckpt_worker.py roundtrip OUT.json ROOT
        2 steps, save, 2 more steps (reference); then a fresh model with scrambled RNGs loads the checkpoint and
        repeats the 2 steps. Rank 0 writes the max |Δparam| and both runs' losses to OUT.json.
    python tests/scripts/ckpt_worker.py kill ROOT STAGE
        saves step 1 (and its full params to ROOT/../step1_params.pt), then saves step 2 and at STAGE ("written"
        or "renamed") touches ROOT/../READY and sleeps, for the test to kill -9 it there.

Also imported by tests/test_checkpoint.py for `build` and `train_step`.
"""

import json
import os
import random
import sys
import time

import numpy as np
import torch

from nanosky import dist
from nanosky.precision import decide
from nanosky.train.checkpoint_io import load_checkpoint, save_checkpoint
from nanosky.train.policy import iter_full_params, shard_model


def build(seed: int, info: dist.DistInfo, layers: int = 2):
    """A tiny random Qwen2 (hidden 32), FSDP2-sharded, with AdamW and a LambdaLR schedule."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = shard_model(Qwen2ForCausalLM(cfg), info, precision=decide("fp32", info.device.type))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def train_step(model, opt, sched=None) -> float:
    """One step whose batch and loss scale come from torch, numpy and python RNGs: a resume that fails to restore
    any of them changes the result."""
    ids = torch.randint(0, 64, (4, 12))  # [B, L]
    scale = 1.0 + random.random() + float(np.random.rand())
    loss = model(input_ids=ids, labels=ids).loss * scale
    loss.backward()
    opt.step()
    if sched is not None:
        sched.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def full_params(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in iter_full_params(model)}


def roundtrip(out: str, root: str) -> None:
    info = dist.init_distributed()
    model, opt, sched = build(0, info)
    dist.seed_everything(100 + info.rank)  # ranks draw different data
    for _ in range(2):
        train_step(model, opt, sched)
    t0 = time.perf_counter()
    path = save_checkpoint(root, 2, model=model, optimizer=opt, scheduler=sched, state={"step": 2}, keep=2)
    save_s = time.perf_counter() - t0
    ref_losses = [train_step(model, opt, sched) for _ in range(2)]
    ref = full_params(model)

    model2, opt2, sched2 = build(1, info)  # different init: everything must come from the checkpoint
    dist.seed_everything(12345)
    t0 = time.perf_counter()
    state = load_checkpoint(path, model=model2, optimizer=opt2, scheduler=sched2)
    load_s = time.perf_counter() - t0
    losses = [train_step(model2, opt2, sched2) for _ in range(2)]
    got = full_params(model2)
    max_diff = max(float((ref[k] - got[k]).abs().max()) for k in ref)
    all_losses = dist.all_gather_objects((ref_losses, losses))
    if info.is_main:
        with open(out, "w") as f:
            json.dump(
                {
                    "max_diff": max_diff,
                    "losses": all_losses,
                    "state": state,
                    "save_s": save_s,
                    "load_s": load_s,
                    "lr": sched2.get_last_lr(),
                },
                f,
            )
    dist.barrier()
    dist.shutdown()


def kill(root: str, stage: str) -> None:
    info = dist.init_distributed()
    model, opt, sched = build(0, info)
    dist.seed_everything(7)
    train_step(model, opt, sched)
    save_checkpoint(root, 1, model=model, optimizer=opt, scheduler=sched, state={"step": 1})
    torch.save(full_params(model), os.path.join(root, "..", "step1_params.pt"))
    train_step(model, opt, sched)

    def hang(s: str) -> None:
        if s == stage:
            open(os.path.join(root, "..", "READY"), "w").close()
            time.sleep(120)  # killed here by the test

    save_checkpoint(root, 2, model=model, optimizer=opt, scheduler=sched, state={"step": 2}, _on_stage=hang)


if __name__ == "__main__":
    torch.use_deterministic_algorithms(True)
    if sys.argv[1] == "roundtrip":
        roundtrip(sys.argv[2], sys.argv[3])
    else:
        kill(sys.argv[2], sys.argv[3])
