"""openenv: any OpenEnv environment (`openenv-core`'s `reset` / `step` / `state` server) as a multi-turn env.

    torchrun --nproc_per_node 2 run.py --env openenv --env-kwargs.app my_env.server.app:app
    torchrun --nproc_per_node 2 run.py --env openenv --env-kwargs.url http://127.0.0.1:8000

`app` (MODULE:APP, or FILE.py:APP, the FastAPI app `create_app` made) is started by nanosky in each env worker, on a
free loopback port, and stopped with the pool; `url` is a server already running. Each episode is one WebSocket
session: an environment of its own on the server (envs/openenv/client.py speaks the protocol).

The reply becomes the env's action by the action type's JSON schema (GET /schema):
- a **text action**: the action has one string field (`message`, `code`, ...; `action_field` names one where there
  are several); the whole reply, stripped, fills it;
- a **tool action** (`CallToolAction`, an `MCPEnvironment`): the env's `list_tools` are the episode's tools, each
  `<tool_call>` in the reply is a `call_tool`, its result the tool turn; a reply without a call ends the episode.
An action type with another required field is refused at start-up, in one line naming the type and the field.

The observation (its fields but `reward`, `done`, `metadata`) is the next user turn: `observation_field`'s value,
else its one non-empty field if it is text, else its non-empty fields as JSON. The reward of each step is the env's (None counts 0);
`done` ends the episode; `success` is a return of at least `success_reward`. A server that hangs past
`step_timeout_s`, exits, or answers outside the protocol costs that episode (the env pool's `envs/failed`), and the
next episode gets a fresh server where the old one is gone.

Splits by seed: reset gets `seed` + 0 (train), + 2**30 (validation) or + 2**31 (test), and an `episode_id`. Held-out
means unseen seeds, so only for an env whose reset uses its seed: one that ignores it draws every split alike.
"""

from __future__ import annotations

import atexit
import json
from typing import Any

from envs.base import Env, Message, StepResult
from envs.mcp.client import ServerFault
from envs.openenv.client import Servers, Session
from envs.tools import Tool, parse_tool_calls, run_tool_call

SPLIT_SEEDS = {"train": 0, "validation": 2**30, "test": 2**31}
HIDDEN = ("reward", "done", "metadata")
EMPTY = "(no observation)"  # the turn of an observation with nothing to show (a tool env's reset, often)
_SERVERS: dict[tuple, Servers] = {}  # per worker process, by (url, app)


def action_rule(schema: dict, action_field: str | None) -> str | None:
    """The text field the reply fills, or None for a tool action; ValueError (one line) for a type it cannot fill."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    title = schema.get("title", "Action")
    if action_field is not None:
        if action_field not in props:
            raise ValueError(f"env 'openenv': action type {title} has no field {action_field!r}; it has {list(props)}")
        field = action_field
    elif not props or {"tool_name", "arguments"} <= set(props):
        return None
    else:
        text = [k for k, v in props.items() if v.get("type") == "string"]
        if len(text) != 1:
            raise ValueError(
                f"env 'openenv': action type {title} has {len(text)} text fields ({', '.join(text) or 'none'}); "
                "name the one the reply fills: --env-kwargs.action-field NAME"
            )
        field = text[0]
    if props[field].get("type") not in ("string", None):
        raise ValueError(f"env 'openenv': action type {title}'s field {field!r} is {props[field]['type']}, not text")
    if other := [k for k in schema.get("required", []) if k != field]:
        kind = props[other[0]].get("type", "object")
        raise ValueError(
            f"env 'openenv': action type {title} also requires {other[0]!r} ({kind}); nanosky fills one text field "
            "or a call_tool action"
        )
    return field


def render(observation: dict, field: str | None = None) -> str:
    """An observation as one chat turn's text."""
    shown = {k: v for k, v in observation.items() if k not in HIDDEN}
    if field is not None:
        value = shown.get(field, "")
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    shown = {k: v for k, v in shown.items() if v not in (None, "", [], {})}
    if not shown:
        return EMPTY
    if len(shown) == 1 and isinstance(text := next(iter(shown.values())), str):
        return text
    return json.dumps(shown, ensure_ascii=False)


def tool_result_text(observation: dict) -> str:
    """A `CallToolObservation` as the tool turn: its error, or its result's text content."""
    if error := observation.get("error"):
        return f"Error: {error.get('message', error) if isinstance(error, dict) else error}"
    result = observation.get("result")
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        texts = [c.get("text", "") for c in result["content"] if isinstance(c, dict) and c.get("type") == "text"]
        out = "\n".join(texts)
        return f"Error: {out}" if result.get("is_error") or result.get("isError") else out
    if isinstance(result, dict) and "data" in result:
        result = result["data"]
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


