"""The agent's endpoint: how the model is called (:class:`AgentSettings`), an OpenAI client whose every request
has an overall deadline, the reading of a chat completion into text and tool calls (:func:`read_reply`, or
:class:`EndpointFailed` saying why the answer is not one), and the API key kept out of every text
(:func:`redactor`)."""

from __future__ import annotations

import json
import math
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from ait_env.observe.metrics import Prices

ToolMode = Literal["auto", "native", "text"]


class AgentSettings(BaseModel):
    """How the agent's model is called."""

    base_url: str
    model: str
    api_key: str = Field("none", repr=False)
    tool_mode: ToolMode = "auto"
    temperature: float = 0.7
    max_tokens: int = 4096
    timeout_s: float = 300.0
    max_retries: int = 6
    prices: Prices = Field(default_factory=lambda: Prices.from_dict({}))


class EndpointFailed(Exception):
    """The endpoint's answer is not a usable chat completion (the episode ends ``endpoint_failed``)."""


def _deadline_stream(inner: Any, deadline: float, request: Any) -> Any:
    """An httpx response body that raises ``httpx.ReadTimeout`` once ``deadline`` has passed."""
    import httpx

    class DeadlineStream(httpx.SyncByteStream):
        def __iter__(self) -> Any:
            for chunk in inner:
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("the answer did not complete within its deadline", request=request)
                yield chunk

        def close(self) -> None:
            inner.close()

    return DeadlineStream()


def _deadline_transport(total_s: float) -> Any:
    """An httpx transport whose every request must complete (headers and body) within ``total_s``."""
    import httpx

    class DeadlineTransport(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            deadline = time.monotonic() + total_s
            resp = super().handle_request(request)
            if time.monotonic() > deadline:
                resp.close()
                raise httpx.ReadTimeout("the answer did not start within its deadline", request=request)
            return httpx.Response(resp.status_code, headers=resp.headers, request=request,
                                  stream=_deadline_stream(resp.stream, deadline, request),
                                  extensions=resp.extensions)

    return DeadlineTransport()


def make_client(agent: AgentSettings) -> Any:
    import httpx
    from openai import OpenAI

    http = httpx.Client(transport=_deadline_transport(agent.timeout_s),
                        timeout=httpx.Timeout(agent.timeout_s, connect=min(30.0, agent.timeout_s)))
    return OpenAI(base_url=agent.base_url, api_key=agent.api_key, timeout=agent.timeout_s,
                  max_retries=agent.max_retries, http_client=http)


def redactor(secret: str) -> Any:
    """``redact(text)``: ``text`` without ``secret`` (and its JSON-escaped form); identity for no secret."""
    forms = sorted({f for f in (secret, json.dumps(secret)[1:-1]) if f and len(f) >= 4 and f != "none"},
                   key=len, reverse=True)

    def redact(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        for f in forms:
            text = text.replace(f, "<redacted>")
        return text

    return redact


def _count(value: Any) -> int:
    """A token count as an int (0 for anything that is not a finite non-negative number)."""
    try:
        n = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return int(n) if math.isfinite(n) and 0 <= n < 1e12 else 0


def _text(content: Any) -> str | None:
    """Message content as text: a string, or the text of a list of content parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            part = part.model_dump() if hasattr(part, "model_dump") else part
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise EndpointFailed(f"the message content is a {type(content).__name__}, not text")


def read_reply(resp: Any, native: bool) -> tuple[str | None, list[tuple[str, Any]], int, int]:
    """(content, tool calls as (name, raw arguments), prompt tokens, completion tokens) of a chat completion,
    or :class:`EndpointFailed` saying why it is not one."""
    choices = getattr(resp, "choices", None)
    if not isinstance(choices, list):
        raise EndpointFailed(f"the endpoint answered with something that is not a chat completion: "
                             f"{str(resp)[:200]!r}")
    if not choices:
        raise EndpointFailed("the endpoint answered with no choices")
    message = getattr(choices[0], "message", None)
    if message is None or isinstance(message, (str, int, float, bool, list)) \
            or not (hasattr(message, "content") or hasattr(message, "tool_calls")):
        raise EndpointFailed(f"the endpoint's first choice has no message ({str(message)[:80]!r})")
    content = _text(getattr(message, "content", None))
    calls: list[tuple[str, Any]] = []
    if native:
        for c in getattr(message, "tool_calls", None) or []:
            fn = getattr(c, "function", None)
            if fn is not None and isinstance(getattr(fn, "name", None), str):
                calls.append((fn.name, getattr(fn, "arguments", None)))
    usage = getattr(resp, "usage", None)
    return content, calls, _count(getattr(usage, "prompt_tokens", 0)), _count(getattr(usage, "completion_tokens", 0))


def served_model(client: Any, model: str) -> dict[str, Any]:
    """The endpoint's ``/v1/models`` entry for ``model`` (e.g. the project's endpoints add the weights hash,
    ``ait_weights_hash``), recorded with the results; ``{}`` when the endpoint does not list it."""
    try:
        for m in client.models.list().data:
            entry = m.model_dump() if hasattr(m, "model_dump") else dict(m)
            if entry.get("id") == model:
                return {k: v for k, v in entry.items() if isinstance(v, (str, int, float, bool)) and k != "object"}
    except Exception:  # noqa: BLE001 - a hosted API may not list models; nothing depends on it
        pass
    return {}


#: how endpoints say a request is longer than the model's context: vLLM's 400 ("This model's maximum context
#: length is N tokens"), the local endpoints' (the same words), OpenAI's error code ``context_length_exceeded``
CONTEXT_OVERFLOW_HINTS = ("maximum context length", "context_length_exceeded", "context length")


def context_overflow(exc: BaseException) -> bool:
    """Whether an endpoint's 400 says the request is longer than the model's context."""
    text = f"{getattr(exc, 'code', '') or ''} {exc}".lower()
    return any(h in text for h in CONTEXT_OVERFLOW_HINTS)
