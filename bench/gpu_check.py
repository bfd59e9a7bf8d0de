"""Trainer-side checks on a GPU, without vLLM: FSDP2 over nccl, bf16 compute (the mixed-precision policy), packed
attention. Three parts, each printing its figures:

1. families: packed vs unpacked max |Δlogp| of every architecture in tests/families.py under bf16, and for the
   sliding-window ones what the same probe gives when the mask forgets the window. The build-time check
   (`trainer.check_packing`, tolerance `packing.BUILD_TOL`) must pass the first and refuse the second.
2. gradients: the bundled tiny model's gradient through `update.logprobs`, packed ("prefix") vs padded ("none"),
   on GRPO groups and multi-turn episodes: cosine and relative norm of the difference.
3. speed: forward + backward time, peak memory and MFU, padded vs prefix-packed with the dense mask vs
   prefix-grouped attention (`--optim.packed-attention grouped`), on a random model shaped like Qwen2.5-0.5B (the
   config only: no download) with GRPO groups (8 answers per prompt), at several row caps.
4. 7b: on a random model shaped like Qwen2.5-7B in bf16 (full depth, forward only, ~15 GB), with the head scaled so
   logits reach ±20: the packing check's target-token |Δ| beside the full-vocabulary |Δ|; then at 7B width (4
   layers) the peak memory of one micro-batch with and without activation checkpointing.

    python bench/gpu_check.py [--skip-speed | --only-speed] [--speed-groups 8] [--row-tokens 1024 2048 8192] [--skip-7b]

Runs on CPU too (gloo, fp32), as a dry run of the code paths.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from families import FAMILIES, build  # noqa: E402

from nanosky import dist  # noqa: E402
from nanosky.agent.trajectory import Trajectory  # noqa: E402
from nanosky.bundled import resolve_model_path  # noqa: E402
from nanosky.train import packing  # noqa: E402
from nanosky.train.batch import to_batch  # noqa: E402
from nanosky.train.policy import load_model, shard_model  # noqa: E402
from nanosky.train.update import OptimConfig, logprobs  # noqa: E402


def windowless(model, forward) -> float:
    """`packing.verify`'s probe with the window left out of the mask: what a packing that missed it would compute."""
    real = packing.attention_kinds
    packing.attention_kinds = lambda cfg: ([packing.FULL] * len(real(cfg)[0]), None)
    try:
        return packing.verify(model, forward, tol=math.inf)
    finally:
        packing.attention_kinds = real


def families(info, out: str, tol: float) -> None:
    print(f"\n## 1. packed vs unpacked, {info.device.type}, tolerance {tol}", flush=True)
    print("| family | layers | max |Δlogp| packed | window missed | check passes / refuses |")
    print("|---|---|---|---|---|")
    for fam in [*FAMILIES, "tiny"]:
        path = resolve_model_path("tiny") if fam == "tiny" else build(fam, out)
        model = load_model(path, info)
        kinds, window = packing.attention_kinds(model.config)
        ok = packing.verify(model, packing.lm_forward(model), tol=math.inf)
        miss = windowless(model, packing.lm_forward(model)) if window else float("nan")
        verdict = ("pass" if ok < tol else "FAILS") + (
            "" if not window else (" / refuses" if miss > tol else " / MISSES")
        )
        print(f"| {fam} | {'/'.join(sorted(set(kinds)))} | {ok:.2e} | {miss:.2e} | {verdict} |", flush=True)
        del model
        torch.cuda.empty_cache() if info.is_cuda else None


def workload(vocab: int, groups: int, n: int, prompt: int, answer: tuple[int, int], seed: int = 0):
    """GRPO groups: `groups` prompts of `prompt` tokens, `n` answers each of a random length in `answer`."""
    rng, trajs = random.Random(seed), []
    for g in range(groups):
        p = [rng.randrange(3, vocab) for _ in range(prompt)]
        for _ in range(n):
            a = [rng.randrange(3, vocab) for _ in range(rng.randint(*answer))]
            trajs.append(
                Trajectory(
                    ids=p + a,
                    loss_mask=[0] * len(p) + [1] * len(a),
                    logprobs=[0.0] * (len(p) + len(a)),
                    group=g,
                )
            )
    return trajs


