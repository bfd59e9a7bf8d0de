"""Train an agent written with the OpenAI Agents SDK (`openai-agents`) on tool_use, unchanged: the SDK runs its own
turn loop and its own tools; nanosky serves the policy behind the SDK's Chat Completions model and trains on the
exact tokens it sampled.

    torchrun --nproc_per_node 2 run.py --preset tool_use --rollout.agent examples.openai_agents_tool_use:solve
    python -m evals.agent --agent examples.openai_agents_tool_use:solve --ckpt runs/tool_use-grpo --env tool_use

The agent's tools are SDK `FunctionTool`s with the env's schemas (so the model sees the tools it was warm-started
on); a call runs in the env, through `task.step`. The SDK decides when the episode ends; the env grades its final
output (`task.grade`).
"""

from __future__ import annotations

import openai
from agents import (
    Agent,
    FunctionTool,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    set_tracing_disabled,
)

set_tracing_disabled(True)  # the SDK would otherwise send traces to OpenAI's servers


def sdk_tools(task) -> list[FunctionTool]:
    """The task's tools as SDK tools, with the env's schemas; a call runs in the env (`task.step`), as in nanosky's
    own loop, so the env counts it (tool_use pays its format term only after a call that ran, and ends the episode
    after max_turns replies)."""

    def tool(schema: dict) -> FunctionTool:
        name = schema["function"]["name"]

        async def invoke(ctx, arguments: str) -> str:
            # the call as the model wrote it; bad arguments come back as the env's error message, not raised
            res = await task.step(f'<tool_call>{{"name": "{name}", "arguments": {arguments or "{}"}}}</tool_call>')
            return "\n".join(m["content"] for m in res.observations) or "(the episode is over)"

        f = schema["function"]
        return FunctionTool(name, f.get("description", ""), f["parameters"], invoke, strict_json_schema=False)

    return [tool(s) for s in task.tools]


async def solve(client, task) -> float:
    system = "\n".join(m["content"] for m in task.messages if m["role"] == "system")
    agent = Agent(
        name="tool_use",
        instructions=system,
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        model_settings=ModelSettings(parallel_tool_calls=False),
        tools=sdk_tools(task),
    )
    question = [{"role": m["role"], "content": m["content"]} for m in task.messages if m["role"] != "system"]
    try:
        result = await Runner.run(agent, question, max_turns=4)
    except MaxTurnsExceeded:  # no final answer in 4 replies
        return await task.grade("")
    except openai.BadRequestError as e:
        if e.code != "context_length_exceeded":  # the run's --rollout.max-total-tokens: no final answer
            raise
        return await task.grade("")
    return await task.grade(str(result.final_output))
