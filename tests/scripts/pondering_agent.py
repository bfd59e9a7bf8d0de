"""A harness that thinks between its calls (tests/e2e/test_partial_e2e.py): it asks once, waits 0.2-1.0 s (seeded
by its task), then asks again with an edited history, so every episode has two segments, and a rollout phase that
ends while it waits leaves its second call to the next phase, under the next weights."""

import asyncio


async def solve(client, task):
    r = await client.chat.completions.create(model="policy", messages=task.messages, tools=task.tools or None)
    await asyncio.sleep(0.2 + (task.seed % 5) / 5)
    question = [m for m in task.messages if m["role"] != "system"]
    reply = r.choices[0].message.model_dump(exclude_none=True)
    again = [*question, reply, {"role": "user", "content": "Give the final answer as <answer>...</answer>."}]
    r = await client.chat.completions.create(model="policy", messages=again, tools=task.tools or None)
    return await task.grade(r.choices[0].message.content or "")
