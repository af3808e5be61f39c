"""A strict fake of Anthropic's Messages API (POST /v1/messages) for the real SDK, written independently of
agentdb's scripted provider: it checks requests the way the API does (authentication, version header,
body shape, tool definitions, tool_choice, tool_result pairing), records them, and answers from a queue
of replies as JSON or as server-sent events. Use it as an httpx2 transport (`FakeAnthropicAPI.client()`),
or behind a real HTTP server on 127.0.0.1 (`serve`), e.g. to exercise socket timeouts and base URLs."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2

from agentdb.llm import AnthropicModel

API_KEY = "sk-ant-test-0123456789"
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_TOOL_IDS = itertools.count(1)
STOP_REASONS = (
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
)


def reply_text(
    text: str, *, stop_reason: str = "end_turn", input_tokens: int = 11, output_tokens: int = 7
) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def reply_tool(
    name: str,
    tool_input: Any,
    *,
    text: str | None = None,
    input_tokens: int = 13,
    output_tokens: int = 5,
    stop_reason: str = "tool_use",
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.append(
        {"type": "tool_use", "id": f"toolu_fake_{next(_TOOL_IDS)}", "name": name, "input": tool_input}
    )
    return {
        "content": content,
        "stop_reason": stop_reason,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


@dataclass
class Status:
    """An error answer."""

    code: int
    type: str = "api_error"
    message: str = "fake error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Timeout:
    """The transport times out (only meaningful in-process; behind `serve`, use Delay)."""


@dataclass
class Disconnect:
    """The connection fails."""


@dataclass
class Delay:
    """Wait `seconds`, then answer with `then`."""

    seconds: float
    then: Any


@dataclass
class StreamError:
    """A stream that sends `text`, then an `error` event (e.g. overloaded) instead of finishing."""

    text: str
    error_type: str = "overloaded_error"


def _error(code: int, kind: str, message: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(
        code,
        json={"type": "error", "error": {"type": kind, "message": message}},
        headers={"request-id": "req_fake", **(headers or {})},
    )


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


class FakeAnthropicAPI:
    def __init__(self, replies: list[Any] | None = None, *, api_key: str = API_KEY) -> None:
        self.replies = list(replies or [])
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.urls: list[str] = []
        self.on_request: Any = None  # a hook called with each request body, e.g. to cancel
        self._lock = threading.Lock()
        self._n = 0

    # -- plumbing --

    def client(self) -> httpx2.Client:
        return httpx2.Client(transport=httpx2.MockTransport(self.handle))

    def model(self, name: str = "claude-test-1", **kwargs: Any) -> AnthropicModel:
        kwargs.setdefault("backoff_base", 0.0)
        kwargs.setdefault("base_url", "https://fake-anthropic.test")
        return AnthropicModel(name, api_key=self.api_key, http_client=self.client(), **kwargs)

    # -- the API --

    def _check(self, request: httpx2.Request) -> tuple[dict[str, Any] | None, httpx2.Response | None]:
        if request.method != "POST" or not request.url.path.endswith("/v1/messages"):
            return None, _error(404, "not_found_error", f"{request.method} {request.url.path} not found")
        given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix(
            "Bearer "
        )
        if given != self.api_key:
            return None, _error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return None, _error(400, "invalid_request_error", "anthropic-version: header is required")
        try:
            body = json.loads(request.content)
        except ValueError:
            return None, _error(400, "invalid_request_error", "the body is not JSON")
        problem = self._body_problem(body)
        if problem:
            return body, _error(400, "invalid_request_error", problem)
        return body, None

    @staticmethod
    def _body_problem(body: dict[str, Any]) -> str | None:
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "model: field required"
        if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
            return "max_tokens: must be a positive integer"
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: at least one message is required"
        if "system" in body and not isinstance(body["system"], str | list):
            return "system: must be a string or a list of text blocks"
        pending: set[str] = set()
        for i, m in enumerate(messages):
            if m.get("role") not in ("user", "assistant"):
                return f"messages.{i}.role: must be user or assistant"
            content = m.get("content")
            if isinstance(content, str):
                if pending:
                    return f"messages.{i}: tool_use ids {sorted(pending)} were not answered by tool_result blocks"
                continue
            if not isinstance(content, list) or not content:
                return f"messages.{i}.content: must be a string or a non-empty list of blocks"
            results = {b.get("tool_use_id") for b in content if b.get("type") == "tool_result"}
            if m["role"] == "user" and pending and not pending <= results:
                return f"messages.{i}: tool_use ids {sorted(pending - results)} were not answered by tool_result blocks"
            pending = (
                {b["id"] for b in content if b.get("type") == "tool_use"}
                if m["role"] == "assistant"
                else set()
            )
        tools = body.get("tools", [])
        names = set()
        for i, tool in enumerate(tools):
            if not TOOL_NAME.match(str(tool.get("name", ""))):
                return f"tools.{i}.name: invalid"
            schema = tool.get("input_schema")
            if not isinstance(schema, dict) or schema.get("type") != "object":
                return f"tools.{i}.input_schema: type must be object"
            names.add(tool["name"])
        choice = body.get("tool_choice")
        if choice is not None:
            if choice.get("type") not in ("auto", "any", "none", "tool"):
                return "tool_choice.type: invalid"
            if choice["type"] == "tool" and choice.get("name") not in names:
                return f"tool_choice.name: no tool named {choice.get('name')!r}"
        return None

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        body, refusal = self._check(request)
        with self._lock:
            if body is not None:
                self.requests.append(body)
            self.urls.append(str(request.url))
            self._n += 1
            n = self._n
            reply = (
                None
                if refusal is not None
                else (self.replies.pop(0) if self.replies else Status(500, "api_error", "no reply queued"))
            )
        if self.on_request is not None and body is not None:
            self.on_request(body)
        if refusal is not None:
            return refusal
        while isinstance(reply, Delay):
            time.sleep(reply.seconds)
            reply = reply.then
        if isinstance(reply, Timeout):
            raise httpx2.ReadTimeout("fake timeout", request=request)
        if isinstance(reply, Disconnect):
            raise httpx2.ConnectError("fake connection refused", request=request)
        if isinstance(reply, Status):
            return _error(reply.code, reply.type, reply.message, reply.headers)
        assert body is not None and isinstance(reply, dict | StreamError)
        if isinstance(reply, StreamError):
            return self._stream_error(body, reply)
        message = {
            "id": f"msg_fake_{n}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "stop_sequence": None,
            **reply,
        }
        if body.get("stream"):
            return httpx2.Response(
                200, content=self._events(message), headers={"content-type": "text/event-stream"}
            )
        return httpx2.Response(200, json=message, headers={"request-id": f"req_fake_{n}"})

    @staticmethod
    def _events(message: dict[str, Any]) -> bytes:
        head = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0},
        }
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": head}),
            ("ping", {"type": "ping"}),
        ]
        for i, block in enumerate(message["content"]):
            if block["type"] == "text":
                events.append(
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "text", "text": ""},
                        },
                    )
                )
                text = block["text"]
                for start in range(0, len(text), 5):  # 5-character deltas
                    events.append(
                        (
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": i,
                                "delta": {"type": "text_delta", "text": text[start : start + 5]},
                            },
                        )
                    )
            else:
                events.append(
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}},
                    )
                )
                raw = json.dumps(block["input"])
                half = len(raw) // 2
                for part in (raw[:half], raw[half:]):
                    events.append(
                        (
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": i,
                                "delta": {"type": "input_json_delta", "partial_json": part},
                            },
                        )
                    )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": message["usage"]["output_tokens"]},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return _sse(events)

    @staticmethod
    def _stream_error(body: dict[str, Any], reply: StreamError) -> httpx2.Response:
        head = {
            "id": "msg_fake_err",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 0},
        }
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": head}),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            *(
                [
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": reply.text},
                        },
                    )
                ]
                if reply.text
                else []
            ),
            ("error", {"type": "error", "error": {"type": reply.error_type, "message": "Overloaded"}}),
        ]
        return httpx2.Response(200, content=_sse(events), headers={"content-type": "text/event-stream"})


@contextmanager
def serve(api: FakeAnthropicAPI) -> Iterator[str]:
    """Serve `api` over real HTTP on 127.0.0.1 (a free port); yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            length = int(self.headers.get("content-length", 0))
            request = httpx2.Request(
                "POST",
                f"http://fake{self.path}",
                headers=dict(self.headers.items()),
                content=self.rfile.read(length),
            )
            try:
                response = api.handle(request)
                response.read()
                self.send_response(response.status_code)
                for key, value in response.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("content-length", str(len(response.content)))
                self.end_headers()
                self.wfile.write(response.content)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
