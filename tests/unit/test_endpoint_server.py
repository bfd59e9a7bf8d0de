"""The OpenAI-compatible endpoint (nanosky/endpoint/server.py) through the real `openai` SDK, over a scripted
backend (the engine side, with real vLLM, is tested in tests/integration): tool calls both ways, continuation rows,
streaming (server-sent events), the request schema, chunked and `Expect: 100-continue` bodies, /health, the error
statuses, retries recorded once, and 16 concurrent episodes each attributed to its own row."""

import asyncio
import json

import httpx
import openai
import pytest

from nanosky.agent.backends import ContextLengthError, GenerationResult
from nanosky.bundled import resolve_model_path
from nanosky.endpoint.server import Endpoint, Sampling
from nanosky.rollout.chat import encode, load_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "exact arithmetic",
            "parameters": {"type": "object", "properties": {"expression": {}}},
        },
    }
]


class Scripted:
    """A backend that answers from a script: `script(prompt_text) -> reply text`; records each request."""

    def __init__(self, tok, script):
        self.tok, self.script, self.requests = tok, script, []

    async def generate(self, req):
        self.requests.append(req)
        await asyncio.sleep(0)  # other episodes run in between, as in a real batch
        text = self.script(self.tok.decode(req.prompt_ids))
        if text is None:
            raise ContextLengthError("prompt of 9999 tokens leaves no room in 512")
        ids = encode(self.tok, text) + [self.tok.eos_token_id]
        return GenerationResult(text, ids, [-0.25] * len(ids), "stop", len(req.prompt_ids), len(ids))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("tiny-tool"))


def _run(tok, script, body, sampling: Sampling | None = None):
    """Start an endpoint over `script`, run `body(endpoint, backend)` in the loop, stop it."""

    async def main():
        backend = Scripted(tok, script)
        ep = Endpoint(backend, tok, sampling or Sampling(max_tokens=64), version=lambda: 3)
        await ep.start()
        try:
            return await body(ep, backend)
        finally:
            await ep.stop()

    return asyncio.run(main())


def _calc(prompt: str) -> str:
    if "<tool_response>" in prompt:
        return "<answer>391</answer>"
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}</tool_call>'


def test_a_tool_call_round_trip_through_the_sdk_is_one_row_of_engine_sampled_ids(tok):
    async def body(ep, backend):
        key = ep.open_episode("t0")
        client = openai.AsyncOpenAI(base_url=ep.base_url, api_key=key, max_retries=0)
        msgs = [{"role": "user", "content": "What is 17 * 23?"}]
        r = await client.chat.completions.create(model="any-name", messages=msgs, tools=TOOLS, max_tokens=1000)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "17*23"}
        msgs += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "391"},
        ]
        r2 = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        assert r2.choices[0].message.content == "<answer>391</answer>" and r2.choices[0].finish_reason == "stop"
        models = await client.models.list()
        assert [m.id for m in models.data] == ["nanosky-policy"]
        await client.close()
        slot = ep.close_episode(key)
        return slot, backend

    slot, backend = _run(tok, _calc, body)
    (seg,) = slot.episode.segments  # one chain
    assert seg.versions == [3, 3] and seg.calls == 2
    sampled = [i for i, m in zip(seg.ids, seg.loss_mask) if m]
    assert sampled == backend.requests[0].prompt_ids[:0] + [  # exactly the ids the backend returned, in order
        *encode(tok, _calc("")),
        tok.eos_token_id,
        *encode(tok, "<answer>391</answer>"),
        tok.eos_token_id,
    ]
    assert backend.requests[1].prompt_ids == seg.ids[: seg.turn_starts[1]]  # the second call continued the row
    assert backend.requests[0].max_tokens == 64  # capped by the config
    assert slot.asked[0]["max_tokens"] == 1000 and slot.asked[0]["model"] == "any-name"


