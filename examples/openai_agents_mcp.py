"""Train an OpenAI Agents SDK agent whose tools come from an MCP server, through the SDK's own MCP support
(`agents.mcp.MCPServerStdio`): the SDK starts the server, lists its tools, sends them with each Chat Completions
request and runs the model's calls on the server; nanosky serves the policy behind that model and trains on the
exact tokens it sampled.

    torchrun --nproc_per_node 2 run.py --env mcp_time --model.path smollm2-135m \\
        --rollout.agent examples.openai_agents_mcp:solve
    python -m evals.agent --agent examples.openai_agents_mcp:solve --ckpt runs/mcp_time-grpo --env mcp_time

`solve` plays `--env mcp_time` with `mcp-server-time` (the env's own server command, so the model sees the tools the
env would render); `make_solve("COMMAND ARGS")` gives an agent for another stdio server. The env grades the final
output (`task.grade`): the SDK's calls never reach the env, only the answer does. Each episode starts its own server
(~0.5 s of CPU for a Python server).
"""

from __future__ import annotations

import openai
from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    set_tracing_disabled,
)
from agents.mcp import MCPServerStdio, create_static_tool_filter

from envs.mcp.client import resolve_command
from envs.mcp.clock import SERVER

set_tracing_disabled(True)  # the SDK would otherwise send traces to OpenAI's servers


def make_solve(command: str, tools: list[str] | None = None, max_turns: int = 4):
    """An agent for the stdio MCP server `command` (found like `--env mcp`'s: on PATH or in .venv/mcp-servers),
    offered only `tools` where given (the SDK's static tool filter)."""
    argv = resolve_command(command)
    only = create_static_tool_filter(allowed_tool_names=tools) if tools else None

    async def solve(client, task) -> float:
        system = "\n".join(m["content"] for m in task.messages if m["role"] == "system")
        question = [{"role": m["role"], "content": m["content"]} for m in task.messages if m["role"] != "system"]
        params = {"command": argv[0], "args": argv[1:]}
        server = MCPServerStdio(params, cache_tools_list=True, client_session_timeout_seconds=30, tool_filter=only)
        async with server:
            agent = Agent(
                name="mcp",
                instructions=system,
                model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                model_settings=ModelSettings(parallel_tool_calls=False),
                mcp_servers=[server],
            )
            try:
                result = await Runner.run(agent, question, max_turns=max_turns)
            except MaxTurnsExceeded:  # no final answer within max_turns replies
                return await task.grade("")
            except openai.BadRequestError as e:
                if e.code != "context_length_exceeded":  # the run's --rollout.max-total-tokens: no final answer
                    raise
                return await task.grade("")
        return await task.grade(str(result.final_output))

    return solve


solve = make_solve(SERVER)  # --env mcp_time
