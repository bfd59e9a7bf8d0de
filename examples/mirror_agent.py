"""An agent written against the plain `openai` SDK that plays a nanosky env the way nanosky's own loop does: call
the model, let the env act on the reply (run its tool calls, or judge its answer), send back what the env says,
until the env is done. Train it with

    torchrun --nproc_per_node 2 run.py --preset tool_use --rollout.agent examples.mirror_agent:solve

At temperature 0 it samples the same tokens, builds the same rows and earns the same rewards as nanosky's loop
(tests/integration/test_endpoint_engine.py holds that). It acts through `task.step`, the env's own step; an agent
that runs its own tools and only asks the env to grade its final answer calls `task.grade` instead
(examples/openai_agents_tool_use.py).
"""

from __future__ import annotations

import json

import openai

from envs.tools import format_tool_call


async def solve(client, task) -> float | None:
    messages, total = list(task.messages), 0.0
    while True:
        try:
            r = await client.chat.completions.create(model="policy", messages=messages, tools=task.tools or None)
        except openai.BadRequestError as e:
            if e.code == "context_length_exceeded":  # the run's --rollout.max-total-tokens: the episode ends
                return total
            raise
        reply, cut = r.choices[0].message, r.choices[0].finish_reason == "length"
        messages.append(reply.model_dump(exclude_none=True))
        calls = reply.tool_calls or []
        # the env reads the reply as the model wrote it: tool calls as <tool_call> text
        text = "".join(format_tool_call(c.function.name, json.loads(c.function.arguments)) for c in calls)
        res = await task.step(text or reply.content or "")
        total += res.reward
        if task.done or cut:  # done, or a reply cut off mid-turn: what follows would answer half a turn
            return total
        # the env's tool results answer the calls in order; a nudge is a user message of its own
        ids = iter(c.id for c in calls)
        messages += [{**m, "tool_call_id": next(ids, None)} if m["role"] == "tool" else m for m in res.observations]
