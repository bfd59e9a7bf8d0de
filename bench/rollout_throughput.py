"""Rollout throughput: the continuous agent loop against raw vLLM `generate` over the same token counts.

    python bench/rollout_throughput.py --env tool_use --episodes 64
    python bench/rollout_throughput.py --env alfworld_lite --episodes 16     # also webshop_lite, swe, math
    python bench/rollout_throughput.py --env math --preset smollm2_logic      # the real model

One process, the env's training preset (model, context, budgets), an env pool of 2 workers. First the agent loop
plays `episodes` episodes (after a warm-up round); then every assistant turn it sampled is replayed as one raw
`LLM.generate` request: the same prompt ids, the same number of new tokens (min_tokens = max_tokens, eos ignored).
Two replays: turn by turn (every episode's k-th turn in one call: the loop's own dependencies with zero env time
and perfect batches, the target of issue 12) and all turns at once (no dependencies: an upper bound no multi-turn
loop can reach). Printed: tokens/s of each, the ratios, and the engine's busy share during the loop; the engine's
batch (requests per engine step) in the loop and in both replays, and the loop's tail share (the time with fewer
than a quarter of its episodes running). On a 2-core box vLLM and the env workers share the cores: the engine's
tokens per busy second (against the replay's) is its own speed under that contention, and its idle share is the
part of loop / raw that scheduling and env waits cost.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from nanosky.precision import decide

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Args:
    env: str = "tool_use"
    """An env with a training preset: tool_use, webshop_lite, alfworld_lite, swe (or math: the default config)."""
    preset: str | None = None
    """The preset whose model, budgets and env kwargs to use (e.g. smollm2_logic: the real model); default: the env's."""
    episodes: int = 64
    warmup: int = 8
    seed: int = 0


def turns(traj) -> list[tuple[list[int], int]]:
    """(prompt ids, sampled token count) of each assistant turn: in step-wise mode each turn's own prompt (its
    history window, `traj.steps`), else the runs of loss-mask 1 in the token stream and what precedes them."""
    if traj.steps:  # the conversation itself may be longer than the context: each turn saw only its window
        return [(list(s.prompt_ids), len(s.ids)) for s in traj.steps]
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
    from nanosky.bundled import resolve_model_path
    from nanosky.collect import Rollout
    from nanosky.presets import PRESETS
    from nanosky.rollout.engine import Engine
    from nanosky.rollout.envpool import make_pool

    cfg = PRESETS[args.preset or (args.env if args.env in PRESETS else "default")]()
    cfg.env = args.env
    info = dist.init_distributed()
    path = resolve_model_path(cfg.model.path)
    tok = AutoTokenizer.from_pretrained(path)
    engine = Engine(cfg.engine, path, info, precision=decide(cfg.precision, info.device.type))
    pool = make_pool(2, cfg.envpool.step_timeout_s)
    rollout = Rollout(cfg.rollout, EngineBackend(engine, tok), pool, tok)

    def play(seeds: list[int]):
        t0 = time.perf_counter()
        out = rollout.run(cfg.env, cfg.env_args(), "train", seeds, version=0, sample_seed=args.seed)
        return out, time.perf_counter() - t0

    play(list(range(10_000, 10_000 + args.warmup)))  # compile paths, fill the worker pool
    steps0 = rollout.backend.engine_steps
    out, wall = play(list(range(args.episodes)))
    trajs, m = out.trajs, out.metrics
    loop_steps = rollout.backend.engine_steps - steps0
    loop_tokens = sum(t.completion_tokens for t in trajs)
    busy = m["rollout/engine_busy_frac"]
    batch, tail = m["rollout/engine_batch_mean"], m["rollout/tail_s"] / wall

    reqs = [t for traj in trajs for t in turns(traj)]
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in reqs]
    params = [
        # as the engine samples in the loop (sampled-token logprobs, special tokens kept), plus a fixed length
        SamplingParams(
            max_tokens=n,
            min_tokens=n,
            ignore_eos=True,
            temperature=1.0,
            seed=args.seed + i,
            logprobs=0,
            skip_special_tokens=False,
        )
        for i, (_, n) in enumerate(reqs)
    ]
    engine.llm.generate(prompts[:8], params[:8], use_tqdm=False)  # warm-up

    def raw(idx: list[list[int]]) -> tuple[float, int]:
        """Wall time and tokens of one `generate` call per index list, back to back."""
        t0, n = time.perf_counter(), 0
        for ids in idx:
            outs = engine.llm.generate([prompts[i] for i in ids], [params[i] for i in ids], use_tqdm=False)
            n += sum(len(o.outputs[0].token_ids) for o in outs)
        return time.perf_counter() - t0, n

    # Raw, by turn: every episode's k-th turn in one call (the loop's dependencies, zero env time, perfect batches).
    turn_no = [k for traj in trajs for k in range(len(turns(traj)))]
    by_turn = [[i for i, k in enumerate(turn_no) if k == t] for t in range(max(turn_no) + 1)]
    turn_wall, turn_tokens = raw(by_turn)
    min_steps = sum(max(reqs[i][1] for i in ids) for ids in by_turn)  # the longest turn of each call, in tokens
    all_wall, all_tokens = raw([list(range(len(reqs)))])  # raw, all turns at once: no dependencies at all
    rollout.close()
    pool.shutdown()

    loop_tps = loop_tokens / wall
    busy_tps = loop_tokens / max(busy * wall, 1e-9)  # tokens per second of engine time: the engine's own speed
    longest = max(n for _, n in reqs)
    print(
        f"{args.env}: {args.episodes} episodes, {len(reqs)} turns, {loop_tokens} sampled tokens\n"
        f"  agent loop (envs, tools)        {wall:7.2f} s  {loop_tps:8.1f} tokens/s  engine busy {busy:.0%}  "
        f"engine steps {loop_steps} (turn by turn needs >= {min_steps})\n"
        f"  raw generate, turn by turn      {turn_wall:7.2f} s  {turn_tokens / turn_wall:8.1f} tokens/s  "
        f"loop / raw {loop_tps / (turn_tokens / turn_wall):.2f}\n"
        f"  raw generate, all turns at once {all_wall:7.2f} s  {all_tokens / all_wall:8.1f} tokens/s  "
        f"loop / raw {loop_tps / (all_tokens / all_wall):.2f}\n"
        f"  engine batch (requests per engine step): loop {batch:.1f}, replay by turn {turn_tokens / min_steps:.1f}, "
        f"replay at once {all_tokens / longest:.1f}; the loop's tail (< 1/4 of episodes running) {tail:.0%} of it\n"
        f"  scheduling vs cores: the loop's engine, while busy, ran {busy_tps:.1f} tokens/s (raw by turn "
        f"{turn_tokens / turn_wall:.1f}); the rest of loop / raw is the {1 - busy:.0%} the engine waited on envs"
    )
    dist.shutdown()


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
