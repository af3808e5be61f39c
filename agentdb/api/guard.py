"""The request guard, in front of every route. Before any body is read: text PostgreSQL cannot take in the path
or the query string is refused, a body must declare a JSON Content-Type (or NDJSON where an upload takes it;
anything else is 415, which keeps a browser from posting across sites without a preflight), and a body over
its endpoint's limit is refused (retrieval and the other requests have a small limit, the bulk uploads a
large one), also while it streams in. A body that is not small is only read once its sender is admitted
(a valid key, or a keyless server's own loopback client), and it is parsed and checked in a worker thread,
never on the event loop. The check refuses, with its JSON path: JSON that does not parse (with its line and
column), NUL characters, lone UTF-16 surrogates, integers beyond 64 bits, JSON nested deeper than MAX_DEPTH
levels and, outside the bulk uploads, lists longer than MAX_LIST_ITEMS. A path with a screen of its own (`screens`:
/mcp, whose JSON-RPC requests get their refusal as a JSON-RPC answer) takes the large body limit, and its
body goes to that screen instead, once its sender is admitted."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol
from urllib.parse import unquote

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentdb.errors import AgentDBError, InvalidParamValue, PayloadTooLarge, UnsupportedMediaType

# No request needs more: a filter nests at most 16 operators (about 35 JSON levels inside a request).
MAX_DEPTH = 64
# No list in a request needs more (a filter's value lists hold 10,000 items in all); the bulk uploads excepted.
MAX_LIST_ITEMS = 10_000
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


def value_problem(value: Any, max_items: int | None = None) -> tuple[str, tuple[Any, ...]] | None:
    """The first problem in a parsed JSON value and its location (walked without recursion); with
    `max_items`, a list longer than that is one (found before its items are walked)."""
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
            if max_items is not None and len(item) > max_items:
                return f"a list of {len(item)} items: at most {max_items} in a request", loc
            stack.extend((child, (*loc, i)) for i, child in reversed(list(enumerate(item))))
    return None


def parse_json(document: bytes) -> Any:
    """The JSON value of `document`; InvalidParamValue at `body` with the line and column when it is not JSON,
    or when it nests too deeply for the parser itself."""
    if not _LONG_NUMBER.search(document):
        try:
            return orjson.loads(document)
        except orjson.JSONDecodeError:
            pass  # perhaps only a lone surrogate (orjson refuses them); the standard parser says where
    try:
        return json.loads(document)
    except RecursionError:
        raise InvalidParamValue(f"JSON nested deeper than {MAX_DEPTH} levels", path="body") from None
    except json.JSONDecodeError as exc:
        raise InvalidParamValue(
            f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", path="body"
        ) from None
    except UnicodeDecodeError as exc:
        raise InvalidParamValue(
            f"the body is not UTF-8: {exc.reason} at byte {exc.start}", path="body"
        ) from None


def body_problem(
    body: bytes, *, lines: bool = False, max_items: int | None = None
) -> InvalidParamValue | None:
    """The first problem in a JSON body, or in each line of a JSON-lines body (`body:LINE.path`); with
    `max_items`, a list longer than that is one too."""
    if not body.strip():
        return None
    documents = (
        [(f"body:{n}", line) for n, line in enumerate(body.splitlines(), start=1) if line.strip()]
        if lines
        else [("", body)]
    )
    for prefix, text in documents:
        try:
            item = parse_json(text)
        except InvalidParamValue as exc:
            if prefix:
                exc.message = f"line {prefix[5:]}: {exc.message}"
                exc.path = prefix
            return exc
        found = value_problem(item, max_items)
        if found is not None:
            message, loc = found
            where = json_path(loc)
            path = where if not prefix else (prefix if where == "$" else f"{prefix}.{where}")
            return InvalidParamValue(message, path=path)
    return None


# Bodies up to this size are read and checked on the event loop before the caller is authenticated (that
# costs less than a thread hop); a larger one waits for its sender to be admitted and is checked in a thread.
SMALL_BODY = 64 * 1024
# The requests that carry data in bulk, by method and path: they take the large body limit and no list limit.
_UPLOADS = re.compile(
    r"^/sources/[^/]+/(documents|indexes/[^/]+/edges)$|^/memory/[^/]+/(records|entities|relations)$"
)
# The one upload that also reads JSON lines.
_NDJSON_UPLOAD = re.compile(r"^/sources/[^/]+/documents$")
JSON_TYPE = "application/json"
NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl")
_BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def media_type(headers: dict[bytes, bytes]) -> str | None:
    """The Content-Type's media type, lowercased (parameters such as charset dropped), or None."""
    value = headers.get(b"content-type")
    if value is None:
        return None
    return value.decode("latin-1").split(";", 1)[0].strip().lower()


