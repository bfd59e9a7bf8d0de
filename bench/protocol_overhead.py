"""Protocol overhead: an MCP server's tools and an OpenEnv server against the same logic in-process.

    python bench/protocol_overhead.py                                   # both, SmolLM2 base, 64 episodes each
    python bench/protocol_overhead.py --part mcp --model runs/sq/sft-s0/checkpoints/step_000020/export   # a model that calls tools

Two pairs, each played by the same model on the same episodes (one process, an env pool of 2 workers, the agent
loop of training), alternating real and twin `--reps` times:

- **mcp**: `--env mcp_sqlite` (the shop questions, validation split), every call through the real `mcp-server-sqlite`
  (JSON-RPC over stdio, each episode on its own copy of the database), with a server started per episode and with
  `reuse_server` (a worker's servers kept, their folders restored), against `ShopTwin`: the same env with
  `read_query` run by `sqlite3` in the env worker, answering the server's exact text.
- **openenv**: the tests' digit game (tests/scripts/openenv_toy.py) served by `openenv-core`'s app (uvicorn, one
  WebSocket session per episode), against `GuessTwin`: the same `Environment` class stepped in the env worker, its
  observations serialised as the server does.

The twins give the model the same prompts and tool results, so with the same sampling seeds both play the same
episodes, up to sampling's batch-dependent numerics (printed: how many trajectories of the last round came out
token-identical). Printed per variant: the median wall time of a round, episodes/s, and the protocol's share of
rollout time, 1 - twin / protocol, per round and per sampled token (the rounds' lengths differ by a few percent). Then the env alone, without a
model: a scripted episode (the shop's expert calls, or two guesses) per second, through the protocol and in-process.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import sqlite3
import statistics
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Literal

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from envs.mcp.shop import SQLShopEnv  # noqa: E402
from envs.openenv import OpenEnvEnv  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "tests", "scripts", "openenv_toy.py")
# mcp-server-sqlite's read_query as its list_tools states it (checked against the real server before each run)
READ_QUERY = {
    "name": "read_query",
    "description": "Execute a SELECT query on the SQLite database",
    "input_schema": {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "SELECT SQL query to execute"}},
        "required": ["query"],
    },
}


@dataclass
class Args:
    part: Literal["both", "mcp", "openenv"] = "both"
    model: str = "smollm2-135m"
    """A model name or path (a run's checkpoint: one that calls the tools)."""
    episodes: int = 64
    reps: int = 2
    """Rounds per variant, alternating real and twin; the median is reported."""
    warmup: int = 8
    max_live: int = 16
    """--rollout.max-live-episodes: the shop's server per episode is ~42 MB."""
    seed: int = 0


class SQLiteTwin:
    """`mcp-server-sqlite`'s read_query in-process: the same text for a result or an error, no process, no JSON-RPC."""

    broken = None

    def __init__(self, command: str, cwd: str):
        argv = shlex.split(command)
        self.db = argv[argv.index("--db-path") + 1]

    def tools(self) -> list[dict]:
        return [READ_QUERY]

    def call(self, name: str, arguments: dict, timeout_s: float) -> tuple[str, bool]:
        try:
            query = arguments["query"]
            if name != "read_query":
                raise ValueError(f"Unknown tool: {name}")
            if not query.strip().upper().startswith("SELECT"):
                raise ValueError("Only SELECT queries are allowed for read_query")
            with closing(sqlite3.connect(self.db)) as conn:
                conn.row_factory = sqlite3.Row
                return str([dict(row) for row in conn.execute(query).fetchall()]), False
        except sqlite3.Error as e:
            return f"Database error: {e}", False
        except Exception as e:  # noqa: BLE001 - as the server words it
            return f"Error: {e}", False

    def close(self) -> None:
        pass


class ShopTwin(SQLShopEnv):
    name = "mcp_sqlite_twin"

    def start_server(self, command: str, cwd: str) -> SQLiteTwin:
        return SQLiteTwin(command, cwd)


def _toy():
    spec = importlib.util.spec_from_file_location("openenv_toy", TOY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LocalSession:
    """One episode's `Environment` object, stepped in this process; replies as the server's WebSocket `data`."""

    def __init__(self, toy):
        from openenv.core.env_server.serialization import deserialize_action, serialize_observation

        self.env, self.action_cls = toy.GuessEnv(), toy.GuessAction
        self.deserialize, self.serialize = deserialize_action, serialize_observation

    def request(self, message: dict, timeout_s: float) -> dict:
        data = message["data"]
        if message["type"] == "reset":
            return self.serialize(self.env.reset(**data))
        return self.serialize(self.env.step(self.deserialize(data, self.action_cls)))

    def close(self) -> None:
        self.env.close()


class LocalServers:
    def __init__(self):
        self.toy = _toy()

    def schema(self) -> dict:
        return {"action": self.toy.GuessAction.model_json_schema()}

    def open(self, first: dict, timeout_s: float):
        session = LocalSession(self.toy)
        return session, session.request(first, timeout_s)


class GuessTwin(OpenEnvEnv):
    name = "openenv_twin"
    _local = None

    def connect(self, url, app, start_timeout_s) -> LocalServers:
        if GuessTwin._local is None:
            GuessTwin._local = LocalServers()
        return GuessTwin._local


GUESS = {"app": f"{TOY}:app", "system_prompt": "Play the game.", "max_turns": 2}


def scripted(make, actions, n: int) -> float:
    """Scripted episodes per second of an env alone (built, reset, stepped, closed in this process)."""
    t0 = time.perf_counter()
    for seed in range(n):
        env = make(seed)
        env.reset()
        for a in actions(env):
            if env.step(a).done:
                break
        env.close()
    return n / (time.perf_counter() - t0)


def expert(env):
    while True:
        yield env.expert_action()


def main(args: Args) -> None:
    from transformers import AutoTokenizer

    from nanosky import dist
    from nanosky.agent import EngineBackend
    from nanosky.bundled import resolve_model_path
    from nanosky.collect import Rollout
    from nanosky.precision import decide
    from nanosky.presets import PRESETS
    from nanosky.rollout.engine import Engine
    from nanosky.rollout.envpool import make_pool

    me = importlib.import_module("bench.protocol_overhead")  # by package path: the env workers import the twins
    import envs

    envs.register_env(me.ShopTwin.name)(me.ShopTwin)
    envs.register_env(me.GuessTwin.name)(me.GuessTwin)
    real_tools = [t.parameters for t in envs.make("mcp_sqlite", "validation", 0, tools="read_query").tools]
    if real_tools != [READ_QUERY["input_schema"]]:
        raise SystemExit(f"mcp-server-sqlite's read_query changed: {real_tools}; update READ_QUERY")

    cfg = PRESETS["default"]()
    cfg.model.path = args.model
    cfg.engine.max_model_len = 1024
    cfg.rollout.max_new_tokens, cfg.rollout.max_total_tokens = 96, 1024
    cfg.rollout.temperature, cfg.rollout.max_live_episodes = 0.7, args.max_live
    info = dist.init_distributed()
    path = resolve_model_path(cfg.model.path)
    tok = AutoTokenizer.from_pretrained(path)
    engine = Engine(cfg.engine, path, info, precision=decide(cfg.precision, info.device.type))
    pool = make_pool(2, cfg.envpool.step_timeout_s)
    rollout = Rollout(cfg.rollout, EngineBackend(engine, tok), pool, tok)

    def play(env: str, kwargs: dict, seeds: list[int]):
        t0 = time.perf_counter()
        out = rollout.run(env, kwargs, "validation", seeds, version=0, sample_seed=args.seed)
        return out.trajs, time.perf_counter() - t0

    sql = {"tools": "read_query"}
    parts = {  # (label, env, kwargs): the protocol's variants, then the in-process twin
        "mcp": [
            ("a server per episode", "mcp_sqlite", sql),
            ("servers reused", "mcp_sqlite", sql | {"reuse_server": True}),
            ("in-process twin", me.ShopTwin.name, sql),
        ],
        "openenv": [("served", "openenv", GUESS), ("in-process twin", me.GuessTwin.name, GUESS)],
    }
    lines = []
    for part, variants in parts.items():
        if args.part not in ("both", part):
            continue
        seeds = list(range(args.episodes))
        for _, env, kw in variants:
            play(env, kw, list(range(10_000, 10_000 + args.warmup)))  # workers, servers' imports, engine paths
        walls, trajs = {v[0]: [] for v in variants}, {}
        for _ in range(args.reps):
            for label, env, kw in variants:
                trajs[label], wall = play(env, kw, seeds)
                walls[label].append(round(wall, 2))
        twin = variants[-1][0]
        lines.append(f"{part}: {args.episodes} episodes x {args.reps} rounds a variant, alternating")
        tokens = {label: sum(x.completion_tokens for x in trajs[label]) for label in trajs}
        for label, _, _ in variants:
            t, wall = trajs[label], statistics.median(walls[label])
            same = sum(a.ids == b.ids for a, b in zip(t, trajs[twin], strict=True))
            twin_wall = statistics.median(walls[twin])
            per_token = 1 - (twin_wall / tokens[twin]) / (wall / tokens[label])  # the rounds sampled unequal lengths
            share = "" if label == twin else f"  protocol share {1 - twin_wall / wall:6.1%} (per token {per_token:.1%})"
            lines.append(
                f"  {label:22s} {wall:7.2f} s  {args.episodes / wall:6.2f} episodes/s{share}  rounds {walls[label]}; "
                f"{tokens[label]} tokens, {sum(x.tool_calls for x in t)} tool calls, "
                f"token-identical to the twin's {same}/{len(t)}"
            )
    rollout.close()
    pool.shutdown()

    if args.part in ("both", "mcp"):
        real = scripted(lambda s: envs.make("mcp_sqlite", "train", s, **sql), expert, 32)
        reused = scripted(lambda s: envs.make("mcp_sqlite", "train", s, **sql, reuse_server=True), expert, 32)
        twin = scripted(lambda s: me.ShopTwin("train", s, **sql), expert, 32)
        lines.append(
            f"mcp, env alone (the expert: 1 call, then the answer), episodes/s: a server per episode {real:.2f}, "
            f"servers reused {reused:.2f}, in-process {twin:.2f}"
        )
    if args.part in ("both", "openenv"):

        def guesses(env):
            return iter(["5", "3"])

        real = scripted(lambda s: envs.make("openenv", "validation", s, **GUESS), guesses, 64)
        twin = scripted(lambda s: me.GuessTwin("validation", s, **GUESS), guesses, 64)
        lines.append(f"openenv, env alone (two guesses), episodes/s: served {real:.2f}, in-process {twin:.2f}")
    print("\n".join(lines))
    dist.shutdown()


if __name__ == "__main__":
    import tyro

    main(tyro.cli(Args))
