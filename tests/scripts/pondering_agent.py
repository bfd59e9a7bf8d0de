"""A harness that thinks between its calls (tests/e2e/test_partial_e2e.py): it asks once, then asks again with an
edited history, so every episode has two segments. Under `--debug.hold-extra-groups`, the second call of an episode
in a group its phase started beyond the share waits for that phase's end, and is answered in the next phase, under
the next weights: the span across a weight update happens on any machine, fast or slow."""


async def solve(client, task):
    r = await client.chat.completions.create(model="policy", messages=task.messages, tools=task.tools or None)
    question = [m for m in task.messages if m["role"] != "system"]
    reply = r.choices[0].message.model_dump(exclude_none=True)
    again = [*question, reply, {"role": "user", "content": "Give the final answer as <answer>...</answer>."}]
    r = await client.chat.completions.create(model="policy", messages=again, tools=task.tools or None)
    return await task.grade(r.choices[0].message.content or "")