class Screened(Protocol):
    """A screen's verdict on a body it will not pass on: the answer, the error, and whether the answer is for
    the request (sent with 200) or not (the error's envelope is sent instead)."""

    reply: dict[str, Any]
    error: AgentDBError
    answered: bool


class _Answer(Exception):
    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply


class RequestGuard:
    """ASGI middleware: checks path, query string and Content-Type, admits the sender of a large body, reads the
    body with a running size check, checks it, then hands the route the buffered body. `admit(scope)` raises
    the error a request's sender gets when it may not send a body (runs in a thread). `screens` maps a path
    to the check its POST bodies get instead of the usual one (None: the body goes on)."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        max_request_bytes: int,
        admit: Callable[[Scope], None] | None = None,
        screens: Mapping[str, Callable[[bytes], Screened | None]] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_request_bytes = min(max_request_bytes, max_body_bytes)
        self.admit = admit
        self.screens = dict(screens or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await self._checked_body(scope, receive)
        except AgentDBError as error:
            await refuse(send, error)
            return
        except _Answer as answer:
            await _answer(send, answer.reply)
            return
        if body is None:
            return  # the client went away
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the client to go away

        await self.app(scope, replay, send)

    async def _checked_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The request's body once every check passed (None when the client went away first). A body a browser
        may send cross-site without a preflight is refused (415) before anything else is read."""
        headers = dict(scope.get("headers") or [])
        method, path = scope.get("method", "GET"), scope.get("path", "")
        declared = headers.get(b"content-length", b"")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        has_body = chunked or (declared.isdigit() and int(declared) > 0)
        upload = method == "POST" and bool(_UPLOADS.match(path))
        screening = self.screens.get(path) if method == "POST" else None
        limit = (
            0
            if method not in _BODY_METHODS
            else self.max_body_bytes
            if upload or screening
            else self.max_request_bytes
        )
        kind = media_type(headers)
        lines = kind in NDJSON_TYPES
        if method in _BODY_METHODS and (has_body or kind is not None):
            accepted = (JSON_TYPE, *NDJSON_TYPES) if _NDJSON_UPLOAD.match(path) and upload else (JSON_TYPE,)
            if kind not in accepted:
                raise UnsupportedMediaType(
                    f"a request body must be sent as {' or '.join(accepted)}, not {kind or 'no Content-Type'}",
                    path="content-type",
                )
        for name, text in (
            ("path", path),
            ("query", unquote(scope.get("query_string", b"").decode("latin-1"), errors="surrogateescape")),
        ):
            problem = text_problem(text)
            if problem:
                raise InvalidParamValue(f"the request {name}: {problem}", path=name)
        if declared.isdigit() and int(declared) > limit:
            raise self._too_large(limit, int(declared))
        if not has_body:
            return b""
        large = chunked or int(declared) > SMALL_BODY
        if large and self.admit is not None:
            await run_in_threadpool(self.admit, scope)
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                raise self._too_large(limit, None)
            more = message.get("more_body", False)
        data = bytes(body)
        if screening is not None:
            screened = await run_in_threadpool(screening, data) if large else screening(data)
            if screened is None:
                return data
            if not large and self.admit is not None:
                await run_in_threadpool(self.admit, scope)  # only an admitted sender hears what was wrong
            if screened.answered:
                raise _Answer(screened.reply)
            raise screened.error
        max_items = None if upload else MAX_LIST_ITEMS
        if large:
            error = await run_in_threadpool(partial(body_problem, data, lines=lines, max_items=max_items))
        else:
            error = body_problem(data, lines=lines, max_items=max_items)
        if error is not None:
            raise error
        return data

    def _too_large(self, limit: int, declared: int | None) -> PayloadTooLarge:
        size = f"of {declared} bytes " if declared is not None else ""
        if limit == 0:
            return PayloadTooLarge(f"a {size}body on a request that takes none", path="body")
        return PayloadTooLarge(
            f"request body {size}is over this endpoint's limit of {limit} bytes",
            path="body",
            hint="send fewer documents per request, or raise AGENTDB_MAX_BODY_BYTES"
            if limit == self.max_body_bytes
            else "bulk data goes to the upload endpoints; an operator may raise AGENTDB_MAX_REQUEST_BYTES",
        )


async def _answer(send: Send, reply: dict[str, Any]) -> None:
    """A screen's JSON-RPC answer to the request (200)."""
    body = orjson.dumps(reply)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def refuse(send: Send, error: AgentDBError) -> None:
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
