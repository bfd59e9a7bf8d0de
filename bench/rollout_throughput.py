"""Rollout throughput: the continuous agent loop against raw vLLM `generate` over the same token counts.

    python bench/rollout_throughput.py --env tool_use --episodes 64
    python bench/rollout_throughput.py --env alfworld_lite --episodes 16

One process, the env's training preset (model, context, budgets), an env pool of 2 workers. First the agent loop
plays `episodes` episodes (after a warm-up round); then every assistant turn it sampled is replayed as one raw
`LLM.generate` call: the same prompt ids, the same number of new tokens (min_tokens = max_tokens, eos ignored), all
turns at once. Raw generate has no env steps and no turn dependencies, so it is the ceiling the loop is measured
against. Printed: tokens/s of each, their ratio, and the engine's busy share during the loop.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Args:
    env: str = "tool_use"
    """An env with a training preset: tool_use, webshop_lite, alfworld_lite (or math with the default config)."""
    episodes: int = 64
    warmup: int = 8
    seed: int = 0


def turns(traj) -> list[tuple[list[int], int]]:
    """(prompt ids, sampled token count) of each assistant turn: the runs of loss-mask 1 in the token stream."""
    out, i, m = [], 0, traj.loss_mask
    while i < len(m):
        if m[i]:
            j = i
            while j < len(m) and m[j]:
                j += 1
            out.append((traj.ids[:i], j - i))
            i = j
        else:
            i += 1
    return out


def main(args: Args) -> None:
    from transformers import AutoTokenizer
    from vllm import SamplingParams, TokensPrompt

    from nanosky import dist
    from nanosky.agent import EngineBackend
    from nanosky.config import PRESETS
    from nanosky.engine import Engine
    from nanosky.envpool import make_pool
    from nanosky.policy import resolve_model_path
    from nanosky.rollout import Rollout

    cfg = PRESETS[args.env if args.env in PRESETS else "default"]()
    cfg.env = args.env
    info = dist.init_distributed()
    path = resolve_model_path(cfg.model.path)
    tok = AutoTokenizer.from_pretrained(path)
    engine = Engine(cfg.engine, path, info)
    pool = make_pool(2, cfg.envpool.step_timeout_s)
    rollout = Rollout(cfg.rollout, EngineBackend(engine, tok), pool, tok)

    def play(seeds: list[int]):
        t0 = time.perf_counter()
        trajs = rollout.run(cfg.env, cfg.env_args(), "train", seeds, 0, sample_seed=args.seed)
        return trajs, time.perf_counter() - t0

    play(list(range(10_000, 10_000 + args.warmup)))  # compile paths, fill the worker pool
    trajs, wall = play(list(range(args.episodes)))
    loop_tokens = sum(t.completion_tokens for t in trajs)
    busy = rollout.metrics["rollout/engine_busy_frac"]

    reqs = [t for traj in trajs for t in turns(traj)]
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in reqs]
    params = [
        SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=1.0, seed=args.seed + i)
        for i, (_, n) in enumerate(reqs)
    ]
    engine.llm.generate(prompts[:8], params[:8], use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = engine.llm.generate(prompts, params, use_tqdm=False)
    raw_wall = time.perf_counter() - t0
    raw_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    pool.shutdown()

    loop_tps, raw_tps = loop_tokens / wall, raw_tokens / raw_wall
    print(
        f"{args.env}: {args.episodes} episodes, {len(reqs)} turns, {loop_tokens} sampled tokens "
        f"(raw replay {raw_tokens})\n"
        f"  agent loop      {wall:7.2f} s  {loop_tps:8.1f} tokens/s  engine busy {busy:.0%}\n"
        f"  raw generate    {raw_wall:7.2f} s  {raw_tps:8.1f} tokens/s\n"
        f"  loop / raw      {loop_tps / raw_tps:.2f}"
    )
    dist.shutdown()


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
