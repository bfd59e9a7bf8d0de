"""text_math's level 1-2 arith and word problems, written as rows in SkyRL-Gym's `gsm8k` row layout.

These rows are NOT GSM8K. They are text_math's own templated problems ("What is 17 - 4?", "Ann has 12 pens. ...
How many pens does Ann have now?"; envs/text_math.py), kinds `arith` and `word`, levels 1 and 2 only, laid out
as SkyRL-Gym's `gsm8k` env reads a row, so that `--env skyrl_gym` scores them with SkyRL's own gsm8k reward (1.0
only for a reply holding `#### <answer>`):

    data_source  "nanosky/text_math" (not "openai/gsm8k")
    prompt       [{"role": "user", "content": <question> + " " + verl's instruction}], the instruction being
                 Let's think step by step and output the final answer after "####".
    env_class    "gsm8k"
    reward_spec  {"method": "rule", "ground_truth": <answer>}
    extra_info   {"split", "index", "question", "answer", "kind", "level"}: `answer` is text_math's worked
                 scratchpad ending in "#### <answer>" (the demonstration `--algo sft --env dataset` trains on),
                 `index` the train_problem seed (train) or the position in the held-out split (test, validation)

Train: `train_problem(seed)` for seeds 0, 1, 2, ..., keeping arith and word problems of levels 1-2, until `--train`
rows (the draws may repeat a question; text_math never draws a held-out one, and this script asserts it). Test: the
held-out `test_problems()` of those kinds and levels, 73 of them. `--validation` adds the validation split's
(`validation_problems()`) rows of those kinds and levels.

    python bench/text_math_skyrl_rows.py [--train 2000] [--out-dir .] [--validation]
    # -> text_math_skyrl_train.parquet, text_math_skyrl_test.parquet (+ text_math_skyrl_validation.parquet)
    torchrun --standalone --nproc_per_node 2 run.py --env skyrl_gym --env-data text_math_skyrl_train.parquet \\
        --env-kwargs.test-data text_math_skyrl_test.parquet --model.path smollm2-135m ...

The files that docs/experiments/real_model.md and warm_starts.md first measured (then named sk_train.parquet and
sk_test.parquet) were made by a script that was never committed. This one follows their description: the 73 test
problems should be the same (text_math's held-out split is fixed by its seed), but the 2,000 train draws and the
prompts' exact wording may differ from those files'.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs.text_math import Problem, test_problems, train_problem, validation_problems  # noqa: E402

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'  # verl's gsm8k instruction
KINDS = ("arith", "word")
LEVELS = (1, 2)
DATA_SOURCE = "nanosky/text_math"
NAMES = {s: f"text_math_skyrl_{s}.parquet" for s in ("train", "test", "validation")}


def wanted(p: Problem) -> bool:
    return p.kind in KINDS and p.level in LEVELS


def row(p: Problem, split: str, index: int) -> dict:
    """One problem as SkyRL-Gym's gsm8k env reads a row (SkyRL's examples/gsm8k layout)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{p.question} {INSTRUCTION}"}],
        "env_class": "gsm8k",
        "reward_spec": {"method": "rule", "ground_truth": p.answer},
        "extra_info": {
            "split": split,
            "index": index,
            "question": p.question,
            "answer": "\n".join([*p.steps, f"#### {p.answer}"]),
            "kind": p.kind,
            "level": p.level,
        },
    }


def held_out_rows(problems: list[Problem], split: str) -> list[dict]:
    return [row(p, split, i) for i, p in enumerate(problems) if wanted(p)]


def train_rows(n: int) -> list[dict]:
    """The first `n` train draws (seeds 0, 1, ...) of the wanted kinds and levels; none is a held-out question."""
    held = {p.question for p in test_problems()} | {p.question for p in validation_problems()}
    rows, seed = [], 0
    while len(rows) < n:
        p = train_problem(seed)
        if wanted(p):
            assert p.question not in held, f"train seed {seed} drew a held-out question: {p.question!r}"
            rows.append(row(p, "train", seed))
        seed += 1
    return rows


def write(rows: list[dict], path: str) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path)


def main(argv: list[str] | None = None) -> dict[str, int]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=2000, help="train rows (default 2000)")
    ap.add_argument("--out-dir", default=".", help="where the parquet files go (default .)")
    ap.add_argument("--validation", action="store_true", help="also write the validation split's rows")
    args = ap.parse_args(argv)
    splits = {"train": train_rows(args.train), "test": held_out_rows(test_problems(), "test")}
    if args.validation:
        splits["validation"] = held_out_rows(validation_problems(), "validation")
    test_questions = {r["extra_info"]["question"] for r in splits["test"]}
    assert not any(r["extra_info"]["question"] in test_questions for r in splits["train"]), "train shares a test row"
    os.makedirs(args.out_dir, exist_ok=True)
    counts = {}
    for split, rows in splits.items():
        path = os.path.join(args.out_dir, NAMES[split])
        write(rows, path)
        counts[split] = len(rows)
        print(f"{path}: {len(rows)} rows")
    return counts


if __name__ == "__main__":
    main()
