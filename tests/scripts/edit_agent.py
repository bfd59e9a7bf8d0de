"""A harness that edits its history (tests/e2e/test_agent_endpoint.py): it asks once, then asks again without the
system message, so every episode has two segments and the step trains step-wise rows."""


async def solve(client, task):
    r = await client.chat.completions.create(model="policy", messages=task.messages, tools=task.tools or None)
    question = [m for m in task.messages if m["role"] != "system"]
    reply = r.choices[0].message.model_dump(exclude_none=True)
    again = [*question, reply, {"role": "user", "content": "Give the final answer as <answer>...</answer>."}]
    r = await client.chat.completions.create(model="policy", messages=again, tools=task.tools or None)
    return await task.grade(r.choices[0].message.content or "")
