"""A TRL-style reward function, as TRL's GRPOTrainer takes it, used unchanged by `--env dataset`:

    torchrun --nproc_per_node 2 run.py --env dataset --env-data train.jsonl \
        --env-kwargs.reward examples.trl_reward:answer_match

`fn(prompts, completions, **columns) -> list[float | None]`, called once per group: `completions` are strings for a
string prompt (chat lists for a chat prompt), and every other column of the rows comes as a list (`answer` here).
"""

import re


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def answer_match(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 where the last <answer>...</answer> equals the row's answer (after GSM8K's "####", case and spaces
    ignored), 0.1 for a well-formed wrong one, 0.0 without the tags."""
    out = []
    for completion, gold in zip(completions, answer):
        tags = re.findall(r"<answer>(.*?)</answer>", _text(completion), flags=re.S)
        want = str(gold).rsplit("####", 1)[-1].strip().lower()
        out.append(0.0 if not tags else 1.0 if tags[-1].strip().lower() == want else 0.1)
    return out
