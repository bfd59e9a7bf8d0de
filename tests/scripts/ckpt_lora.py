"""2-rank LoRA check: sharded adapters → merged weight stream, adapter-only checkpoint, peft adapter export.

    torchrun --nproc_per_node 2 tests/scripts/ckpt_lora.py OUT.json TMPDIR

Rank 0 writes to OUT.json the max |Δlogp| between the trained LoRA policy and (a) the untouched base model,
(b) a plain HF model loaded with the merged stream, (c) the saved adapter loaded with peft; and the max |Δweight|
after a checkpoint round trip into a fresh LoRA model.
"""

import json
import os
import sys

import torch

from nanosky import dist
from nanosky.precision import decide
from nanosky.tiny import ensure_tiny_model
from nanosky.train.checkpoint_io import load_checkpoint, save_checkpoint
from nanosky.train.lora import (
    LoraConfig,
    iter_merged_params,
    load_lora_model,
    save_adapter,
    trainable_parameters,
)
from nanosky.train.policy import token_logprobs


def main(out: str, tmp: str) -> None:
    info = dist.init_distributed()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path, cfg = str(ensure_tiny_model()), LoraConfig(rank=4, alpha=8)
    model = load_lora_model(path, cfg, info, precision=decide("fp32", info.device.type))
    opt = torch.optim.AdamW(trainable_parameters(model), lr=5e-2)
    g = torch.Generator().manual_seed(info.rank)  # each rank trains on its own data
    for _ in range(2):
        ids = torch.randint(3, 500, (2, 12), generator=g)
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        (-lp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    ids = torch.randint(3, 500, (3, 12), generator=torch.Generator().manual_seed(99))  # same probe on every rank
    att = torch.ones_like(ids)
    with torch.no_grad():
        want, _ = token_logprobs(model, ids, att)
    merged = {n: t.clone() for n, t in iter_merged_params(model)}
    ckpt = save_checkpoint(
        os.path.join(tmp, "ckpt"),
        2,
        model=model,
        optimizer=opt,
        state={"step": 2},
        export=lambda d: save_adapter(model, os.path.join(d, "adapter")),
    )

    model2 = load_lora_model(path, cfg, info, precision=decide("fp32", info.device.type))
    opt2 = torch.optim.AdamW(trainable_parameters(model2), lr=5e-2)
    load_checkpoint(ckpt, model=model2, optimizer=opt2)
    reload = max(float((t - merged[n]).abs().max()) for n, t in iter_merged_params(model2))

    if info.is_main:
        plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        with torch.no_grad():
            base_lp, _ = token_logprobs(plain, ids, att)
            plain.load_state_dict(merged, strict=True)
            merged_lp, _ = token_logprobs(plain, ids, att)
            peft_model = PeftModel.from_pretrained(
                AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                os.path.join(ckpt, "export", "adapter"),
            )
            adapter_lp, _ = token_logprobs(peft_model, ids, att)
        res = {
            "base_vs_policy": float((base_lp - want).abs().max()),
            "merged_vs_policy": float((merged_lp - want).abs().max()),
            "adapter_vs_policy": float((adapter_lp - want).abs().max()),
            "reload_max_diff": reload,
        }
        with open(out, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