def test_error_statuses_and_a_malformed_tool_call(tok):
    def script(prompt):
        if "too long" in prompt:
            return None
        if "look it up" in prompt:  # a well-formed call to a tool the request did not offer
            return '<tool_call>{"name": "wiki", "arguments": {"title": "Paris"}}</tool_call>'
        return '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'

    async def body(ep, backend):
        key = ep.open_episode("t1")
        msgs = [{"role": "user", "content": "hi"}]
        async with httpx.AsyncClient(base_url=ep.base_url) as http:
            auth = {"Authorization": f"Bearer {key}"}
            post = lambda j, h=auth: http.post("/chat/completions", json=j, headers=h)  # noqa: E731
            out = {
                "wrong key": (await post({"messages": msgs}, {"Authorization": "Bearer nope"})).status_code,
                "no route": (await http.get("/completions", headers=auth)).status_code,
                "n=2": (await post({"messages": msgs, "n": 2})).status_code,
                "not json": (await http.post("/chat/completions", content=b"{", headers=auth)).status_code,
                "no messages": (await post({"messages": []})).status_code,
                "context": (await post({"messages": [{"role": "user", "content": "too long"}]})).json(),
            }
            bad = (await post({"messages": msgs, "tools": TOOLS})).json()["choices"][0]
            look = [{"role": "user", "content": "look it up"}]
            unknown = (await post({"messages": look, "tools": TOOLS})).json()["choices"][0]
            slot = ep.close_episode(key)
            out["after close"] = (await post({"messages": msgs})).status_code
        return out, bad, unknown, slot

    out, bad, unknown, slot = _run(tok, script, body)
    assert out["wrong key"] == 401 and out["no route"] == 404 and out["after close"] == 410
    assert out["n=2"] == out["not json"] == out["no messages"] == 400
    assert out["context"]["error"]["code"] == "context_length_exceeded"
    # a malformed call: plain content, status 200, recorded
    assert bad["finish_reason"] == "stop" and "tool_calls" not in bad["message"]
    assert bad["message"]["content"].startswith("<tool_call>")
    assert unknown["finish_reason"] == "stop" and "tool_calls" not in unknown["message"]
    assert '"wiki"' in unknown["message"]["content"] and slot.episode.calls == 2
    assert slot.errors == 4  # the 4xx answers of this episode's key (401 and 410 are not counted against it)


def test_a_retried_request_is_answered_again_and_recorded_once(tok):
    async def body(ep, backend):
        key = ep.open_episode("t2")
        async with httpx.AsyncClient(base_url=ep.base_url) as http:
            h = {"Authorization": f"Bearer {key}", "Idempotency-Key": "stainless-retry-1"}
            j = {"messages": [{"role": "user", "content": "hi"}]}
            a, b = (await http.post("/chat/completions", json=j, headers=h)).json(), None
            b = (await http.post("/chat/completions", json=j, headers=h)).json()
            # a retry that arrives while the first request is still being sampled (the client timed out)
            h2 = {**h, "Idempotency-Key": "stainless-retry-2"}
            j2 = {"messages": [*j["messages"], a["choices"][0]["message"], {"role": "user", "content": "more"}]}
            c, d = await asyncio.gather(*(http.post("/chat/completions", json=j2, headers=h2) for _ in range(2)))
        return a, b, c.json(), d.json(), ep.slots[key], backend

    a, b, c, d, slot, backend = _run(tok, lambda p: "hello", body)
    assert a == b and c == d and a != c
    assert len(backend.requests) == 2 and slot.episode.calls == 2 and len(slot.episode.segments) == 1


def test_sixteen_concurrent_episodes_each_get_their_own_row(tok):
    async def body(ep, backend):
        async def episode(i):
            key = ep.open_episode(f"task{i}")
            client = openai.AsyncOpenAI(base_url=ep.base_url, api_key=key, max_retries=0)
            msgs = [{"role": "user", "content": f"Say {i}."}]
            for _ in range(3):
                r = await client.chat.completions.create(model="m", messages=msgs)
                msgs += [
                    r.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "Again."},
                ]
            await client.close()
            return ep.close_episode(key)

        return await asyncio.gather(*[episode(i) for i in range(16)])

    slots = _run(tok, lambda p: p.split("Say ")[1].split(".")[0], body)
    for i, slot in enumerate(slots):
        (seg,) = slot.episode.segments
        assert seg.calls == 3 and slot.task_id == f"task{i}"
        replies = tok.decode([t for t, m in zip(seg.ids, seg.loss_mask) if m and t != tok.eos_token_id])
        assert replies == f"{i}" * 3  # each episode's row holds its own samples only


