"""What the endpoint costs a rollout phase: the same tool_use episodes, on the same in-process engine and weights,
played by nanosky's loop, by an `openai`-SDK agent that mirrors it (examples/mirror_agent.py) and by the OpenAI
Agents SDK example, back to back (issue 36).

    python bench/endpoint_overhead.py [--episodes 128] [--repeats 3] [--profile]

Prints, per player, the median wall time of the phase, the engine's busy share, completion tokens per second and
the engine calls; `--profile` adds the top functions by own time (cProfile) of the Agents SDK phase, to say where
the time goes.
"""

import argparse
import cProfile
import pstats
import statistics
import time

from nanosky import dist
from nanosky.agent import AgentRunner, EngineBackend, EnvTask
from nanosky.bundled import resolve_model_path
from nanosky.endpoint.harness import Harness
from nanosky.endpoint.server import Sampling
from nanosky.precision import decide
from nanosky.rollout.chat import load_tokenizer
from nanosky.rollout.engine import Engine, EngineConfig

MAX_NEW, MAX_TOTAL = 64, 480  # the tool_use preset's budgets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=128, help="one rank's episodes per step in the tool_use preset")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    from examples.mirror_agent import solve as mirror
    from examples.openai_agents_tool_use import solve as sdk

    path = resolve_model_path("tiny-tool")
    engine, tok = (
        Engine(EngineConfig(seed=0), path, dist.init_distributed(), precision=decide("auto", "cpu")),
        load_tokenizer(path),
    )
    kinds = ("arith", "python")  # the preset's kinds

    def tasks():
        return [EnvTask.make("tool_use", "train", seed=s, kinds=kinds) for s in range(args.episodes)]

    def loop(rep):
        backend = EngineBackend(engine, tok)
        runner = AgentRunner(
            backend, tok=tok, max_parallel_agents=None, max_tokens_per_turn=MAX_NEW, max_total_tokens=MAX_TOTAL
        )
        return runner.run(tasks(), sample_seed=rep), backend

    def harness(agent):
        def play(rep):
            backend = EngineBackend(engine, tok)
            # every episode at once, as before the concurrency limit (one rank's phase, the engine batches them)
            h = Harness(backend, tok, Sampling(1.0, 1.0, MAX_NEW, MAX_TOTAL), agent=agent, concurrency=None)
            try:
                return h.run(tasks(), seeds=list(range(args.episodes)), sample_seed=rep), backend
            finally:
                h.close()

        return play

    players = {"nanosky loop": loop, "openai SDK mirror": harness(mirror), "Agents SDK": harness(sdk)}
    rows = {}
    for rep in range(args.repeats):
        for name, play in players.items():  # interleaved: drift on the box hits every player alike
            t0 = time.perf_counter()
            trajs, backend = play(rep)
            wall = time.perf_counter() - t0
            tokens = sum(t.completion_tokens for t in trajs)
            rows.setdefault(name, []).append((wall, backend.busy_s / wall, tokens / wall, backend.requests))
    print(f"\n{args.episodes} tool_use episodes per phase, median of {args.repeats}, T = 1, one rank")
    print("| player | phase wall s | engine busy | completion tokens/s | engine calls |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        med = [statistics.median(x[k] for x in r) for k in range(4)]
        print(f"| {name} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.0f} | {med[3]:.0f} |")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(players["Agents SDK"], 99)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
