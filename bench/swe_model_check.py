"""Where a swe model's episodes fail, stage by stage, on held-out generated tasks (HF generate, no engine: a quick
check of a fresh `python -m nanosky.tiny --variant swe` build). Each episode runs in the real env (sandboxed tools,
graded on submit) as the swe preset runs it: concatenated turns, at most `--max-turns` turns.

    python bench/swe_model_check.py MODEL_DIR [--n 30] [--level 1] [--greedy]

Stages: the first call views the bug's file; some str_replace has an old_str that holds the gold patch's removed
lines (the buggy line, copied from the view); some str_replace or replace_lines has a new_str that holds its added
lines; some edit applied (a str_replace whose old_str matched, or a replace_lines); resolved.
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import envs
from envs.tools.parse import parse_tool_calls
from nanosky.rollout.chat import prompt_ids

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--n", type=int, default=30)
ap.add_argument("--level", type=int, default=1)
ap.add_argument("--max-turns", type=int, default=6)
ap.add_argument("--max-new-tokens", type=int, default=160)
ap.add_argument("--greedy", action="store_true")
args = ap.parse_args()

tok = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
torch.manual_seed(0)
stages = {
    "views the bug's file first": 0,
    "copies the bug into old_str": 0,
    "writes the fix in a new_str": 0,
    "an edit applied": 0,
    "resolved": 0,
}
for seed in range(args.n):
    env = envs.make("swe", "test", seed=seed, level=args.level, test_suite="generated", max_turns=args.max_turns)
    msgs, tools = env.reset(), [t.schema for t in env.tools]
    patch = env.instance["patch"].splitlines()
    added, removed = (
        [ln[1:].strip() for ln in patch if ln[:1] == c and ln[:3] != c * 3 and ln[1:].strip()] for c in "+-"
    )
    calls, applied, res = [], False, None
    for _ in range(args.max_turns):
        ids = prompt_ids(tok, msgs, tools)
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=args.max_new_tokens,
            do_sample=not args.greedy,
            temperature=1.0,
            top_p=1.0,
        )
        text = tok.decode(out[0, len(ids) :], skip_special_tokens=True).strip()
        parsed = parse_tool_calls(text)  # the env's own parser: a malformed call counts as no call
        calls.append(parsed[0].arguments if parsed and parsed[0].error is None else {})
        res = env.step(text)
        obs = res.observations[0]["content"] if res.observations else ""
        if calls[-1].get("command") in ("str_replace", "replace_lines") and not obs.startswith("Error"):
            applied = True
        msgs += [{"role": "assistant", "content": text}, *res.observations]
        if res.done:
            break
    first = calls[0] if calls else {}
    stages["views the bug's file first"] += (
        first.get("command") == "view" and first.get("path") == env.instance["bug"]["path"]
    )
    stages["copies the bug into old_str"] += any(
        c.get("command") == "str_replace" and all(r in str(c.get("old_str", "")) for r in removed) for c in calls
    )
    stages["writes the fix in a new_str"] += any(
        c.get("command") in ("str_replace", "replace_lines") and all(a in str(c.get("new_str", "")) for a in added)
        for c in calls
    )
    stages["an edit applied"] += applied
    stages["resolved"] += bool(res is not None and res.info.get("success"))
mode = "greedy" if args.greedy else "T = 1"
print(f"{args.model}: {args.n} held-out level-{args.level} tasks, {mode}")
for k, v in stages.items():
    print(f"  {k:28s} {v:3d} / {args.n}")
