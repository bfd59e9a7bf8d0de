"""The workload and the 7B-shaped, QLoRA, profiler and SmolLM2-shaped train-phase parts of bench/gpu_check.py (run them
through it: `--parts 7b noise qlora profile real`). Each takes the process's DistInfo and prints its own table."""

from __future__ import annotations

import gc
import math
import random
import statistics
import time

import torch

from nanosky.agent.trajectory import Trajectory
from nanosky.bundled import resolve_model_path
from nanosky.precision import decide
from nanosky.train import packing
from nanosky.train.batch import to_batch
from nanosky.train.policy import shard_model
from nanosky.train.update import OptimConfig, logprobs

QWEN_7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)
SHAPES = {  # Qwen2.5 configs (no download); "7b-width" keeps 8 of the 7B's 28 layers so one GPU trains it in fp32
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "7b-width": QWEN_7B | {"num_hidden_layers": 8},
}
SMOLLM2_135M = dict(  # HuggingFaceTB/SmolLM2-135M-Instruct's config.json (LlamaForCausalLM; no download)
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
)
DRY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
)
"""The CPU's dry run: the same code on a model it can afford, in place of any shape."""


def qwen_config(shape: dict, info, **over):
    """A Qwen2 config of `shape` (SDPA, 4k positions); on the CPU, the dry run's small model. `over` wins."""
    from transformers import Qwen2Config

    dims = shape | ({} if info.is_cuda else DRY) | over
    return Qwen2Config(**dims, max_position_embeddings=4096, attn_implementation="sdpa")


