"""The OpenAI-compatible endpoint a rank serves while its rollout phase runs: `POST /v1/chat/completions`,
`GET /v1/models` and `GET /health`, on 127.0.0.1, backed by the rank's engine through its `EngineBackend` on the
rank's one event loop, so external agents' calls join the same continuous batch as nanosky's own loop.

Each episode gets its own secret key (`open_episode`); a call with another key gets 401, a call after the
episode closed gets 410. The prompt is rendered here and the engine samples token ids from it; the ids, their
logprobs and the weight version go into the episode's `Episode` (exact tokens, see episode.py). Sampling comes
from the run's config, so training stays on-policy: a request's own temperature / top_p are logged, not used, and
its max_tokens is capped by the config's. Every request is checked against the API's schema first (schema.py): a
malformed one is a 400 naming the field. `n > 1` gets 400. `stream: true` gets the same answer as server-sent
events in OpenAI's chunk format (tool-call deltas included): a transport only, the recorded ids are the same. A
`<tool_call>` in the sample comes back as OpenAI `tool_calls` (finish_reason "tool_calls"); a malformed one, or one
naming a tool the request did not offer, comes back as plain content. A retried request (the same Idempotency-Key,
as the OpenAI SDK sends on a retry) gets the first answer again and is recorded once.

    ep = Endpoint(backend, tok, Sampling(temperature=1.0, top_p=1.0, max_tokens=256), version=lambda: run.version)
    base_url = await ep.start()                     # http://127.0.0.1:PORT/v1, on the running loop
    key = ep.open_episode(task_id="t0")             # give the agent base_url and key
    ... the agent runs ...
    slot = ep.close_episode(key)                    # slot.episode.segments: the rows to train on
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envs.tools.parse import parse_tool_calls
from nanosky.agent.backends import BackendError, ContextLengthError, Request
from nanosky.agent.runner import observation_key
from nanosky.endpoint.episode import Episode
from nanosky.endpoint.http import EventStream, Server, error, serve
from nanosky.endpoint.schema import parse_chat
from nanosky.seeds import derive_seed

MODEL_NAME = "nanosky-policy"
"""What GET /v1/models lists; a request may name any model."""
ENDED_KEPT = 65536
"""Ended episodes whose keys still get 410 (not 401): the most recent ones."""


@dataclass
class Sampling:
    """The run's sampling settings: every call is sampled with these."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256  # per call
    max_total_tokens: int | None = None  # prompt + reply: a longer prompt gets 400 (context_length_exceeded)


@dataclass
class Slot:
    """One episode's state on the endpoint."""

    key: str
    task_id: str
    episode: Episode
    seed: int = 0  # call k samples with seed derive_seed(seed, k): the same call samples the same tokens
    sampling: Sampling | None = None  # None: the endpoint's
    closed: bool = False
    errors: int = 0  # calls answered with a 4xx
    asked: list[dict] = field(default_factory=list)  # what each call asked for (temperature, max_tokens, ...)
    # Idempotency-Key -> the answer, or its future while the first request is still being sampled (a client that
    # timed out retries while the server still works on the first)
    answered: dict[str, asyncio.Future] = field(default_factory=dict)
    last_text: str = ""  # the last sample, as the model wrote it (tool calls as text): what the env grades
    keys: list[str] = field(default_factory=list)  # per call: the messages it answered (GiGPO's state key)
    out_of_budget: bool = False  # a call was refused for --rollout.max-total-tokens: the episode is truncated
    backend: Any = None  # where its calls are sampled, when not the endpoint's (a carried episode: through the gate)


