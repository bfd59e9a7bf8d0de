"""Zero-shot held-out accuracy of a model on text_math's test split, by kind and level, in both answer formats
(issue 61: a preset's task must sit where the base model is between 5 % and 50 %).

    python bench/zero_shot.py --model smollm2-135m [--samples 4 --max-tokens 192 --precision auto]

One engine, the env's own prompt and scorer (`envs.text_math.TextMathEnv(answer_format=...)`), T = 1 mean@n as the
run's eval samples, and greedy. Prints a markdown table.
"""

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--formats", default="hashes,tags")
    ap.add_argument("--temperature", type=float, default=1.0, help="the sampled column's T (a preset's eval T)")
    args = ap.parse_args()

    from envs.text_math import TextMathEnv, test_problems
    from nanosky import dist, precision
    from nanosky.bundled import resolve_model_path
    from nanosky.rollout.chat import load_tokenizer, prompt_ids
    from nanosky.rollout.engine import Engine, EngineConfig, SamplingSpec

    path = resolve_model_path(args.model)
    info = dist.init_distributed()
    prec = precision.decide(args.precision, info.device.type)
    engine = Engine(EngineConfig(kv_cache_gib=2, max_model_len=1024, seed=0), path, info, precision=prec)
    tok = load_tokenizer(path)
    n_test = len(test_problems())
    print(f"model {args.model} ({path}), {prec.line()}, {n_test} held-out problems, {args.max_tokens} tokens")
    t = f"T={args.temperature:g}"
    print(f"| format | kind | level | n | greedy | {t} mean@{args.samples} | replies with the format ({t}) |")
    print("|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        envs = [TextMathEnv(split="test", seed=i, answer_format=fmt) for i in range(n_test)]
        prompts = [prompt_ids(tok, e.reset()) for e in envs]
        t0 = time.perf_counter()
        greedy = engine.generate(prompts, SamplingSpec(max_tokens=args.max_tokens, temperature=0.0), engine.version)
        spec = SamplingSpec(n=args.samples, max_tokens=args.max_tokens, temperature=args.temperature)
        sampled = engine.generate(prompts, spec, engine.version, seeds=list(range(len(prompts))))
        n_tok = sum(len(g.token_ids) for outs in (greedy, sampled) for o in outs for g in o)
        cells = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for e, [g], s in zip(envs, greedy, sampled):
            p = e.problem
            for key in ((p.kind, p.level), (p.kind, "all"), ("all", "all")):
                c = cells[key]
                c[0] += 1
                c[1] += e.step(tok.decode(g.token_ids, skip_special_tokens=True)).info["success"]
                res = [e.step(tok.decode(x.token_ids, skip_special_tokens=True)).info for x in s]
                c[2] += sum(r["success"] for r in res) / len(res)
                c[3] += sum(r["format_ok"] for r in res) / len(res)
        for (kind, level), (n, g, m, f) in sorted(cells.items(), key=lambda kv: (kv[0][0] == "all", str(kv[0]))):
            print(f"| {fmt} | {kind} | {level} | {n} | {g / n:.3f} | {m / n:.3f} | {f / n:.3f} |", flush=True)
        print(
            f"({fmt}: {n_tok} tokens in {time.perf_counter() - t0:.0f} s, {n_tok / (time.perf_counter() - t0):.0f} tok/s)"
        )
    dist.shutdown()


if __name__ == "__main__":
    main()