def loss_and_grads(model, batch, optim: OptimConfig) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    lp, _, T, _ = logprobs(model, batch, optim)
    mask = batch.loss_mask[:, :T]
    loss = -(lp * mask).sum() / mask.sum()
    loss.backward()
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return float(loss.detach()), torch.cat([g.flatten().double() for g in grads])


def gradients(info) -> None:
    print("\n## 2. gradients, packed vs padded (bundled tiny)", flush=True)
    model = load_model(resolve_model_path("tiny"), info)
    batch = to_batch(workload(model.config.vocab_size, 3, 4, 40, (5, 60)), 0, info.device)
    l0, g0 = loss_and_grads(model, batch, OptimConfig(packing="none"))
    l1, g1 = loss_and_grads(model, batch, OptimConfig(packing="prefix"))
    cos = float(torch.nn.functional.cosine_similarity(g0, g1, dim=0))
    rel = float((g0 - g1).norm() / g0.norm())
    print(
        f"loss padded {l0:.5f} packed {l1:.5f} | grad cosine {cos:.6f} | relative |Δg| {rel:.2e}", flush=True
    )


def speed(info, groups: int, row_tokens: list[int]) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    print(f"\n## 3. forward + backward, Qwen2.5-0.5B-shaped random model, {groups} groups x 8", flush=True)
    cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096,
                      attn_implementation="sdpa")  # fmt: skip
    if not info.is_cuda:  # the dry run: the same code on a model the CPU can afford
        cfg.update(dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=4096))  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.config.use_cache = False
    model = shard_model(model, info)
    prompt, answer = (512, (128, 1024)) if info.is_cuda else (64, (16, 64))
    trajs = workload(cfg.vocab_size, groups if info.is_cuda else 2, 8, prompt, answer)
    tokens = sum(len(t.ids) for t in trajs)
    print(
        f"{len(trajs)} sequences, {tokens} tokens ({tokens - len(trajs) // 8 * 7 * prompt} after sharing prompts)"
    )
    n_params = sum(p.numel() for p in model.parameters())
    print("| packing | micro-batches | s / pass (fwd+bwd) | peak GiB | tokens/s | MFU |")
    print("|---|---|---|---|---|---|")
    settings = [("none", OptimConfig(packing="none", micro_batch_size=8), False)]
    for row in row_tokens:
        optim = OptimConfig(packing="prefix", micro_batch_tokens=8192, pack_row_tokens=row)
        settings += [(f"prefix, dense mask, rows of {row}", optim, False)]
        settings += [(f"prefix, grouped, rows of {row}", optim, True)]
    from nanosky.train import grouped_attention
    from nanosky.train.update import micro_batches

    batch = to_batch(trajs, 0, info.device)
    for name, optim, grouped in settings:
        grouped_attention.enable(model) if grouped else grouped_attention.disable(model)
        runs = []
        for _rep in range(3):  # the first pass warms up kernels and the allocator
            if info.is_cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            mbs = micro_batches(batch, optim)
            for _, m in mbs:
                lp, _, T, _ = logprobs(model, m, optim)
                mask = m.loss_mask[:, :T]
                (-(lp * mask).sum() / max(float(mask.sum()), 1.0)).backward()
            if info.is_cuda:
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - t0)
            model.zero_grad(set_to_none=True)
        peak = torch.cuda.max_memory_allocated() / 2**30 if info.is_cuda else float("nan")
        s = min(runs[1:])
        # MFU: 6·N FLOPs per token of the unpacked batch (what the step trains on) over bf16 dense peak (H100/H200)
        mfu = 6 * n_params * tokens / s / 989e12 if info.is_cuda else float("nan")
        print(f"| {name} | {len(mbs)} | {s:.3f} | {peak:.1f} | {tokens / s:,.0f} | {mfu:.1%} |", flush=True)


