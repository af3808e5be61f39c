"""The request guard, in front of every route: a body over the size limit is refused while it streams in
(before authentication or parsing), and text PostgreSQL cannot take is refused with its JSON path before it
reaches a query: NUL characters, lone UTF-16 surrogates, integers beyond 64 bits and JSON nested deeper
than MAX_DEPTH levels, in the path, the query string or a JSON (or JSON lines) body."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentdb.errors import AgentDBError, InvalidParamValue, PayloadTooLarge

# No request needs more: a filter nests at most 16 operators (about 35 JSON levels inside a request).
MAX_DEPTH = 64
_INT64 = 2**63
# A run of 19+ digits may be an integer beyond 64 bits, which orjson reads as a float: check those bodies
# with the standard parser, which keeps integers exact (as the routes will read them).
_LONG_NUMBER = re.compile(rb"\d{19}")


def json_path(loc: tuple[Any, ...]) -> str:
    """A location as a JSON path (`queries[0].filter.year`); a leading body/query/path/header is dropped."""
    parts = [
        _printable(str(p))
        for p in (loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    ]
    out = ""
    for part in parts:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out or "$"


def _printable(text: str) -> str:
    """`text` with the characters a JSON response cannot carry (lone surrogates) written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode()


def text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store `text`, or None."""
    if "\x00" in text:
        return "text cannot contain the NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode: it holds a lone UTF-16 surrogate"
    return None


def value_problem(value: Any) -> tuple[str, tuple[Any, ...]] | None:
    """The first problem in a parsed JSON value and its location (walked without recursion)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, loc = stack.pop()
        if len(loc) > MAX_DEPTH:
            return f"JSON nested deeper than {MAX_DEPTH} levels", loc
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return problem, loc
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -_INT64 <= item < _INT64:
                return "integer out of the 64-bit range", loc
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                problem = text_problem(key)
                if problem:
                    return problem, (*loc, key)
                stack.append((child, (*loc, key)))
        elif isinstance(item, list):
            stack.extend((child, (*loc, i)) for i, child in reversed(list(enumerate(item))))
    return None


def _parse(document: bytes) -> tuple[bool, Any]:
    """(parsed, value); a document that is not JSON (for either parser) is (False, None), except one too
    deep for the parsers, which is reported as such."""
    if not _LONG_NUMBER.search(document):
        try:
            return True, orjson.loads(document)
        except orjson.JSONDecodeError:
            pass  # perhaps only a lone surrogate (orjson refuses them); the standard parser says where
    try:
        return True, json.loads(document)
    except RecursionError:
        return True, _TooDeep
    except ValueError:
        return False, None


class _TooDeep:
    """Stands for a document nested too deeply for the parser itself."""


def body_problem(body: bytes) -> InvalidParamValue | None:
    """The first problem in a JSON body, or in each line of a JSON-lines body (`body:LINE.path`)."""
    if not body.strip():
        return None
    parsed, value = _parse(body)
    documents = [("", value)] if parsed else []
    if not parsed and b"\n" in body:
        for number, line in enumerate(body.splitlines(), start=1):
            ok, item = _parse(line)
            if ok:
                documents.append((f"body:{number}", item))
    for prefix, item in documents:
        if item is _TooDeep:
            found: tuple[str, tuple[Any, ...]] | None = (f"JSON nested deeper than {MAX_DEPTH} levels", ())
        else:
            found = value_problem(item)
        if found is not None:
            message, loc = found
            where = json_path(loc)
            path = where if not prefix else (prefix if where == "$" else f"{prefix}.{where}")
            return InvalidParamValue(message, path=path)
    return None


class RequestGuard:
    """ASGI middleware: reads the body with a running size check, validates path, query and body, then
    hands the route the buffered body."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, text in (
            ("path", scope.get("path", "")),
            ("query", unquote(scope.get("query_string", b"").decode("latin-1"), errors="surrogateescape")),
        ):
            problem = text_problem(text)
            if problem:
                await _refuse(send, InvalidParamValue(f"the request {name}: {problem}", path=name))
                return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _refuse(send, self._too_large(int(declared)))
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                await _refuse(send, self._too_large(None))
                return
            more = message.get("more_body", False)
        error = body_problem(bytes(body))
        if error is not None:
            await _refuse(send, error)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: wait for the client to go away

        await self.app(scope, replay, send)

    def _too_large(self, declared: int | None) -> PayloadTooLarge:
        size = f"of {declared} bytes " if declared is not None else ""
        return PayloadTooLarge(
            f"request body {size}is over the limit of {self.max_body_bytes} bytes",
            path="body",
            hint="send fewer documents per request, or raise AGENTDB_MAX_BODY_BYTES",
        )


async def _refuse(send: Send, error: AgentDBError) -> None:
    """Answer with the error envelope and close the connection (the rest of the body is not read)."""
    body = orjson.dumps({"error": error.to_dict()})
    await send(
        {
            "type": "http.response.start",
            "status": error.http_status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
