"""Evaluation suite: one entry point per benchmark, sharing flags, outputs and the model backends.

    python -m evals.math      --ckpt runs/x/step_100      # GSM8K / MATH-style / text_math: accuracy, pass@k
    python -m evals.agent     --ckpt runs/x/step_100      # HLE-schema questions with search / wiki / python_exec
    python -m evals.swebench  --ckpt runs/x/step_100      # SWE-bench-schema instances, graded locally
    python -m evals.swebench  --predictions gold          # grade patches without a model

Common flags (evals/common.py): --ckpt | --base-url/--model, --data/--instances, --limit, --seed, --n-samples,
--temperature, --max-steps, --out. Each run writes examples.jsonl (one line per episode, full trajectory, plus
one per skipped row), report.json, and prints a summary table. For in-training evaluation call
`evals.math.run(engine, tok, rows, cfg)` (likewise agent / swebench) and log `common.metrics(report, "eval/math")`.
"""
