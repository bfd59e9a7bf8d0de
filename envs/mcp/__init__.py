"""mcp: tasks from a file, played with the tools of any MCP server (stdio command or streamable-HTTP URL).

    torchrun --nproc_per_node 2 run.py --env mcp --env-data questions.jsonl \\
        --env-kwargs.server "mcp-server-sqlite --db-path {episode_dir}/shop.db" --env-kwargs.template data/shop
    torchrun --nproc_per_node 2 run.py --env mcp --env-data questions.jsonl --env-kwargs.server-url http://127.0.0.1:8000/mcp

The server's `list_tools` are the episode's tools (rendered by the model's chat template, or the tools fallback for a
template without a tools section). A reply's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` is a
`call_tool`; its text content comes back as the tool turn, a tool's error as an "Error: ..." turn. A reply without a
call ends the episode and is scored against the row's answer (`reward`: "answer", the `<answer>` tag, the default;
"lenient", the answer however the reply states it; "math", `--env dataset`'s math reward; or MODULE:FN, a TRL reward
function called with the episode's prompt, final reply and row). `env_metrics`: `mcp/lenient`, `mcp/tool_calls`.

Isolation: a command that names `{episode_dir}` gets a fresh folder per episode, a copy of `template` (a database
file, a repository), and a server of its own, stopped when the episode closes; a command without it is started
once per env worker and shared by its episodes (a URL likewise). `reuse_server` keeps an episode's server for the
worker's next episode, its folder restored from `template` in place: a server start per episode (~0.5 s of CPU for a
Python server) becomes a file copy, for servers whose only state is their folder's files (not one that keeps state in
memory: mcp-server-sqlite's `append_insight` memo would carry over). `tools` ("read_query,list_tables") offers a
subset of the server's tools. A server that exits, hangs past `call_timeout_s` or breaks the protocol costs that
episode (the env pool's `envs/failed`); the next episode starts a new one.

Tasks come in `--env dataset`'s layouts (envs/ecosystem/rows.py): the test split is `test_data`, else a hash of the
prompt (`test_fraction`); `validation_data` makes a validation split. A row's `calls` column (a list of
{"name", "arguments"}) is its expert's tool calls: `--algo sft` makes them, then answers with the row's answer.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from envs.answers import extract_answer, lenient_match, normalize_answer
from envs.base import Env, Message, NoExpert, StepResult
from envs.mcp.client import MCPServer, ServerFault
from envs.tools import Tool, format_tool_call, parse_tool_calls, run_tool_call

SYSTEM_PROMPT = (
    'Use the tools. Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
    "Give the final answer as <answer>...</answer>."
)
REWARDS = ("answer", "lenient", "math")
_SHARED: dict[tuple, MCPServer] = {}  # per worker process: the servers whose command names no {episode_dir}
_IDLE: dict[tuple, list[tuple[str, MCPServer]]] = {}  # per worker, reuse_server: restored folders and their servers


SPLIT_FILES = {"data_path": "train.jsonl", "validation_data": "validation.jsonl", "test_data": "test.jsonl"}


def split_files(folder: str) -> dict[str, str]:
    """A generated task folder's rows as MCPEnv's `data_path`, `validation_data` and `test_data`."""
    return {key: os.path.join(folder, name) for key, name in SPLIT_FILES.items()}


def publish(folder: str, files: tuple[str, ...], fill: Callable[[str], None]) -> str:
    """`folder`, made by `fill(tmp)` in a temporary folder beside it and renamed into place unless all of `files`
    are there already: concurrent builders agree, and no half-written folder is ever read."""
    if all(os.path.exists(os.path.join(folder, f)) for f in files):
        return folder
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(folder)}-")
    fill(tmp)
    try:
        os.rename(tmp, folder)
    except OSError:  # another process built it first: theirs is the same
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def write_rows(path: str, rows: list[dict]) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


class MCPTool(Tool):
    """One tool of the server: its name, description and input schema; a call goes to the server."""

    manages_timeout = True

    def __init__(self, spec: dict, server: Callable[[], MCPServer]):
        self.name, self.description = spec["name"], spec.get("description", "")
        self.parameters = spec.get("input_schema") or {"type": "object", "properties": {}}
        self.server, self.fault = server, None

    def run(self, arguments: dict, timeout_s: float) -> str:
        try:
            text, is_error = self.server().call(self.name, arguments, timeout_s)
        except ServerFault as e:
            self.fault = e  # the env raises it after the turn's calls: the episode is lost
            return f"Error: {e}"
        return f"Error: {text}" if is_error and not text.startswith("Error:") else text


@functools.lru_cache(maxsize=8)
def _tasks(data_path, split, test_data, validation_data, test_fraction, prompt_key, answer_key):
    from envs.ecosystem.rows import read_tasks, split_tasks, to_task

    make = functools.partial(to_task, prompt_key=prompt_key, answer_key=answer_key)
    if split == "validation":
        if validation_data is None:
            raise ValueError("env 'mcp': the validation split needs --env-kwargs.validation-data FILE")
        return tuple(read_tasks(str(validation_data), "train", make))
    return split_tasks(str(data_path), split, test_data and str(test_data), float(test_fraction), make)


class MCPEnv(Env):
    name = "mcp"
    splits = ("train", "validation", "test")

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        data_path: str | None = None,
        server: str | None = None,
        server_url: str | None = None,
        template: str | None = None,
        test_data: str | None = None,
        validation_data: str | None = None,
        test_fraction: float = 0.1,
        prompt_key: str | None = None,
        answer_key: str | None = None,
        system_prompt: str = "",
        reward: str = "answer",
        max_turns: int = 4,
        call_timeout_s: float = 10.0,
        max_calls_per_turn: int = 2,
        tools: str | None = None,
        reuse_server: bool = False,
    ):
        if data_path is None:
            raise ValueError("env 'mcp' needs its tasks: --env-data FILE (question and answer columns)")
        if (server is None) == (server_url is None):
            raise ValueError("env 'mcp' needs one of --env-kwargs.server 'COMMAND ARGS' or --env-kwargs.server-url URL")
        if reward not in REWARDS and ":" not in reward:
            raise ValueError(f"env 'mcp': reward {reward!r}; valid: {', '.join(REWARDS)} or MODULE:FN")
        if template is not None and not os.path.isdir(template):
            raise ValueError(f"env 'mcp': template {template!r} is not a folder")
        tasks = _tasks(data_path, split, test_data, validation_data, test_fraction, prompt_key, answer_key)
        if not tasks:
            raise ValueError(f"env 'mcp': {data_path} has no {split} rows")
        self.split, self.seed, self.task = split, seed, tasks[seed % len(tasks)]
        self.max_turns, self.call_timeout_s, self.max_calls_per_turn = (
            int(max_turns),
            call_timeout_s,
            max_calls_per_turn,
        )
        self.reward_spec, self.system_prompt = reward, system_prompt
        self.episode_dir, self.reuse = None, (server, template) if reuse_server else None
        if server is not None and "{episode_dir}" in server:
            if idle := _IDLE.get(self.reuse):  # a folder restored from the template, its server still running
                self.episode_dir, self.own = idle.pop()
            else:
                self.episode_dir = tempfile.mkdtemp(prefix="nanosky-mcp-")
                if template:
                    shutil.copytree(template, self.episode_dir, dirs_exist_ok=True)
                try:
                    self.own = self.start_server(server.replace("{episode_dir}", self.episode_dir), self.episode_dir)
                except BaseException:
                    shutil.rmtree(self.episode_dir, ignore_errors=True)
                    raise
        else:
            self.own, self.shared = None, (server, server_url)
        specs = self.server.tools()
        if tools is not None:  # a subset of the server's tools, in the order given
            by_name, wanted = {t["name"]: t for t in specs}, [n.strip() for n in tools.split(",") if n.strip()]
            if missing := [n for n in wanted if n not in by_name]:
                self.close()
                raise ValueError(f"env 'mcp': the server has no tool {missing[0]!r}; it has {', '.join(by_name)}")
            specs = [by_name[n] for n in wanted]
        self.tools = [MCPTool(spec, lambda: self.server) for spec in specs]
        self.reset()

    def start_server(self, command: str, cwd: str) -> MCPServer:
        """The episode's own server (bench/protocol_overhead.py puts an in-process twin of its tools here)."""
        return MCPServer(command, cwd=cwd)

    @property
    def server(self) -> MCPServer:
        """The episode's own server, or the worker's shared one (restarted after a fault: other episodes go on)."""
        return self.own if self.own is not None else _shared(*self.shared)

    def reset(self) -> list[Message]:
        self.turn, self.n_calls, self.n_errors, self.done = 0, 0, 0, False
        system = SYSTEM_PROMPT + ("\n\n" + self.system_prompt if self.system_prompt else "")
        prompt = [m for m in self.task.prompt if m["role"] != "system"]
        return [{"role": "system", "content": system}, *prompt]

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult([], 0.0, True, self._info(False, error="episode is over"))
        self.turn += 1
        calls = parse_tool_calls(action)
        if calls:
            table = {t.name: t for t in self.tools}
            results = [run_tool_call(c, table, self.call_timeout_s) for c in calls[: self.max_calls_per_turn]]
            if faults := [t.fault for t in self.tools if t.fault]:  # the env pool counts it (envs/failed)
                raise faults[0]
            self.n_calls += len(results)
            self.n_errors += sum(not r.ok for r in results)
            self.done = self.turn >= self.max_turns
            obs = [] if self.done else [r.to_message() for r in results]
            return StepResult(obs, 0.0, self.done, self._info(False, calls=[r.record() for r in results]))
        self.done = True
        lenient = self.is_lenient(action)
        reward, success = self._score(action, lenient)
        return StepResult([], reward, True, self._info(success, lenient=lenient, pred=extract_answer(action)))

    def is_lenient(self, reply: str) -> bool:
        """The answer right however the reply states it (`mcp/lenient`, the evaluator's format-free score)."""
        return lenient_match(reply, self.task.answer or "")

    def _score(self, reply: str, lenient: bool) -> tuple[float, bool]:
        gold = self.task.answer or ""
        if self.reward_spec == "answer":
            pred = extract_answer(reply)
            ok = pred is not None and normalize_answer(pred) == normalize_answer(gold)
        elif self.reward_spec == "lenient":
            ok = lenient
        elif self.reward_spec == "math":
            from envs.ecosystem.mathreward import math_reward

            ok = math_reward(reply, gold)[1]["success"]
        else:
            from envs.ecosystem.dataset import import_reward

            columns = {k: [v] for k, v in self.task.columns.items()}
            [value] = import_reward(self.reward_spec)(prompts=[self.task.raw_prompt], completions=[reply], **columns)
            return (0.0, False) if value is None else (float(value), float(value) >= 1.0)
        return float(ok), ok

    def _info(self, success: bool, **extra: Any) -> dict[str, Any]:
        metrics = {"mcp/tool_calls": float(self.n_calls), "mcp/tool_errors": float(self.n_errors)}
        if "lenient" in extra:
            metrics["mcp/lenient"] = float(extra["lenient"])
        return {
            "success": success,
            "answer": self.task.answer,
            "tool_calls": self.n_calls,
            "turn": self.turn,
            "env_metrics": metrics,
            **extra,
        }

    def expert_action(self) -> str:
        calls = self._expert_calls()
        if self.turn < len(calls):
            return format_tool_call(calls[self.turn]["name"], calls[self.turn]["arguments"])
        return f"<answer>{self.task.answer}</answer>"

    def _expert_calls(self) -> list[dict]:
        if self.split != "train":
            raise NoExpert(f"env 'mcp': the {self.split} split is held out: no demonstrations")
        calls = self.task.columns.get("calls")
        if isinstance(calls, str):
            calls = json.loads(calls)
        if not isinstance(calls, list) or self.task.answer is None:
            raise NoExpert("env 'mcp': its rows need a `calls` column (the expert's tool calls) and an answer")
        return calls

    @classmethod
    def expert_refusal(cls, data_path: str | None = None, **kwargs) -> str | None:
        if data_path is None:
            return None  # the kind has an expert where its rows carry `calls`
        get = kwargs.get
        keys = (
            get("test_data"),
            get("validation_data"),
            get("test_fraction", 0.1),
            get("prompt_key"),
            get("answer_key"),
        )
        tasks = _tasks(data_path, "train", *keys)
        if not tasks or "calls" not in tasks[0].columns:
            return f"{data_path}: no `calls` column (the expert's tool calls) to demonstrate"
        return None

    def close(self) -> None:
        if self.episode_dir is None:
            return
        if self.reuse is not None and not self.own.broken and _restore(self.episode_dir, self.reuse[1]):
            _IDLE.setdefault(self.reuse, []).append((self.episode_dir, self.own))
        else:
            self.own.close()
            shutil.rmtree(self.episode_dir, ignore_errors=True)
        self.episode_dir = None


def _restore(folder: str, template: str | None) -> bool:
    """The folder's contents replaced by the template's, in place (the server's working directory stays valid)."""
    try:
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        if template:
            shutil.copytree(template, folder, dirs_exist_ok=True)
    except OSError:
        return False
    return True


def _shared(command: str | None, url: str | None) -> MCPServer:
    """The worker's server for a command without {episode_dir} (or a URL): started once, restarted after a fault."""
    key = (command, url)
    server = _SHARED.get(key)
    if server is None or server.broken:
        if server is not None:
            server.close()
        _SHARED[key] = server = MCPServer(command=command, url=url)
    return server


@atexit.register
def _close_shared() -> None:
    """The folders first: closing a server can take the SDK's seconds, and a pool may kill its worker meanwhile."""
    idle = [pair for pairs in _IDLE.values() for pair in pairs]
    _IDLE.clear()
    for folder, _ in idle:
        shutil.rmtree(folder, ignore_errors=True)
    while _SHARED:
        _SHARED.popitem()[1].close()
    for _, server in idle:
        server.close()