def _stream_script(prompt: str) -> str:
    if "<tool_response>" in prompt:
        return "The product is <answer>391</answer>"
    return 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "17*23"}}</tool_call>'


async def _sdk_round_trip(ep, stream: bool) -> list:
    """Two calls (a tool call, then the answer) as the openai SDK makes them, streamed or not; returns the replies
    as (content, tool calls, finish reason)."""
    key = ep.open_episode("s")
    client = openai.AsyncOpenAI(base_url=ep.base_url, api_key=key, max_retries=0)
    msgs, out = [{"role": "user", "content": "What is 17 * 23?"}], []
    for _ in range(2):
        if stream:
            content, calls, finish = "", {}, None
            events = await client.chat.completions.create(
                model="m", messages=msgs, tools=TOOLS, stream=True, stream_options={"include_usage": True}
            )
            usage = None
            async for ev in events:
                usage = ev.usage or usage
                for c in ev.choices:
                    content += c.delta.content or ""
                    for tc in c.delta.tool_calls or []:  # accumulate tool-call deltas by index
                        cur = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        cur["id"] += tc.id or ""
                        cur["name"] += tc.function.name or ""
                        cur["arguments"] += tc.function.arguments or ""
                    finish = c.finish_reason or finish
            assert usage is not None and usage.completion_tokens > 0
            calls = [calls[k] for k in sorted(calls)]
        else:
            r = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
            m = r.choices[0].message
            content, finish = m.content or "", r.choices[0].finish_reason
            calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls or []
            ]
        out.append((content, [(c["name"], json.loads(c["arguments"])) for c in calls], finish))
        tool_calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ]
        msgs.append({"role": "assistant", "content": content or None, **({"tool_calls": tool_calls} if calls else {})})
        if calls:
            msgs.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "391"})
    await client.close()
    return out, ep.close_episode(key)


def test_a_streamed_conversation_gives_the_same_replies_and_the_same_recorded_ids(tok):
    async def body(ep, backend):
        return await _sdk_round_trip(ep, stream=False), await _sdk_round_trip(ep, stream=True)

    (plain, slot_a), (streamed, slot_b) = _run(tok, _stream_script, body)
    assert streamed == plain
    assert plain[0] == ("Let me compute.", [("calculator", {"expression": "17*23"})], "tool_calls")
    assert plain[1] == ("The product is <answer>391</answer>", [], "stop")
    (a,), (b,) = (
        slot_a.episode.segments,
        slot_b.episode.segments,
    )  # streaming is a transport: one row, the same ids
    assert a.ids == b.ids and a.loss_mask == b.loss_mask and a.calls == b.calls == 2


