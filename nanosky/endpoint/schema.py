"""The request schema of `POST /v1/chat/completions`, as pydantic models: what OpenAI's API accepts, checked before
anything reaches the chat template (and so the trained tokens). A request that does not fit gets a 400 naming the
field (`invalid_request`); OpenAI's valid forms pass, content as a list of text parts (LangChain) among them.
Fields this endpoint does not use (`tool_choice`, `stop`, `user`, ...) are accepted and ignored, as the run's
config decides the sampling.

    req, problem = parse_chat(body)      # (the request as a dict, None) or (None, "messages.0.role: ...")
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

Number = StrictInt | StrictFloat  # JSON numbers only: "0.5" as a string is not a temperature


class _Open(BaseModel):
    """Unknown fields pass (clients add their own: `refusal`, `annotations`, vendor extensions)."""

    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(_Open):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(_Open):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None


class FunctionDef(_Open):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: StrictBool | None = None


class ChatRequest(_Open):
    model: StrictStr | None = None
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[Tool] | None = None
    n: Annotated[StrictInt, Field(ge=1)] | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    seed: StrictInt | None = None


def parse_chat(body: bytes) -> tuple[dict | None, str | None]:
    """The request as the client sent it (a dict: what is recorded and rendered), or why it is malformed."""
    try:
        raw = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, f"the body is not JSON: {e}"
    if not isinstance(raw, dict):
        return None, "the body must be a JSON object"
    try:
        ChatRequest.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        got = err.get("input")
        shown = "" if isinstance(got, dict | list) else f" (got {json.dumps(got)[:80]})"
        more = f"; and {e.error_count() - 1} more" if e.error_count() > 1 else ""
        return None, f"{where}: {err['msg']}{shown}{more}"
    return raw, None