def scaled_7b(info):
    """A random model shaped like Qwen2.5-7B, full depth, in bf16 (fp32 on the CPU), forward only (~15 GB), its head
    scaled so logits reach ±20, as a trained 7B gives them."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(info.device):
        model = Qwen2ForCausalLM(qwen_config(QWEN_7B, info)).to(torch.bfloat16 if info.is_cuda else torch.float32)
    model.config.use_cache = False
    with torch.no_grad():
        h = model.model(input_ids=torch.randint(3, 1000, (1, 64), device=info.device)).last_hidden_state
        model.lm_head.weight.mul_(20 / float(model.lm_head(h).abs().amax()))
    return model


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


def seven_b(info) -> None:
    """Part 4: the packing check at Qwen2.5-7B's shape in bf16, and activation memory at its width."""
    from transformers import Qwen2ForCausalLM

    from nanosky.train import grouped_attention
    from nanosky.train.policy import checkpoint_activations

    model = scaled_7b(info)
    cfg = model.config
    print(f"\n## 4. Qwen2.5-7B shape ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size})", flush=True)
    p = packing
    ok_target = p.verify(model, p.lm_forward(model), tol=math.inf)  # target tokens, as the check compares now
    g = torch.Generator().manual_seed(0)  # the full vocabulary, as the check compared before issue 45
    prefix = torch.randint(3, cfg.vocab_size, (256,), generator=g).tolist()
    seqs = [prefix + torch.randint(3, cfg.vocab_size, (256 - k,), generator=g).tolist() for k in (0, 3, 7)]
    q = p.pack(seqs, T=511, device=info.device)
    with torch.no_grad():
        packed = q.gather(p.lm_forward(model)(q.input_ids, p.attention_mask(model, q), q.position_ids))
        worst = 0.0
        for i, s_ in enumerate(seqs):
            ids = torch.tensor([s_], device=info.device)
            out = p.lm_forward(model)(ids, torch.ones_like(ids), None)[0, : len(s_) - 1]
            worst = max(worst, float((packed[i, : len(s_) - 1].float() - out.float()).abs().max()))
    tol = decide("auto", info.device.type).build_tol
    print(
        f"packing check: target tokens max |Δ| {ok_target:.3g}, full vocabulary {worst:.3g} (tolerance {tol})",
        flush=True,
    )
    for name in ("dense mask", "grouped"):  # the check as the trainer runs it: its tolerance, calibrated
        if name == "grouped" and not grouped_attention.enable(model):
            continue
        try:
            verdict = f"passes, max |Δ| {p.verify(model, p.lm_forward(model), tol=tol):.3g}"
        except p.PackingUnsupported as e:
            verdict = f"refuses: {e}"
        print(f"the build check ({name}): {verdict}", flush=True)
    grouped_attention.disable(model)
    # The weight-sync probe's floor: the same (bf16-valued) weights computed in bf16 and in fp32, log p of the
    # sampled tokens of 4 rows of 512. A trainer and an engine in bf16 differ at least by kernels' rounding.
    ids = torch.randint(3, cfg.vocab_size, (4, 512), generator=g).to(info.device)
    with torch.no_grad():
        lp16 = p.lm_forward(model)(ids, torch.ones_like(ids), None)[:, :-1].gather(-1, ids[:, 1:, None])
        model.float()
        lp32 = p.lm_forward(model)(ids, torch.ones_like(ids), None)[:, :-1].gather(-1, ids[:, 1:, None])
    d = (lp16 - lp32).abs()
    print(f"bf16 vs fp32 forward, target-token |Δlogp|: mean {float(d.mean()):.3g}, max {float(d.max()):.3g}")
    del model, packed, lp16, lp32
    torch.cuda.empty_cache() if info.is_cuda else None

    cfg = qwen_config(QWEN_7B, info, num_hidden_layers=4)
    print("| activation checkpointing | micro-batch | peak GiB | above the weights GiB | s / pass |")
    print("|---|---|---|---|---|")
    for ckpt in (False, True):
        torch.manual_seed(0)
        with torch.device(info.device):
            model = Qwen2ForCausalLM(cfg)  # fp32 masters; the trainer computes in bf16 under FSDP
        model.config.use_cache = False
        if ckpt:
            checkpoint_activations(model)
        model = shard_model(model, info, precision=decide("auto", info.device.type))
        for rows, L in ((8, 1024), (8, 4096)) if info.is_cuda else ((2, 64),):
            trajs = workload(cfg.vocab_size, rows // 8 or 1, 8, L // 2, (L // 2, L // 2))
            batch = to_batch(trajs, 0, info.device)
            optim = OptimConfig(packing="none", micro_batch_size=len(trajs))
            try:  # forward + backward only: what one micro-batch holds (gradients included, no copies of them)
                for _ in range(2):  # the second pass: gradients allocated, as in an update's later micro-batches
                    if info.is_cuda:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                    base, t0 = torch.cuda.memory_allocated() if info.is_cuda else 0, time.perf_counter()
                    lp, _, T, _ = logprobs(model, batch, optim)
                    (-(lp * batch.loss_mask[:, :T]).sum() / batch.loss_mask.sum()).backward()
                    torch.cuda.synchronize() if info.is_cuda else None
                    took = time.perf_counter() - t0
                    del lp
                peak = torch.cuda.max_memory_allocated() / 2**30 if info.is_cuda else float("nan")
                above = peak - base / 2**30
                row = f"{peak:.1f} | {above:.1f} | {took:.2f}"
            except torch.OutOfMemoryError:
                row = "out of memory | | "
            model.zero_grad(set_to_none=True)
            print(f"| {'on' if ckpt else 'off'} | {len(trajs)} x {L} tokens | {row} |", flush=True)
        del model
        torch.cuda.empty_cache() if info.is_cuda else None


def noise(info) -> None:
    """Part 4b: what bf16 rounding alone moves on the packing check's probe, on the 7B-shaped model: the gap the
    packed forward shows beside gaps between forwards that compute the same thing (attention kernel, batching)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print("\n## 4b. bf16 noise on the packing probe, Qwen2.5-7B shape, logits to ±20", flush=True)
    model = scaled_7b(info)
    vocab = model.config.vocab_size
    fwd = packing.lm_forward(model)
    print("| probe | packed vs unpacked | unpacked: flash vs math SDPA | unpacked: alone vs 3 padded rows |")
    print("|---|---|---|---|")
    for n in (48, 512):
        g = torch.Generator().manual_seed(0)
        prefix = torch.randint(3, vocab, (n // 2,), generator=g).tolist()
        seqs = [prefix + torch.randint(3, vocab, (n - n // 2 - k,), generator=g).tolist() for k in (0, 3, 7)]
        q = packing.pack(seqs, T=n - 1, device=info.device)

        def target(out, i, seqs=seqs):  # [len - 1] log p of each next token
            ids = torch.tensor(seqs[i][1:], device=info.device)[:, None]
            return out[: len(seqs[i]) - 1].float().gather(-1, ids)[:, 0]

        with torch.no_grad():
            packed = q.gather(fwd(q.input_ids, packing.attention_mask(model, q), q.position_ids))
            alone = [fwd(torch.tensor([s], device=info.device), None, None)[0] for s in seqs]
            with sdpa_kernel(SDPBackend.MATH):
                math_ = [fwd(torch.tensor([s], device=info.device), None, None)[0] for s in seqs]
            rows = torch.zeros(3, n, dtype=torch.long, device=info.device)
            att = torch.zeros_like(rows)
            for i, s in enumerate(seqs):
                rows[i, : len(s)], att[i, : len(s)] = torch.tensor(s), 1
            batched = fwd(rows, att, None)
        cells = []
        for other in ([packed[i] for i in range(3)], math_, [batched[i] for i in range(3)]):
            d = torch.cat([(target(other[i], i) - target(alone[i], i)).abs() for i in range(3)])
            cells.append(f"max {float(d.max()):.3g}, mean {float(d.mean()):.3g}")
        print(f"| {n} tokens | {' | '.join(cells)} |", flush=True)
    del model
    torch.cuda.empty_cache() if info.is_cuda else None


def profile(info) -> None:
    """Part 6: where a 0.5B pass's GPU time goes: padded vs grouped (varlen) at rows of 4096, the top kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    from transformers import Qwen2ForCausalLM

    from nanosky.train import grouped_attention
    from nanosky.train.update import micro_batches

    cfg = qwen_config(SHAPES["0.5b"], info)
    torch.manual_seed(0)
    with torch.device(info.device):
        model = Qwen2ForCausalLM(cfg)
    model.config.use_cache = False
    model = shard_model(model, info, precision=decide("auto", info.device.type))
    trajs = workload(cfg.vocab_size, 8, 8, 512, (128, 1024)) if info.is_cuda else workload(4096, 2, 8, 64, (16, 64))
    batch = to_batch(trajs, 0, info.device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if info.is_cuda else [])
    for name, optim in (
        ("padded", OptimConfig(packing="none", micro_batch_size=8)),
        ("grouped varlen, rows of 4096", OptimConfig(packing="prefix", micro_batch_tokens=8192, pack_row_tokens=4096)),
    ):
        grouped_attention.enable(model) if optim.packing == "prefix" else grouped_attention.disable(model)

        def one_pass(model=model, optim=optim):
            for _, m in micro_batches(batch, optim):
                lp, _, T, _ = logprobs(model, m, optim)
                (-(lp * m.loss_mask[:, :T]).sum() / float(batch.loss_mask.sum())).backward()
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize() if info.is_cuda else None

        one_pass()  # warm-up
        with prof(activities=acts) as pr:
            one_pass()
        key = "self_cuda_time_total" if info.is_cuda else "self_cpu_time_total"
        print(f"\n## 6. profile, Qwen2.5-0.5B shape, {name}", flush=True)
        print(pr.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=60), flush=True)
    del model
    torch.cuda.empty_cache() if info.is_cuda else None