def test_malformed_requests_get_a_400_naming_the_field_and_valid_forms_pass(tok):
    good = {"role": "user", "content": "hi"}
    cases = {
        "messages.0.role": {"messages": [{"role": "alien", "content": "hi"}]},
        "max_tokens": {"messages": [good], "max_tokens": -5},
        "temperature": {"messages": [good], "temperature": "hot"},
        "messages.0.content": {"messages": [{"role": "user", "content": 7}]},
        "tools.0.type": {"messages": [good], "tools": [{"type": "plugin", "function": {"name": "f"}}]},
        "messages.1.tool_calls.0.function.arguments": {
            "messages": [
                good,
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
                },
            ]
        },
    }

    async def body(ep, backend):
        key = ep.open_episode("v")
        auth = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=ep.base_url) as http:
            bad = {f: (await http.post("/chat/completions", json=j, headers=auth)) for f, j in cases.items()}
            # content as text parts (LangChain sends these) renders as the same prompt as a string
            parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]
            ok = await http.post("/chat/completions", json={"messages": parts, "temperature": 0.5}, headers=auth)
            ok2 = await http.post("/chat/completions", json={"messages": [good], "temperature": 1}, headers=auth)
        return bad, ok, ok2, backend

    bad, ok, ok2, backend = _run(tok, lambda p: "hello", body)
    for field, r in bad.items():
        assert r.status_code == 400, (field, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"].startswith(f"invalid request: {field}")
    assert ok.status_code == ok2.status_code == 200
    assert len(backend.requests) == 2 and backend.requests[0].prompt_ids == backend.requests[1].prompt_ids


def test_chunked_and_expect_100_continue_bodies_and_health(tok):
    body_json = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()

    async def body(ep, backend):
        key = ep.open_episode("c")
        auth = {"Authorization": f"Bearer {key}"}

        async def chunks():  # an async iterator body: httpx sends it with Transfer-Encoding: chunked
            for i in range(0, len(body_json), 7):
                yield body_json[i : i + 7]

        async with httpx.AsyncClient(base_url=ep.base_url) as http:
            chunked = await http.post("/chat/completions", content=chunks(), headers=auth)
            health = await http.get("/health")  # no key needed; at the root too, as vLLM serves it
            root = await http.get(ep.base_url.removesuffix("/v1") + "/health")
        # Expect: 100-continue, by hand: the server must say 100 before the body is sent
        host, port = ep.base_url.split("//")[1].split("/")[0].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body_json)}\r\n"
            "Expect: 100-continue\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        interim = await reader.readline()
        writer.write(body_json)
        rest = await reader.read()
        writer.close()
        return chunked, (health, root), interim, rest, ep.close_episode(key)

    chunked, (health, root), interim, rest, slot = _run(tok, lambda p: "hello", body)
    assert chunked.status_code == 200 and chunked.json()["choices"][0]["message"]["content"] == "hello"
    assert health.status_code == root.status_code == 200 and health.json() == {"status": "ok"}
    assert interim.startswith(b"HTTP/1.1 100")
    assert b"HTTP/1.1 200" in rest and b'"content": "hello"' in rest
    assert slot.episode.calls == 2


def test_three_hundred_malformed_and_hostile_requests_get_4xx_never_5xx_and_the_server_keeps_serving(tok):
    """Random bodies built from the schema's pieces with wrong types, unknown roles and fields, odd methods, paths
    and encodings: each is answered with a JSON 4xx (or 200 when it happens to be valid), none with a 5xx, and a good
    request still works after them."""
    import random

    rng = random.Random(0)
    values = [None, 7, -5, 0, 1.5, "hot", "", "x" * 3000, [], {}, [1, 2], {"a": 1}, True, "alien", "\ud800"]

    def message():
        m = {
            "role": rng.choice(["user", "assistant", "tool", "system", "alien", 3, None]),
            "content": rng.choice([*values, "hi", [{"type": "text", "text": "hi"}], [{"type": "image_url"}]]),
        }
        if rng.random() < 0.3:
            m["tool_calls"] = rng.choice(values + [[{"id": "c", "function": {"name": "f", "arguments": 3}}]])
        return m

    def body():
        b = {"messages": rng.choice([[message() for _ in range(rng.randint(0, 3))], *values])}
        for k in ("max_tokens", "temperature", "top_p", "n", "stream", "tools", "seed", "stream_options"):
            if rng.random() < 0.4:
                b[k] = rng.choice(values)
        return json.dumps(b, ensure_ascii=False).encode("utf-8", "surrogatepass")

    async def run(ep, backend):
        key = ep.open_episode("fuzz")
        auth = {"Authorization": f"Bearer {key}"}
        statuses = []
        async with httpx.AsyncClient(base_url=ep.base_url, timeout=30) as http:
            for i in range(300):
                kind = i % 10
                if kind == 0:  # not JSON, or not UTF-8
                    r = await http.post(
                        "/chat/completions", content=rng.choice([b"\xff\xfe", b"[", b"null"]), headers=auth
                    )
                elif kind == 1:  # the wrong method or path
                    r = await http.request(
                        rng.choice(["GET", "PUT", "DELETE"]),
                        rng.choice(["/chat/completions", "/x", "/models"]),
                        headers=auth,
                    )
                else:
                    r = await http.post("/chat/completions", content=body(), headers=auth)
                assert r.headers["content-type"].startswith(("application/json", "text/event-stream")), r.text
                statuses.append(r.status_code)
            good = await http.post(
                "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, headers=auth
            )
        return statuses, good

    statuses, good = _run(tok, lambda p: "hello", run)
    assert len(statuses) == 300 and not [s for s in statuses if s >= 500]
    assert sum(400 <= s < 500 for s in statuses) > 200  # most of them are malformed, and said so
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "hello"
