"""Trainer-side checks on a GPU, without vLLM: FSDP2 over nccl, bf16 compute (the mixed-precision policy), packed
attention. Its parts, each printing its figures:

1. families: packed vs unpacked max |Δlogp| of every architecture in tests/families.py under bf16, with the dense
   mask and with prefix-grouped attention (on CUDA: the flash varlen kernel), and for the sliding-window ones what
   the probe gives when the mask forgets the window. The build-time check (`nanosky.train.plan.decide`, tolerance
   `nanosky.precision.BUILD_TOL`) must pass the first two and refuse the third.
2. gradients: the bundled tiny model's gradient through `update.logprobs`, packed (dense mask, grouped) vs padded.
3. speed: forward + backward time, peak memory and MFU, padded vs prefix-packed with the dense mask vs
   prefix-grouped attention (one SDPA call per segment, and one varlen call per layer), on random models shaped like
   Qwen2.5-0.5B and like Qwen2.5-7B's width (8 of its 28 layers; the config only, no download) with GRPO groups
   (8 answers of 128-1024 tokens per 512-token prompt), at several row caps.
4. 7b: on a random model shaped like Qwen2.5-7B in bf16 (full depth, forward only, ~15 GB), with the head scaled so
   logits reach ±20: the packing check's target-token |Δ| beside the full-vocabulary |Δ|; then at 7B width (4
   layers) the peak memory of one micro-batch with and without activation checkpointing.
4b. noise: on the same 7B-shaped model, the packing probe's packed-vs-unpacked gap beside the gaps bf16 rounding
   alone gives (flash vs math SDPA, one row alone vs among padded rows).
5. qlora: the bundled tiny model with a 4-bit NF4 base (bitsandbytes) under FSDP2: two training steps, then the
   merged weight stream the sync sends against the checkpoint quantized and dequantized independently.
6. profile: the top GPU kernels of a 0.5B-shaped pass, padded vs grouped (varlen) attention.
7. real: a run's train phase on a random model shaped like SmolLM2-135M-Instruct (saved and loaded as a checkpoint):
   `load_policy`, the build's plan, `PolicyUpdate` on one GRPO step's rows (8 prompts of 128 tokens x 8 answers of
   64-512), in fp32 and bf16, full fine-tuning and LoRA (rank 8, alpha 16): seconds per step, tokens/s, peak memory.

    python bench/gpu_check.py [--parts families gradients speed 7b noise qlora profile real]
        [--row-tokens 1024 2048 4096 8192] [--real-layers N] [--real-groups N] [--real-answers MIN MAX]

Each part runs on its own: one that fails prints its traceback and the next runs. Runs on CPU too (gloo, fp32), as
a dry run of the code paths on small shapes.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from families import FAMILIES, build  # noqa: E402
from gpu_check_parts import SHAPES, noise, profile, qlora, qwen_config, real, seven_b, workload  # noqa: E402

from nanosky import dist  # noqa: E402
from nanosky.bundled import resolve_model_path  # noqa: E402
from nanosky.precision import decide  # noqa: E402
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
    from nanosky.train import grouped_attention

    print(f"\n## 1. packed vs unpacked, {info.device.type}, tolerance {tol}", flush=True)
    print("| family | layers | max |Δlogp| dense mask | grouped | window missed | check passes / refuses |")
    print("|---|---|---|---|---|---|")
    for fam in [*FAMILIES, "tiny"]:
        try:  # a family this transformers lacks is a row, not the end of the part
            path = resolve_model_path("tiny") if fam == "tiny" else build(fam, out)
            model = load_model(path, info, precision=decide("auto", info.device.type))
        except Exception as e:  # noqa: BLE001
            print(f"| {fam} | not built: {type(e).__name__}: {str(e)[:120]} | | | | |", flush=True)
            continue
        kinds, window = packing.attention_kinds(model.config)
        ok = packing.verify(model, packing.lm_forward(model), tol=math.inf)
        miss = windowless(model, packing.lm_forward(model)) if window else float("nan")
        grouped = float("nan")
        if grouped_attention.enable(model):  # soft-capped families run eager attention: never grouped
            grouped = packing.verify(model, packing.lm_forward(model), tol=math.inf)
        verdict = ("pass" if max(ok, 0 if math.isnan(grouped) else grouped) < tol else "FAILS") + (
            "" if not window else (" / refuses" if miss > tol else " / MISSES")
        )
        print(
            f"| {fam} | {'/'.join(sorted(set(kinds)))} | {ok:.2e} | {grouped:.2e} | {miss:.2e} | {verdict} |",
            flush=True,
        )
        del model
        torch.cuda.empty_cache() if info.is_cuda else None


def loss_and_grads(model, batch, optim: OptimConfig) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    lp, _, T, _ = logprobs(model, batch, optim)
    mask = batch.loss_mask[:, :T]
    loss = -(lp * mask).sum() / mask.sum()
    loss.backward()
    grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in model.parameters()]
    return float(loss.detach()), torch.cat([g.flatten().double() for g in grads])


def gradients(info) -> None:
    from nanosky.train import grouped_attention

    print("\n## 2. gradients, packed vs padded (bundled tiny)", flush=True)
    model = load_model(resolve_model_path("tiny"), info, precision=decide("auto", info.device.type))
    batch = to_batch(workload(model.config.vocab_size, 3, 4, 40, (5, 60)), 0, info.device)
    l0, g0 = loss_and_grads(model, batch, OptimConfig(packing="none"))
    for name in ("dense mask", "grouped"):
        grouped_attention.enable(model) if name == "grouped" else grouped_attention.disable(model)
        l1, g1 = loss_and_grads(model, batch, OptimConfig(packing="prefix"))
        cos = float(torch.nn.functional.cosine_similarity(g0, g1, dim=0))
        rel = float((g0 - g1).norm() / g0.norm())
        print(
            f"{name}: loss padded {l0:.5f} packed {l1:.5f} | grad cosine {cos:.6f} | relative |Δg| {rel:.2e}",
            flush=True,
        )


def speed(info, shape: str, groups: int, row_tokens: list[int], reps: int, padded: bool = True) -> None:
    from transformers import Qwen2ForCausalLM

    from nanosky.train import grouped_attention
    from nanosky.train.update import micro_batches

    print(f"\n## 3. forward + backward, Qwen2.5-{shape}-shaped random model, {groups} groups x 8", flush=True)
    cfg = qwen_config(SHAPES[shape], info)
    torch.manual_seed(0)
    with torch.device(info.device):
        model = Qwen2ForCausalLM(cfg)  # fp32 masters; the trainer computes in bf16 under FSDP2
    model.config.use_cache = False
    model = shard_model(model, info, precision=decide("auto", info.device.type))
    prompt, answer = (512, (128, 1024)) if info.is_cuda else (64, (16, 64))
    trajs = workload(cfg.vocab_size, groups if info.is_cuda else 2, 8, prompt, answer)
    tokens = sum(len(t.ids) for t in trajs)
    print(f"{len(trajs)} sequences, {tokens} tokens ({tokens - len(trajs) // 8 * 7 * prompt} after sharing prompts)")
    # FLOPs per token: 6 x the parameters a token multiplies through (the input embedding is a lookup; tied, it is
    # the head). Attention's score FLOPs are left out, so MFU here is a floor.
    n_params = sum(p.numel() for p in model.parameters())
    if not cfg.tie_word_embeddings:
        n_params -= model.get_input_embeddings().weight.numel()
    print(f"{n_params / 1e9:.2f}B matmul parameters | best of {reps - 1} passes after a warm-up")
    print("| packing | micro-batches | s / pass (fwd+bwd) | peak GiB | tokens/s | MFU | loss |")
    print("|---|---|---|---|---|---|---|")
    settings = [("none", OptimConfig(packing="none", micro_batch_size=8), None)] if padded else []
    for row in row_tokens:
        optim = OptimConfig(packing="prefix", micro_batch_tokens=max(8192, row), pack_row_tokens=row)
        settings += [(f"prefix, dense mask, rows of {row}", optim, None)]
        if info.is_cuda:
            settings += [(f"prefix, grouped (SDPA per segment), rows of {row}", optim, False)]
        settings += [(f"prefix, grouped (varlen), rows of {row}", optim, True)]
    batch = to_batch(trajs, 0, info.device)
    for name, optim, varlen in settings:
        grouped_attention.enable(model, varlen=varlen) if varlen is not None else grouped_attention.disable(model)
        runs = []
        try:
            for _rep in range(reps):  # the first pass warms up kernels and the allocator
                if info.is_cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                t0, loss = time.perf_counter(), 0.0
                mbs = micro_batches(batch, optim)
                for _, m in mbs:
                    lp, _, T, _ = logprobs(model, m, optim)
                    mask = m.loss_mask[:, :T]
                    part = -(lp * mask).sum() / float(batch.loss_mask.sum())
                    part.backward()
                    loss += float(part.detach())
                if info.is_cuda:
                    torch.cuda.synchronize()
                runs.append(time.perf_counter() - t0)
                model.zero_grad(set_to_none=True)
        except Exception as e:  # noqa: BLE001 -- an out-of-memory or a kernel refusal is a row of the table
            print(f"| {name} | | failed: {type(e).__name__}: {str(e)[:200]} | | | | |", flush=True)
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache() if info.is_cuda else None
            continue
        peak = torch.cuda.max_memory_allocated() / 2**30 if info.is_cuda else float("nan")
        s = min(runs[1:])
        # MFU over bf16 dense peak (H100/H200 SXM: 989 TFLOP/s), counting the unpacked batch's tokens (what the
        # step trains on): packing's saved work shows as a higher MFU
        mfu = 6 * n_params * tokens / s / 989e12 if info.is_cuda else float("nan")
        print(
            f"| {name} | {len(mbs)} | {s:.3f} | {peak:.1f} | {tokens / s:,.0f} | {mfu:.1%} | {loss:.5f} |",
            flush=True,
        )
    del model
    torch.cuda.empty_cache() if info.is_cuda else None


PARTS = ("families", "gradients", "speed", "7b", "noise", "qlora", "profile", "real")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--speed-groups", type=int, default=8)
    ap.add_argument("--speed-shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument(
        "--row-tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="pack_row_tokens to time"
    )
    ap.add_argument("--reps", type=int, default=3, help="passes per setting, the first a warm-up")
    # part 7's workload; the defaults are the GPU's full shape (on the CPU: the dry run's model, 2 groups, short rows)
    ap.add_argument("--real-layers", type=int, default=None, help="real: decoder layers (default 30; CPU: 2)")
    ap.add_argument("--real-groups", type=int, default=None, help="real: prompts of 8 answers (default 8; CPU: 2)")
    ap.add_argument(
        "--real-answers", type=int, nargs=2, default=None, help="real: answer lengths (default 64 512; CPU: 16 64)"
    )
    ap.add_argument("--real-reps", type=int, default=3, help="real: timed steps per setting, after a warm-up")
    ap.add_argument(
        "--real-micro-tokens", type=int, default=0, help="real: micro-batch token budget (0: the run's 16 rows)"
    )
    args = ap.parse_args()
    info = dist.init_distributed()
    name = torch.cuda.get_device_name() if info.is_cuda else "cpu"
    import transformers

    from nanosky.train import grouped_attention

    kernel = grouped_attention.varlen_kernel()
    sig = str(inspect.signature(kernel)) if kernel else "none"
    print(f"device {name} | torch {torch.__version__} | transformers {transformers.__version__} | world {info.world}")
    print(f"varlen_attn{sig}", flush=True)
    for part in args.parts:
        t0 = time.perf_counter()
        try:
            if part == "families":
                with tempfile.TemporaryDirectory() as out:
                    families(info, out, decide("auto", info.device.type).build_tol)
            elif part == "gradients":
                gradients(info)
            elif part == "speed":
                for shape in args.speed_shapes:
                    rows = args.row_tokens if shape == "0.5b" else [r for r in args.row_tokens if r >= 2048]
                    speed(info, shape, args.speed_groups, rows, args.reps if shape == "0.5b" else 2)
            elif part == "7b":
                seven_b(info)
            elif part == "noise":
                noise(info)
            elif part == "qlora":
                qlora(info)
            elif part == "profile":
                profile(info)
            elif part == "real":
                real(
                    info, args.real_layers, args.real_groups, args.real_answers, args.real_reps, args.real_micro_tokens
                )
        except Exception:  # noqa: BLE001 -- the next part still runs
            traceback.print_exc()
            torch.cuda.empty_cache() if info.is_cuda else None
        print(f"[{part}: {time.perf_counter() - t0:.0f} s]", flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