def seven_b(info) -> None:
    """Part 4: the packing check at Qwen2.5-7B's shape in bf16, and activation memory at its width."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from nanosky.train.policy import checkpoint_activations

    full = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, max_position_embeddings=4096)  # fmt: skip
    if not info.is_cuda:  # the dry run
        full.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=4096)  # fmt: skip
    print(
        f"\n## 4. Qwen2.5-7B shape ({full['num_hidden_layers']} layers, hidden {full['hidden_size']})",
        flush=True,
    )
    dtype = torch.bfloat16 if info.is_cuda else torch.float32
    torch.manual_seed(0)
    with torch.device(info.device):
        model = Qwen2ForCausalLM(
            Qwen2Config(**full, tie_word_embeddings=False, attn_implementation="sdpa")
        ).to(dtype)
    model.config.use_cache = False
    with torch.no_grad():  # logits up to ±20, as a trained 7B gives them
        h = model.model(input_ids=torch.randint(3, 1000, (1, 64), device=info.device)).last_hidden_state
        model.lm_head.weight.mul_(20 / float(model.lm_head(h).abs().amax()))
    p = packing
    ok_target = p.verify(model, p.lm_forward(model), tol=math.inf)  # target tokens, as the check compares now
    g = torch.Generator().manual_seed(0)  # the full vocabulary, as the check compared before issue 45
    prefix = torch.randint(3, full["vocab_size"], (256,), generator=g).tolist()
    seqs = [
        prefix + torch.randint(3, full["vocab_size"], (256 - k,), generator=g).tolist() for k in (0, 3, 7)
    ]
    q = p.pack(seqs, T=511, device=info.device)
    with torch.no_grad():
        packed = q.gather(p.lm_forward(model)(q.input_ids, p.attention_mask(model, q), q.position_ids))
        worst = 0.0
        for i, s_ in enumerate(seqs):
            ids = torch.tensor([s_], device=info.device)
            out = p.lm_forward(model)(ids, torch.ones_like(ids), None)[0, : len(s_) - 1]
            worst = max(worst, float((packed[i, : len(s_) - 1].float() - out.float()).abs().max()))
    tol = p.BUILD_TOL[info.device.type]
    print(
        f"packing check: target tokens max |Δ| {ok_target:.3g}, full vocabulary {worst:.3g} (tolerance {tol})"
    )
    del model, packed
    torch.cuda.empty_cache() if info.is_cuda else None

    cfg = Qwen2Config(
        **(full | {"num_hidden_layers": 4}), tie_word_embeddings=False, attn_implementation="sdpa"
    )
    print("| activation checkpointing | micro-batch | peak GiB |")
    print("|---|---|---|")
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg).to(info.device)  # fp32 masters; the trainer computes in bf16 under FSDP
        model.config.use_cache = False
        if ckpt:
            checkpoint_activations(model)
        model = shard_model(model, info)
        rows, L = (8, 1024) if info.is_cuda else (2, 64)
        trajs = workload(cfg.vocab_size, rows // 8 or 1, 8, L // 2, (L // 2, L // 2))
        batch = to_batch(trajs, 0, info.device)
        if info.is_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        loss_and_grads(model, batch, OptimConfig(packing="none", micro_batch_size=len(trajs)))
        peak = torch.cuda.max_memory_allocated() / 2**30 if info.is_cuda else float("nan")
        print(f"| {'on' if ckpt else 'off'} | {len(trajs)} x {L} tokens | {peak:.1f} |", flush=True)
        del model
        torch.cuda.empty_cache() if info.is_cuda else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--speed-groups", type=int, default=8)
    ap.add_argument(
        "--row-tokens", type=int, nargs="+", default=[1024, 2048, 8192], help="pack_row_tokens to time"
    )
    ap.add_argument("--only-speed", action="store_true")
    ap.add_argument("--skip-7b", action="store_true")
    args = ap.parse_args()
    info = dist.init_distributed()
    name = torch.cuda.get_device_name() if info.is_cuda else "cpu"
    print(f"device {name} | torch {torch.__version__} | backend {info.backend} | world {info.world}")
    if not args.only_speed:
        with tempfile.TemporaryDirectory() as out:
            families(info, out, packing.BUILD_TOL[info.device.type])
        gradients(info)
    if not args.skip_speed:
        speed(info, args.speed_groups, args.row_tokens)
    if not args.skip_7b and not args.only_speed:
        seven_b(info)
    dist.shutdown()


if __name__ == "__main__":
    main()