def qlora(info) -> None:
    """Part 5: QLoRA under FSDP2: train two steps, then the merged stream vs an independent dequantize-and-merge."""
    import copy

    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    from nanosky.train.lora import LoraConfig, iter_merged_params, load_lora_model, trainable_parameters
    from nanosky.train.policy import token_logprobs

    print(f"\n## 5. QLoRA (bitsandbytes {bnb.__version__}), bundled tiny, {info.device.type}", flush=True)
    cfg, path = LoraConfig(rank=4, alpha=8, qlora=True), resolve_model_path("tiny")
    model = load_lora_model(path, cfg, info, precision=decide("auto", info.device.type))
    opt = torch.optim.AdamW(trainable_parameters(model), lr=5e-2)
    for i in range(2):  # lora_B leaves zero: the merge really adds something
        ids = torch.randint(3, 500, (2, 12), generator=torch.Generator().manual_seed(i)).to(info.device)
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        (-lp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dtype = torch.bfloat16 if info.is_cuda else torch.float32  # the engine's dtype: what the sync sends
    t0 = time.perf_counter()
    merged = dict(iter_merged_params(model, dtype))
    took = time.perf_counter() - t0
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    full = lambda t: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float()  # noqa: E731
    sd = {k.removeprefix("base_model.model."): full(v) for k, v in model.state_dict().items()}
    worst, checked, scale = 0.0, 0, cfg.alpha / cfg.rank
    for name, a in sd.items():
        if not name.endswith(".lora_A.default.weight"):
            continue
        mod = name.removesuffix(".lora_A.default.weight")
        packed, state = bnb.functional.quantize_4bit(
            base[f"{mod}.weight"].to(info.device, torch.bfloat16),
            quant_type="nf4",
            quant_storage=torch.bfloat16,
        )
        state = copy.copy(state)
        state.dtype = torch.float32
        want = bnb.functional.dequantize_4bit(packed, state) + scale * sd[f"{mod}.lora_B.default.weight"] @ a
        got = merged[f"{mod}.weight"].float()
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        checked += 1
    print(
        f"merged stream: {len(merged)} tensors in {took:.2f} s; {checked} adapted weights vs independent "
        f"dequantize + merge: max relative |Δ| {worst:.2e} (bf16 rounding is 3.9e-3)",
        flush=True,
    )


def smollm2_checkpoint(info, out: str, layers: int | None = None):
    """A random model shaped like SmolLM2-135M-Instruct, saved in `out` in bf16 as the real checkpoint is stored, so
    the run's loaders read it as they read a download (fp32 master weights). On the CPU the dry run's dims (`DRY`).
    `layers` overrides the depth. Returns its config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = SMOLLM2_135M | ({} if info.is_cuda else DRY) | ({"num_hidden_layers": layers} if layers else {})
    torch.manual_seed(0)
    with torch.device(info.device):  # initialised on the GPU: seconds less than the CPU's init of 135M
        model = LlamaForCausalLM(LlamaConfig(**dims))
    model.to(torch.bfloat16).save_pretrained(out)
    cfg = model.config
    del model
    return cfg


def train_steps(info, path: str, prec, lora, optim: OptimConfig, trajs, reps: int) -> dict:
    """One setting of part 7, built as `nanosky.trainer.build` builds a run: the policy (`load_policy`: adapters
    injected before FSDP2 shards it), the build's plan (`plan.decide`: chunked head, packing and its attention,
    checked on the model), `PolicyUpdate`; then the rows' advantages as `trainer.prepare` computes them, one warm-up
    step and `reps` timed ones (every micro-batch's forward + backward, grad clip, AdamW step)."""
    from algos import AlgoConfig
    from nanosky.train import plan as build_plan
    from nanosky.train.batch import compute_advantages, token_rewards
    from nanosky.train.lora import load_policy, trainable_parameters
    from nanosky.train.update import PolicyUpdate, micro_batches

    policy = load_policy(path, lora, info, False, precision=prec)  # activation checkpointing off: the default
    plan = build_plan.decide(optim, prec, policy, say=lambda line: print(f"  {line}", flush=True))
    optim = plan.optim(optim)
    update = PolicyUpdate(optim, AlgoConfig(), policy)  # GRPO, PPO-clip loss, no KL term: no reference model
    batch = to_batch(trajs, 0, info.device)
    compute_advantages(batch, update.algo, token_rewards(batch))
    sync = torch.cuda.synchronize if info.is_cuda else lambda: None
    update(batch)  # warm-up: kernels, the allocator, AdamW's state
    sync()
    torch.cuda.reset_peak_memory_stats() if info.is_cuda else None
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        out = update(batch)
        sync()
        times.append(time.perf_counter() - t0)
    return dict(
        s=statistics.median(times),
        peak=torch.cuda.max_memory_allocated() / 2**30 if info.is_cuda else float("nan"),
        trained=sum(p.numel() for p in trainable_parameters(policy)),
        attention=f"{plan.packing}" + (f", {plan.attention}" if plan.attention else ""),
        passes=len(micro_batches(batch, optim)),
        unpacked=out["tokens_unpacked"],  # the rows' tokens: what the step trains on
        computed=out["tokens_computed"],  # after sharing each prompt: the run's perf/train_tokens_per_s counts these
        grad_norm=out["grad_norm"],
    )


def real(info, layers=None, groups=None, answers=None, reps: int = 3, micro_tokens: int = 0) -> None:
    """Part 7: the train phase of a random model shaped like SmolLM2-135M-Instruct through the run's own code
    (`train_steps`), in fp32 and bf16 (`nanosky.precision.decide`), full fine-tuning and LoRA (rank 8, alpha 16, every
    linear layer of the blocks), on one GRPO step's rows: `groups` prompts x 8 answers."""
    import tempfile

    from transformers.utils import logging as hf_logging

    from nanosky.config.model import LoraConfig

    hf_logging.disable_progress_bar()  # as a run does: the loads' bars would break into the table
    cuda = info.is_cuda
    groups = groups or (8 if cuda else 2)
    lo, hi = answers or ((64, 512) if cuda else (16, 64))
    prompt = 128 if cuda else 32
    optim = OptimConfig(micro_batch_tokens=micro_tokens)  # 0: the run's default, 16 rows per micro-batch
    with tempfile.TemporaryDirectory() as out:
        cfg = smollm2_checkpoint(info, out, layers)
        trajs = workload(cfg.vocab_size, groups, 8, prompt, (lo, hi))
        rng = random.Random(1)
        for t in trajs:  # distinct rewards in every group: no advantage is 0, so no row is skipped
            t.reward = rng.random()
        tokens = sum(len(t.ids) for t in trajs)
        print(
            f"\n## 7. train phase, SmolLM2-135M shape ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
            f"vocab {cfg.vocab_size}), {info.device.type}\n{len(trajs)} rows ({groups} prompts x 8 answers, prompt "
            f"{prompt}, answers {lo}-{hi} tokens): {tokens} tokens | micro-batches of {optim.describe()} | "
            f"median of {reps} steps after a warm-up",
            flush=True,
        )
        stats = {}
        for name in ("fp32", "bf16"):
            for kind, lora in (("full", LoraConfig()), ("lora", LoraConfig(rank=8, alpha=16))):
                try:
                    stats[name, kind] = train_steps(info, out, decide(name, info.device.type), lora, optim, trajs, reps)
                except Exception as e:  # noqa: BLE001 -- an out-of-memory or a kernel refusal is a row of the table
                    stats[name, kind] = f"failed: {type(e).__name__}: {str(e)[:200]}"
                gc.collect()  # the setting's model, optimizer and activations go before the next is built
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
    print(
        "| setting | trained params | packing | micro-batches | s / step | tokens/s | computed tokens/s | peak GiB "
        "| grad norm |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, kind), r in stats.items():
        if isinstance(r, str):
            print(f"| {name} {kind} | | | | {r} | | | | |")
            continue
        peak = f"{r['peak']:.2f}" if cuda else "n/a"
        print(
            f"| {name} {kind} | {r['trained'] / 1e6:.2f}M | {r['attention']} | {r['passes']} | {r['s']:.3f} "
            f"| {r['unpacked'] / r['s']:,.0f} | {r['computed'] / r['s']:,.0f} | {peak} | {r['grad_norm']:.3g} |"
        )

    def ratio(a, b) -> str:  # seconds per step of a over b: < 1, a is faster
        ok = not isinstance(stats[a], str) and not isinstance(stats[b], str)
        return f"{stats[a]['s'] / stats[b]['s']:.2f}" if ok else "n/a"

    print(
        f"time ratios: bf16 / fp32 full {ratio(('bf16', 'full'), ('fp32', 'full'))}, lora "
        f"{ratio(('bf16', 'lora'), ('fp32', 'lora'))} | LoRA / full fp32 {ratio(('fp32', 'lora'), ('fp32', 'full'))}, "
        f"bf16 {ratio(('bf16', 'lora'), ('bf16', 'full'))}",
        flush=True,
    )
