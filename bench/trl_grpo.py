"""Reference benchmark: TRL's GRPOTrainer on the same shape as `make bench`, the bundled model, CPU.

    torchrun --standalone --nproc_per_node 2 bench/trl_grpo.py [--steps 6] [--shape math|agent] [--model smollm2-135m]

Needs `pip install trl==1.16.0` (not a project dependency; it only adds datasets/pandas/pyarrow & co.).
Prints the median seconds per optimizer step over the steps after the first and, as its last line,
`step_s=<median>` (the same format as bench/step_time.py).

The shape, in TRL 1.16's terms. `per_device_train_batch_size` counts completions, not prompts. TRL generates one
"generation batch" of `per_device_train_batch_size * world * steps_per_generation` completions, where
`steps_per_generation` defaults to `gradient_accumulation_steps`, then splits it into that many micro-batches of the
optimizer step. With 2 ranks, per_device_train_batch_size=64 and gradient_accumulation_steps=2:
  generation batch = 64 * 2 * 2 = 256 completions = 32 prompts × num_generations 8, one `generate` per step
  (128 sequences per rank), trained as 2 micro-batches of 64 per rank (nanosky's bench uses micro_batch_size=64),
  then one optimizer step. num_iterations=1, so TRL skips the old-logprob pass (the policy is its own old policy).
Everything else matches nanosky's `--preset bench`: max 32 new tokens, temperature 1, AdamW lr 5e-4,
grad clip 1.0, clip ε 0.2, token-mean loss over the global batch (TRL's "dapo" loss type), no KL (beta=0), fp32 (`--bf16`: TRL's bf16=True, against nanosky's --precision bf16),
gradient checkpointing off, one intra-op thread per rank. Differences that remain: TRL wraps the model in DDP, not
FSDP2, and generates with HF `generate` (use_vllm=False) instead of a colocated vLLM engine.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network at run time
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Only for --vllm: an in-process engine (colocation) with a KV cache sized for a tiny model, not 30 % of host RAM.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from shapes import MAX_TOTAL, SYSTEM  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from envs import text_math  # noqa: E402
from nanosky.bundled import resolve_model_path  # noqa: E402

GROUP, NEW_TOKENS = 8, 32


class StepTimer(TrainerCallback):
    """Wall time between consecutive optimizer-step ends (the first step is timed from the start of training)."""

    def __init__(self):
        self.last, self.times = 0.0, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.times.append(now - self.last)
        self.last = now


class TimedGRPOTrainer(GRPOTrainer):
    """Records the rollout phase (generate + reward + advantages), so train = step − rollout."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollout_s: list[float] = []

    def _generate_and_score_completions(self, inputs):
        t0 = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self.rollout_s.append(time.perf_counter() - t0)
        return out


def math_reward(completions, answer, **kwargs) -> list[float]:
    # Conversational prompts: each completion is [{"role": "assistant", "content": text}].
    return [text_math.score(c[0]["content"], a)[0] for c, a in zip(completions, answer)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument(
        "--prompts", type=int, default=32, help="prompts a step (x 8 samples); bench/step_time.py's --prompts"
    )
    ap.add_argument("--model", default="tiny", help="a bundled name (tiny, smollm2-135m), a .gguf or an HF folder")
    ap.add_argument("--vllm", action="store_true", help="use_vllm=True, vllm_mode='colocate' (expected to fail on CPU)")
    ap.add_argument("--shape", choices=sorted(SYSTEM), default="math")
    ap.add_argument(
        "--bf16", action="store_true", help="bf16=True (autocast on the CPU), against nanosky's --precision bf16"
    )
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", 1))
    PROMPTS = args.prompts
    if (PROMPTS * GROUP) % (2 * world):
        sys.exit(f"world size {world}: {PROMPTS}x{GROUP} completions do not split into 2 micro-batches a rank")
    # Like nanosky.dist: ranks share the cores, one intra-op thread each or they fight over them.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))

    path = resolve_model_path(args.model)  # (a GGUF: converted once, under a file lock)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    problems = [text_math.train_problem(seed) for seed in range(PROMPTS * (args.steps + 1))]
    data = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM[args.shape]},
                    {"role": "user", "content": p.question},
                ],
                "answer": p.answer,
            }
            for p in problems
        ]
    )
    cfg = GRPOConfig(
        output_dir="/tmp/nanosky-trl-bench",  # nothing is saved (save_strategy="no")
        max_steps=args.steps,
        # 64 completions per micro-batch per rank × 2 accumulation steps × world 2 = 256 = 32 prompts × 8 samples
        # (bench/step_time.py's micro-batch: the same 2 a rank).
        per_device_train_batch_size=PROMPTS * GROUP // (2 * world),
        gradient_accumulation_steps=2,
        num_generations=GROUP,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        num_iterations=1,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        learning_rate=5e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        bf16=args.bf16,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,  # every parameter gets a gradient; the extra graph walk costs time
        use_vllm=args.vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.05,
        vllm_max_model_length=MAX_TOTAL[args.shape],
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    timer = StepTimer()
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=math_reward,
        args=cfg,
        train_dataset=data,
        processing_class=tok,
        callbacks=[timer],
    )
    trainer.train()
    if trainer.accelerator.is_main_process:
        # Drop the first step (warm-up); one rollout per optimizer step (see the docstring), so the lists align.
        times, rollout = timer.times[1:] or timer.times, trainer.rollout_s[1:] or trainer.rollout_s
        train = [t - r for t, r in zip(times, rollout)]
        print(
            f"model {args.model}, shape: {args.shape}, {world} ranks, {PROMPTS} prompts x {GROUP} samples x {NEW_TOKENS} new tokens, TRL GRPOTrainer "
            f"({'colocated vLLM' if args.vllm else 'HF generate'}, {'bf16' if args.bf16 else 'fp32'}), steps {args.steps} (first dropped)"
        )
        print("per-step s: " + " ".join(f"{t:.3f}" for t in timer.times))
        print(f"{'rollout_s (generate+reward)':28s} {statistics.median(rollout):8.3f}")
        print(f"{'train_s (step - rollout)':28s} {statistics.median(train):8.3f}")
        print(f"step_s={statistics.median(times):.3f}")


if __name__ == "__main__":
    main()
