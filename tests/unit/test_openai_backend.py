"""`OpenAIBackend` against scripted servers that refuse parts of a request: a refused JSON constraint is asked again
in the next weaker form (regex, json_schema, plain) and later requests start there; concurrent refusals of one form
weaken it once; a server with no tool-call parser is asked again with `tool_choice: none`; any other error, or a
refusal of what was not sent, is raised at once."""

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from nanosky.agent.backends import BackendError, OpenAIBackend, Refused, Request

REPLY = {"choices": [{"message": {"role": "assistant", "content": "{}"}}]}
TOOLS = [{"name": "add", "description": "a + b", "parameters": {"properties": {"a": {}, "b": {}}}}]


def _req(**kw) -> Request:
    return Request([{"role": "user", "content": "hi"}], kw.pop("tools", None), 16, 0.0, **kw)


def _constrained() -> Request:
    return _req(json_schema={"type": "object"}, json_regex=r"\{\}")


def _form(body: dict) -> str:
    return "regex" if "structured_outputs" in body else "json_schema" if "response_format" in body else "plain"


def _serve(chat, requests, vllm: bool = True):
    """Runs `requests(backend)` against a server whose chat endpoint is `chat(body) -> (status, json)`; returns what
    `requests` returned, every chat body in order, and the backend."""
    bodies = []

    async def models(request):
        return web.json_response({"data": [{"id": "m", "owned_by": "vllm" if vllm else "someone"}]})

    async def completions(request):
        body = await request.json()
        bodies.append(body)
        status, out = await chat(body)
        return web.json_response(out, status=status)

    async def go():
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", completions)
        async with TestServer(app) as server:
            backend = OpenAIBackend(str(server.make_url("/v1")), "m", max_retries=0)
            try:
                return await requests(backend), bodies, backend
            finally:
                await backend.aclose()

    return asyncio.run(go())


def test_a_refused_constraint_is_weakened_within_the_request_down_to_plain():
    async def chat(body):
        if _form(body) != "plain":
            return 400, {"error": {"message": f"{_form(body)} structured_outputs / response_format not supported"}}
        return 200, REPLY

    async def twice(backend):
        return [await backend.generate(_constrained()) for _ in range(2)]

    outs, bodies, backend = _serve(chat, twice)
    assert [o.text for o in outs] == ["{}", "{}"] and backend.constraint == "plain"
    assert [_form(b) for b in bodies] == ["regex", "json_schema", "plain", "plain"]  # the second starts plain


def test_concurrent_refusals_of_one_form_weaken_it_once():
    both_sent = asyncio.Event()
    regex = []

    async def chat(body):
        if _form(body) == "regex":
            regex.append(body)
            if len(regex) == 2:
                both_sent.set()
            await both_sent.wait()  # both requests were sent as regex before either is refused
            return 400, {"error": {"message": "structured_outputs: regex not supported"}}
        return 200, REPLY

    async def together(backend):
        return await asyncio.gather(backend.generate(_constrained()), backend.generate(_constrained()))

    outs, bodies, backend = _serve(chat, together)
    assert len(outs) == 2 and backend.constraint == "json_schema"  # one step weaker, not two
    assert sorted(_form(b) for b in bodies) == ["json_schema", "json_schema", "regex", "regex"]


def test_a_server_without_a_tool_parser_is_asked_with_tool_choice_none_from_then_on():
    async def chat(body):
        if "tools" in body and body.get("tool_choice") != "none":
            return 400, {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}}
        return 200, REPLY

    async def twice(backend):
        return [await backend.generate(_req(tools=TOOLS)) for _ in range(2)]

    outs, bodies, backend = _serve(chat, twice)
    assert len(outs) == 2 and backend.tool_choice == "none"
    assert [b.get("tool_choice") for b in bodies] == [None, "none", "none"]


@pytest.mark.parametrize(
    ("message", "req", "kind"),
    [
        ("bad request: max_tokens must be positive", _constrained, BackendError),
        ("response_format is not supported", _req, Refused),  # no constraint was sent: nothing to weaken
        ("tool choice none is not supported", lambda: _req(tools=TOOLS), Refused),  # tool_choice none refused too
    ],
)
def test_any_other_error_or_a_refusal_of_what_was_not_sent_is_raised_at_once(message, req, kind):
    async def chat(body):
        return 400, {"error": {"message": message}}

    async def once(backend):
        if "tool choice" in message:
            backend.tool_choice = "none"
        with pytest.raises(BackendError) as e:
            await backend.generate(req())
        return e.value

    err, bodies, _ = _serve(chat, once)
    assert type(err) is kind and err.status == 400 and message in str(err)
    assert len(bodies) == 1  # asked once