class OpenEnvTool(Tool):
    """One of the env's MCP tools: a call is a `call_tool` step of the episode's session."""

    manages_timeout = True

    def __init__(self, spec: dict, env: OpenEnvEnv):
        self.name, self.description = spec["name"], spec.get("description", "")
        self.parameters = spec.get("input_schema") or spec.get("inputSchema") or {"type": "object", "properties": {}}
        self.env = env

    def run(self, arguments: dict, timeout_s: float) -> str:
        return self.env._call(self.name, arguments, timeout_s)


class OpenEnvEnv(Env):
    name = "openenv"
    splits = ("train", "validation", "test")

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        url: str | None = None,
        app: str | None = None,
        action_field: str | None = None,
        observation_field: str | None = None,
        system_prompt: str = "",
        max_turns: int = 8,
        step_timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        success_reward: float = 1.0,
        max_calls_per_turn: int = 2,
    ):
        if split not in SPLIT_SEEDS:
            raise ValueError(f"env 'openenv': split {split!r}; valid: {', '.join(SPLIT_SEEDS)}")
        self.servers = self.connect(url, app, float(start_timeout_s))
        self.split, self.seed, self.reset_seed = split, seed, SPLIT_SEEDS[split] + int(seed)
        self.max_turns, self.timeout_s, self.success_reward = int(max_turns), float(step_timeout_s), success_reward
        self.observation_field, self.system_prompt, self.max_calls = (
            observation_field,
            system_prompt,
            max_calls_per_turn,
        )
        self.field = action_rule(self.servers.schema().get("action") or {}, action_field)
        self.session: Session | None = None
        self.tools: list = []
        if self.field is None:  # a tool env: its tools are known before any episode (list_tools needs no reset)
            self.session, listed = self.servers.open({"type": "step", "data": {"type": "list_tools"}}, self.timeout_s)
            self.tools = [OpenEnvTool(t, self) for t in listed["observation"].get("tools", [])]

    def connect(self, url: str | None, app: str | None, start_timeout_s: float) -> Servers:
        """The worker's servers for this url or app (bench/protocol_overhead.py puts an in-process twin here)."""
        return _servers(url, app, start_timeout_s)

    def reset(self) -> list[Message]:
        data = {"seed": self.reset_seed, "episode_id": f"{self.split}-{self.seed}"}
        if self.session is None:
            self.session, first = self.servers.open({"type": "reset", "data": data}, self.timeout_s)
        else:
            first = self.session.request({"type": "reset", "data": data}, self.timeout_s)
        self.turn, self.total, self.done, self.fault = 0, 0.0, bool(first.get("done")), None
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": render(first.get("observation") or {}, self.observation_field)}]

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult([], 0.0, True, self._info(error="episode is over"))
        self.turn += 1
        if self.field is not None:
            reply = self._request({self.field: action.strip()})
            reward = float(reply.get("reward") or 0.0)
            self.total += reward
            self.done = bool(reply.get("done")) or self.turn >= self.max_turns
            obs = (
                [] if self.done else [{"role": "user", "content": render(reply["observation"], self.observation_field)}]
            )
            return StepResult(obs, reward, self.done, self._info())
        calls = parse_tool_calls(action)
        if not calls:
            self.done = True
            return StepResult([], 0.0, True, self._info())
        before, self.step_done = self.total, False
        results = [run_tool_call(c, {t.name: t for t in self.tools}, self.timeout_s) for c in calls[: self.max_calls]]
        if self.fault is not None:  # the env pool counts it (envs/failed)
            raise self.fault
        self.done = self.step_done or self.turn >= self.max_turns
        obs = [] if self.done else [r.to_message() for r in results]
        return StepResult(obs, self.total - before, self.done, self._info(calls=[r.record() for r in results]))

    def _call(self, name: str, arguments: dict, timeout_s: float) -> str:
        """One `call_tool` step; its reward and done count for the turn."""
        if self.fault is not None or self.step_done:
            return "Error: the episode ended before this call"
        try:
            reply = self._request({"type": "call_tool", "tool_name": name, "arguments": arguments}, timeout_s)
        except ServerFault as e:
            self.fault = e
            return f"Error: {e}"
        self.total += float(reply.get("reward") or 0.0)
        self.step_done = bool(reply.get("done"))
        return tool_result_text(reply.get("observation") or {})

    def _request(self, action: dict, timeout_s: float | None = None) -> dict:
        return self.session.request({"type": "step", "data": action}, timeout_s or self.timeout_s)

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {
            "success": self.done and self.total >= self.success_reward,
            "return": self.total,
            "turn": self.turn,
            "env_metrics": {"openenv/return": self.total, "openenv/turns": float(self.turn)},
            **extra,
        }

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def _servers(url: str | None, app: str | None, start_timeout_s: float) -> Servers:
    key = (url, app)
    if key not in _SERVERS:
        _SERVERS[key] = Servers(url=url, app=app, start_timeout_s=start_timeout_s)
    return _SERVERS[key]


@atexit.register
def _close_servers() -> None:
    while _SERVERS:
        _SERVERS.popitem()[1].close()
