"""The train phase of a step-wise agent step, alone: forward + backward over one rank's share of alfworld_lite turn
rows, for several micro-batch token budgets, with and without scoring only the loss mask (`packing.logprobs`'s
`keep`). One thread, like one rank of the 2-rank runs; every setting runs back to back on the same rows.

    python bench/train_phase.py [--episodes 32] [--budgets 4096 1024 768]

The rows are what `--preset alfworld_lite` trains on: `stepwise.window(messages, 2)` prompts of the bundled
`tiny-agent` chat template, with a mix of expert, random admissible and invalid actions, 30-turn episodes when they
fail, groups of 8 episodes per task.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import envs
from nanosky.agent.window import window
from nanosky.bundled import resolve_model_path
from nanosky.rollout.chat import prompt_ids
from nanosky.train import packing


def turn_rows(tok, episodes: int, group: int = 8, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, action ids) for every turn of `episodes` episodes, `group` per task."""
    rng, rows = random.Random(seed), []
    for e in range(episodes):
        env = envs.make("alfworld_lite", split="train", seed=e // group, show_actions=True, n_receptacles=[3, 5])
        msgs = env.reset()
        for _ in range(env.max_turns):
            r = rng.random()  # the start model's mix: ~40 % of its commands are not admissible
            a = env.expert_action() if r < 0.3 else rng.choice(env.available_actions()) if r < 0.6 else "go to shelf 7"
            rows.append(
                (
                    prompt_ids(tok, window(msgs, 2)),
                    tok(a + "<|im_end|>", add_special_tokens=False)["input_ids"],
                )
            )
            res = env.step(a)
            msgs += [{"role": "assistant", "content": a}, *res.observations]
            if res.done:
                break
    return rows


def train_phase(model, rows, budget: int, row_tokens: int, keep_only: bool) -> tuple[float, int]:
    """Seconds for forward + backward over `rows` in micro-batches of `budget` tokens (packed rows of at most
    `row_tokens`), and the tokens computed."""
    seqs = [p + a for p, a in rows]
    T = max(map(len, seqs)) - 1
    plan = packing.plan_micro_batches(seqs, 0, budget, share=True)
    t0, computed = time.perf_counter(), 0
    for ix in plan:
        p = packing.pack([seqs[i] for i in ix], T, row_tokens=row_tokens)
        mask = torch.zeros(len(ix), T, dtype=torch.bool)
        for j, i in enumerate(ix):
            n = len(rows[i][0])
            mask[j, n - 1 : n - 1 + len(rows[i][1])] = True  # positions that predict an action token
        lp, _ = packing.logprobs(model, p, keep=mask if keep_only else None)
        (lp * mask).sum().backward()
        computed += p.unique_tokens
    return time.perf_counter() - t0, computed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=32, help="one rank's episodes (4 tasks x 8 in the preset)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[4096, 1024, 768])
    ap.add_argument("--row-tokens", type=int, default=1024, help="--optim.pack-row-tokens (its default)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = resolve_model_path("tiny-agent")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    rows = turn_rows(tok, args.episodes)
    n_tok = sum(len(p) + len(a) for p, a in rows)
    print(f"{len(rows)} turn rows, {n_tok} tokens ({n_tok / len(rows):.0f} per row), 1 thread")
    train_phase(model, rows[:8], 1024, args.row_tokens, False)  # warm-up: allocator, thread pool
    print("| micro-batch tokens | scored positions | train phase s | tokens computed | tokens / s |")
    print("|---|---|---|---|---|")
    for budget in args.budgets:
        for keep_only in (False, True):
            s, computed = train_phase(model, rows, budget, args.row_tokens, keep_only)
            what = "loss mask only" if keep_only else "all"
            print(f"| {budget} | {what} | {s:.2f} | {computed} | {computed / s:.0f} |", flush=True)


if __name__ == "__main__":
    main()
