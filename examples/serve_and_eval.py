"""Evaluate a model served by any OpenAI-compatible server on nanosky envs, through the AgentRunner.

    # 1. serve a model (vLLM shown; SGLang, llama.cpp's server or a hosted API work the same way)
    python -m vllm.entrypoints.openai.api_server --model nanosky/assets/tiny --port 8000 \
        --dtype float32 --max-model-len 512 --enforce-eager          # = `vllm serve nanosky/assets/tiny ...`
    # 2. evaluate it
    python examples/serve_and_eval.py --base-url http://127.0.0.1:8000/v1 --env math --n 50

    # or let the script start (and stop) a local vLLM server on the bundled tiny model itself:
    python examples/serve_and_eval.py --serve nanosky/assets/tiny --env math --n 50
    python examples/serve_and_eval.py --serve nanosky/assets/tiny --env tool_use --n 20 --out runs/tool_use.jsonl

Prints accuracy (share of successful episodes), mean reward, turns, tool calls and stop reasons; `--out` writes
every trajectory as JSONL. No torch.distributed, no GPU needed on the client side. The API key, if the server
wants one, comes from OPENAI_API_KEY.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Literal

import tyro

from nanosky.agent import AgentRunner, EnvTask, OpenAIBackend, save_jsonl, summarize
from nanosky.agent.serve import local_vllm_server


@dataclass(kw_only=True)
class EvalArgs:
    base_url: str = "http://127.0.0.1:8000/v1"
    """OpenAI-compatible server to evaluate (ignored with --serve)."""
    model: str | None = None
    """Model name to request; default: the first model the server lists."""
    serve: str | None = None
    """Start a local vLLM server on this model directory for the run, e.g. nanosky/assets/tiny."""
    env: str = "math"
    """Env to evaluate on (math, tool_use, webshop_lite, alfworld_lite, or any registered env)."""
    split: Literal["train", "test"] = "test"
    n: int = 50
    """Number of episodes (env seeds 0..n-1)."""
    max_parallel_agents: int = 8
    """Concurrency limit of each runner stage (initialise / generate / step / evaluate)."""
    max_tokens_per_turn: int = 128
    max_turns: int | None = None
    """Assistant turns per episode; default: the env's own."""
    temperature: float = 0.0
    """0 = greedy."""
    out: str | None = None
    """Write the trajectories here as JSONL."""


def evaluate(args: EvalArgs, base_url: str) -> dict:
    backend = OpenAIBackend(base_url, model=args.model, logprobs=False)
    runner = AgentRunner(
        backend,
        max_parallel_agents=args.max_parallel_agents,
        max_turns=args.max_turns,
        max_tokens_per_turn=args.max_tokens_per_turn,
        temperature=args.temperature,
    )
    t0 = time.perf_counter()
    trajs = runner.run([EnvTask.make(args.env, args.split, seed=i) for i in range(args.n)])
    summary = summarize(trajs) | {"wall_s": round(time.perf_counter() - t0, 2), "model": backend.model}
    if args.out:
        print(f"trajectories: {save_jsonl(trajs, args.out)}")
    return summary


def main(args: EvalArgs) -> None:
    if args.serve:
        with local_vllm_server(args.serve) as url:
            summary = evaluate(args, url)
    else:
        summary = evaluate(args, args.base_url)
    print(json.dumps(summary, indent=1))
    print(f"{args.env}/{args.split} accuracy: {summary['accuracy']:.3f} over {summary['n']} episodes")


if __name__ == "__main__":
    main(tyro.cli(EvalArgs))
