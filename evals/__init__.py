"""Evaluation suite: one entry point per benchmark, sharing flags, outputs and the model backends.

    python -m evals.math      --ckpt runs/demo-grpo        # GSM8K / MATH-style / text_math: accuracy, pass@k
    python -m evals.agent     --ckpt runs/tool_use-grpo    # HLE-schema questions with search / wiki / python_exec
    python -m evals.swebench  --ckpt runs/swe-grpo         # SWE-bench-schema instances, graded locally
    python -m evals.swebench  --predictions gold          # grade patches without a model
    python -m evals.judged    --ckpt runs/reply-grpo       # an env's test split scored by a judge (--reward.*)

--ckpt takes a run dir (its latest checkpoint), a checkpoint (checkpoints/step_N) or any HF model folder.
Common flags (evals/common.py): --ckpt | --base-url/--model, --data/--instances, --limit, --seed, --n-samples,
--temperature, --max-steps, --out. Each run writes examples.jsonl (one line per episode, full trajectory, plus
one per skipped row), report.json, and prints a summary table. For in-training evaluation call
`evals.math.run(engine, tok, rows, cfg)` (likewise agent / swebench) and log `common.metrics(report, "eval/math")`.
"""
