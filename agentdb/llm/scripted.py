"""The scripted provider: a deterministic model for tests and offline demos that goes through the very same
code as the Anthropic provider. It IS an AnthropicModel; only its HTTP transport differs: instead of the
network, a transport replays scripted Messages API responses (as JSON, or as server-sent events when the
SDK streams), so the SDK's request building and response parsing are the real ones.

A script is a list of items, used in order, one per HTTP request:
  * a string: a text answer (`stop_reason` end_turn);
  * a dict: a Messages API response body (see `text_message`, `tool_use_message`); missing `id`, `model`,
    `usage` and `stop_reason` are filled in deterministically;
  * `ScriptedError(status, type, message)`: an HTTP error answer (e.g. `overloaded()` is a 529);
  * `ScriptedTimeout()`: the request times out;
  * a callable taking the request body (a dict) and returning one of the above: a responder.
When the script runs out, `default` (an item, typically a responder) answers; without one the request
fails with a 400 that says the script is exhausted.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx2

from agentdb.llm.anthropic_provider import AnthropicModel


@dataclass(frozen=True)
class ScriptedError:
    """An HTTP error answer with the Messages API error body."""

    status: int
    type: str = "api_error"
    message: str = "scripted error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ScriptedTimeout:
    """The request times out (the transport raises a read timeout)."""


ScriptItem = Any  # str | dict | ScriptedError | ScriptedTimeout | Callable[[dict], ...]


def text_message(
    text: str, *, stop_reason: str = "end_turn", usage: dict[str, int] | None = None
) -> dict[str, Any]:
    """A Messages API response with one text block."""
    body: dict[str, Any] = {
        "type": "message",
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def tool_use_message(
    name: str,
    tool_input: Any,
    *,
    text: str | None = None,
    tool_id: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A Messages API response calling tool `name` with `tool_input` (after an optional text block)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.append({"type": "tool_use", "id": tool_id or "", "name": name, "input": tool_input})
    body: dict[str, Any] = {"type": "message", "content": content, "stop_reason": "tool_use"}
    if usage is not None:
        body["usage"] = usage
    return body


def overloaded() -> ScriptedError:
    return ScriptedError(529, "overloaded_error", "Overloaded")


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _sse(events: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def message_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A complete Messages API response as the stream of server-sent events the API would send for it."""
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**message["usage"], "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            )
            for piece in re.findall(r"\S*\s*", block["text"]) or [""]:
                if piece:
                    events.append(
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": piece},
                        }
                    )
        elif block["type"] == "tool_use":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                }
            )
        else:
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": message["usage"]["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events


class ScriptedTransport(httpx2.MockTransport):
    """An httpx2 transport that answers POST /v1/messages from a script and records every request body."""

    def __init__(self, script: Iterable[ScriptItem] = (), *, default: ScriptItem | None = None) -> None:
        super().__init__(self._handle)
        self.script = list(script)
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.method != "POST" or not request.url.path.endswith("/v1/messages"):
            return _error_response(
                ScriptedError(
                    404,
                    "not_found_error",
                    f"the scripted model only serves POST /v1/messages, not {request.method} {request.url.path}",
                )
            )
        body = json.loads(request.content)
        with self._lock:
            self.requests.append(body)
            n = next(self._ids)
            item = self.script.pop(0) if self.script else self.default
        if item is None:
            return _error_response(
                ScriptedError(
                    400, "invalid_request_error", f"the scripted model has no response left (request {n})"
                )
            )
        if callable(item) and not isinstance(item, ScriptedError | ScriptedTimeout):
            item = item(body)
        if isinstance(item, ScriptedTimeout):
            raise httpx2.ReadTimeout("scripted timeout", request=request)
        if isinstance(item, ScriptedError):
            return _error_response(item)
        message = self._complete(text_message(item) if isinstance(item, str) else dict(item), body, n)
        if body.get("stream"):
            return httpx2.Response(
                200, content=_sse(message_events(message)), headers={"content-type": "text/event-stream"}
            )
        return httpx2.Response(200, json=message)

    @staticmethod
    def _complete(message: dict[str, Any], request: dict[str, Any], n: int) -> dict[str, Any]:
        message.setdefault("type", "message")
        message.setdefault("id", f"msg_scripted_{n}")
        message.setdefault("role", "assistant")
        message.setdefault("model", request.get("model", "scripted"))
        message.setdefault("stop_reason", "end_turn")
        message.setdefault("stop_sequence", None)
        content = []
        for i, block in enumerate(message.get("content", [])):
            if block.get("type") == "tool_use" and not block.get("id"):
                block = {**block, "id": f"toolu_scripted_{n}_{i}"}
            content.append(block)
        message["content"] = content
        if "usage" not in message:
            output = "".join(b.get("text", "") or json.dumps(b.get("input", "")) for b in content)
            message["usage"] = {
                "input_tokens": _estimate_tokens(json.dumps(request)),
                "output_tokens": _estimate_tokens(output),
            }
        return message