class Endpoint:
    def __init__(self, backend, tok, sampling: Sampling, version: Callable[[], int] = lambda: 0):
        self.backend, self.tok, self.sampling, self.version = backend, tok, sampling, version
        self.slots: dict[str, Slot] = {}
        self.ended: OrderedDict[str, None] = OrderedDict()  # keys of ended episodes: their calls get 410
        self._ids = itertools.count()
        self.fatal: Exception | None = None  # what the engine raised that must stop the run, not one episode
        self.server: Server | None = None
        self.base_url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self.server = await serve(self.handle, host, port)
        self.base_url = f"http://{host}:{self.server.port}/v1"
        return self.base_url

    async def stop(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            await server.close()

    def open_episode(self, task_id: str = "", seed: int = 0, sampling: Sampling | None = None, backend=None) -> str:
        """A key for one episode's calls; `backend` samples them in place of the endpoint's (partial rollouts: the
        carry's gate, which holds a carried episode's calls between phases)."""
        key = "nsk-" + secrets.token_urlsafe(24)
        self.slots[key] = Slot(key, task_id, Episode(self.tok), seed, sampling, backend=backend)
        return key

    def close_episode(self, key: str) -> Slot:
        """The episode ends: later calls with its key get 410, and a call in flight is answered 410 and not
        recorded. Returns its slot (the segments to train on)."""
        slot = self.slots.pop(key)
        slot.closed = True
        self.ended[key] = None
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)
        return slot

    async def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        path = path.rstrip("/")
        if path in ("/health", "/v1/health"):  # no key: a harness may check the server before its first call
            return (200, {"status": "ok"}) if method in ("GET", "HEAD") else error(405, "use GET /health")
        if path not in ("/v1/models", "/v1/chat/completions"):
            return error(
                404,
                f"no route {method} {path}: this endpoint serves /v1/chat/completions, /v1/models and /health",
            )
        key = headers.get("authorization", "").removeprefix("Bearer ").strip()
        slot = self.slots.get(key)
        if slot is None or slot.closed:
            if key in self.ended or slot is not None:
                return ENDED
            return error(401, "invalid API key: use the key given to this episode", "invalid_api_key")
        if path == "/v1/models":
            if method != "GET":
                return error(405, "use GET /v1/models")
            return 200, {
                "object": "list",
                "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "nanosky"}],
            }
        if method != "POST":
            return error(405, "use POST /v1/chat/completions")
        req, problem = parse_chat(body)
        if req is None:
            slot.errors += 1
            return error(400, f"invalid request: {problem}", "invalid_request", problem.split(":")[0])
        retry = headers.get("idempotency-key")
        if retry and retry in slot.answered:
            return as_stream(await asyncio.shield(slot.answered[retry]), req)
        first = asyncio.get_running_loop().create_future()
        if retry:
            slot.answered[retry] = first
        try:
            answer = await self.chat(slot, req)
        except BaseException as e:
            first.set_exception(e)
            first.exception()  # retrieved: a retry that never comes must not warn
            raise
        first.set_result(answer)
        if 400 <= answer[0] < 500 and answer is not ENDED:
            slot.errors += 1
        return as_stream(answer, req)

    async def chat(self, slot: Slot, req: dict) -> tuple[int, Any]:
        """Sample one reply for a request that passed the schema."""
        messages, tools = req["messages"], req.get("tools") or []
        if (req.get("n") or 1) != 1:
            return error(400, "n > 1 is not supported: send one request per sample", "unsupported_n", "n")
        asked = req.get("max_completion_tokens") or req.get("max_tokens")
        slot.asked.append({k: req.get(k) for k in ("model", "temperature", "top_p", "max_tokens", "seed")})
        sampling, ep = slot.sampling or self.sampling, slot.episode
        try:
            ids, cont = ep.prompt(messages, tools)
        except Exception as e:  # noqa: BLE001 - the chat template rejected these messages
            return error(400, f"the chat template cannot render these messages: {type(e).__name__}: {e}")
        budget = sampling.max_tokens
        if isinstance(asked, int) and asked > 0:
            budget = min(budget, asked)
        if sampling.max_total_tokens:
            if len(ids) >= sampling.max_total_tokens:
                slot.out_of_budget = True
                return error(
                    400,
                    f"the conversation ({len(ids)} tokens) has reached the run's limit of "
                    f"{sampling.max_total_tokens} (--rollout.max-total-tokens)",
                    "context_length_exceeded",
                )
            budget = min(budget, sampling.max_total_tokens - len(ids))
        key = observation_key(messages[len(ep.segments[-1].messages) :] if cont else messages[-1:])
        call = Request(
            messages,
            tools or None,
            budget,
            sampling.temperature,
            prompt_ids=ids,
            top_p=sampling.top_p,
            seed=derive_seed(slot.seed, ep.calls),
        )
        try:
            out = await (slot.backend or self.backend).generate(call)
        except ContextLengthError as e:
            slot.out_of_budget = True
            return error(400, f"the conversation no longer fits the context: {e}", "context_length_exceeded")
        except BackendError as e:
            return error(503, f"the engine failed: {e}")
        except Exception as e:  # noqa: BLE001 - stale weights, a bug: the run must stop (the harness raises it)
            self.fatal = self.fatal or e
            return error(503, f"the engine failed: {type(e).__name__}: {e}")
        reply, finish = self.reply(out.text, out.finish_reason, tools)
        if slot.closed:  # the episode ended while this call was sampled: it is not recorded
            return ENDED
        # the call's version: its first token's (a call cut at a phase's end goes on under the next weights)
        version = out.versions[0] if out.versions else self.version()
        ep.record(
            messages, tools, ids, cont, out.token_ids, out.logprobs, version, reply, out.finish_reason, out.versions
        )
        slot.last_text, slot.keys = out.text, [*slot.keys, key]
        n = next(self._ids)
        return 200, {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.get("model") or MODEL_NAME,
            "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(out.token_ids),
                "total_tokens": len(ids) + len(out.token_ids),
            },
        }

    @staticmethod
    def reply(text: str, finish_reason: str, tools: list[dict]) -> tuple[dict, str]:
        """The assistant message for a sample: its tool calls as OpenAI `tool_calls` when every one parsed and
        names one of the request's `tools` (the text around them is the content), else the text as it is. A call
        to a tool the request did not offer is malformed: SDKs raise on one (the Agents SDK's ModelBehaviorError),
        where plain content lets the harness go on and the env judge it."""
        names = {t.get("function", {}).get("name") for t in tools if isinstance(t, dict)}
        calls = parse_tool_calls(text) if tools and "<tool_call>" in text else []
        if not calls or any(c.error or c.name not in names for c in calls):
            return {"role": "assistant", "content": text}, finish_reason
        content = text.split("<tool_call>", 1)[0].strip() or None
        return {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {
                    "id": f"call_{secrets.token_hex(6)}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                }
                for c in calls
            ],
        }, "tool_calls"


ENDED = error(410, "this episode has ended (its rollout phase is over, or it timed out); its key is no longer valid")


def as_stream(answer: tuple[int, Any], req: dict) -> tuple[int, Any]:
    """A completion as OpenAI's `chat.completion.chunk` events when the request asked for `stream: true`: the role,
    the content, one delta per tool call, the finish reason, and the usage when `stream_options.include_usage`.
    Errors stay plain JSON replies with their status."""
    status, obj = answer
    if status != 200 or not req.get("stream"):
        return answer
    head = {
        "id": obj["id"],
        "object": "chat.completion.chunk",
        "created": obj["created"],
        "model": obj["model"],
    }
    msg, finish = obj["choices"][0]["message"], obj["choices"][0]["finish_reason"]

    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    events = [chunk({"role": "assistant", "content": ""})]
    if msg.get("content"):
        events.append(chunk({"content": msg["content"]}))
    for k, call in enumerate(msg.get("tool_calls") or []):
        events.append(chunk({"tool_calls": [{"index": k, **call}]}))
    events.append(chunk({}, finish))
    if (req.get("stream_options") or {}).get("include_usage"):
        events.append(head | {"choices": [], "usage": obj["usage"]})
    return status, EventStream(events)