def _error_response(error: ScriptedError) -> httpx2.Response:
    return httpx2.Response(
        error.status,
        json={"type": "error", "error": {"type": error.type, "message": error.message}},
        headers=error.headers,
    )


class ScriptedModel(AnthropicModel):
    """A deterministic model driven by a script; see the module docstring. `requests` holds every request
    body the SDK sent, for assertions."""

    provider = "scripted"

    def __init__(
        self,
        script: Iterable[ScriptItem] = (),
        *,
        model: str = "scripted",
        default: ScriptItem | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff_base: float = 0.0,
        backoff_max: float = 0.0,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.transport = ScriptedTransport(script, default=default)
        kwargs: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}
        super().__init__(
            model,
            api_key="scripted",
            base_url="http://scripted.invalid",
            http_client=httpx2.Client(transport=self.transport),
            timeout=timeout,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            **kwargs,
        )

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.transport.requests


# --- the offline demo responder ------------------------------------------------------------------------

_DOCUMENT = re.compile(r'<document id="([^"]*)"[^>]*>\s*(.*?)\s*</document>', re.S)
_SENTENCE = re.compile(r"(.+?[.!?])(\s|$)", re.S)


def _request_text(body: dict[str, Any]) -> str:
    parts = [body.get("system") or ""] if isinstance(body.get("system"), str) else []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts.extend(b.get("text", "") for b in content or [] if isinstance(b, dict))
    return "\n".join(parts)


def _minimal_value(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "object":
        return {name: _minimal_value(sub) for name, sub in schema.get("properties", {}).items()}
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "array":
        return []
    return "scripted answer"


def demo_responder(body: dict[str, Any]) -> dict[str, Any]:
    """Answer without a language model: a forced tool gets the smallest input its schema allows (for the
    deepening judge: sufficient), and a question gets the first sentence of up to three retrieved documents,
    each cited as [id]."""
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "tool":
        tool = next((t for t in body.get("tools", []) if t.get("name") == choice.get("name")), None)
        if tool is not None:
            return tool_use_message(tool["name"], _minimal_value(tool.get("input_schema", {})))
    documents = _DOCUMENT.findall(_request_text(body))
    if not documents:
        return text_message("Scripted answer (no language model was called): no documents were retrieved.")
    lines = ["Scripted answer (no language model was called); the retrieved documents say:"]
    for doc_id, text in documents[:3]:
        flat = " ".join(text.split())
        sentence = _SENTENCE.match(flat)
        lines.append(f"- {sentence.group(1) if sentence else flat[:200]} [{doc_id}]")
    return text_message("\n".join(lines))


__all__ = [
    "ScriptItem",
    "ScriptedError",
    "ScriptedModel",
    "ScriptedTimeout",
    "ScriptedTransport",
    "demo_responder",
    "message_events",
    "overloaded",
    "text_message",
    "tool_use_message",
]
