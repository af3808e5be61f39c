"""The screen in front of MCP, for both transports: a JSON-RPC message whose content agentdb refuses (NUL, lone
surrogates, nesting past the request guard's depth, integers beyond 64 bits, overlong lists, a message over
the request size limit, bytes that are not UTF-8) is answered here, before the SDK parses it. A well-framed
request to tools/call gets a tool error (isError) with agentdb's code, name, message and path (the path inside
the tool's arguments, as the server's own checks give it); another request whose id is recoverable gets a
JSON-RPC error (-32602) for that id; a message with no recoverable id gets a parse error (-32700, id null).
The id and method of a message the parsers refuse are found by an iterative token scan whose depth is bounded:
a message nested 10,000 levels deep costs a loop, never a recursion."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agentdb.api.guard import MAX_DEPTH, MAX_LIST_ITEMS, body_problem, json_path
from agentdb.errors import AgentDBError, InvalidParamValue, PayloadTooLarge

PARSE_ERROR, INVALID_PARAMS = -32700, -32602
# A JSON token: a string (escapes included), a structural character, or a run of anything else (a number,
# true / false / null, or garbage the parser would refuse).
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+', re.S)
_ARGUMENTS = ("params", "arguments")


@dataclass
class Screened:
    """What to answer instead of passing the message on: `reply`, a JSON-RPC message; `error`, agentdb's
    error; `answered`, whether the reply is for a request's id (else it is a parse error, id null)."""

    reply: dict[str, Any]
    error: AgentDBError
    answered: bool


@dataclass
class _Frame:
    request_id: int | str | None = None
    method: str | None = None
    balanced: bool = False
    deep: tuple[Any, ...] | None = None  # where nesting first passed MAX_DEPTH
    undecodable: tuple[Any, ...] | None = None  # the first string holding bytes that are not UTF-8


def _scan(text: str, lossy: bool) -> _Frame:
    """The top level's id and method, whether the brackets balance to one top-level object, and the location
    of the first over-deep container (and, when `lossy`, of the first string with replaced bytes)."""
    frame = _Frame()
    stack: list[list[Any]] = []  # [kind, key or index] per container, at most MAX_DEPTH of them
    depth = 0
    expect_key = False
    closed_top = False
    for match in _TOKEN.finditer(text):
        token = match.group()
        if closed_top:
            return frame  # something after the top-level value: not one message
        first = token[0]
        if first in "{[":
            depth += 1
            if depth > MAX_DEPTH:
                if frame.deep is None:
                    frame.deep = tuple(entry[1] for entry in stack)
            else:
                stack.append([first, None if first == "{" else 0])
            expect_key = first == "{"
        elif first in "}]":
            if depth == 0:
                return frame
            if depth <= MAX_DEPTH:
                stack.pop()
            depth -= 1
            expect_key = False
            closed_top = depth == 0
        elif first == ":":
            expect_key = False
        elif first == ",":
            if depth <= MAX_DEPTH and stack:
                if stack[-1][0] == "[":
                    stack[-1][1] += 1
                else:
                    expect_key = True
        elif depth <= MAX_DEPTH and stack:
            if expect_key and stack[-1][0] == "{":
                stack[-1][1] = _scalar(token)
                continue
            where = tuple(entry[1] for entry in stack)
            if lossy and first == '"' and "\ufffd" in token and frame.undecodable is None:
                frame.undecodable = where
            if len(stack) == 1:
                value = _scalar(token)
                if where == ("id",) and isinstance(value, int | str) and not isinstance(value, bool):
                    frame.request_id = value
                elif where == ("method",) and isinstance(value, str):
                    frame.method = value
    frame.balanced = closed_top and text.lstrip().startswith("{")
    return frame


def _scalar(token: str) -> Any:
    try:
        return json.loads(token)
    except ValueError:
        return None


def _tool_path(loc: tuple[Any, ...]) -> str:
    """A location in the message as a tool error's path: inside the arguments relative to them (`query`),
    the tool's name as `name`, anything else from the message's top."""
    if loc[: len(_ARGUMENTS)] == _ARGUMENTS:
        return json_path(("body", *loc[len(_ARGUMENTS) :])) if len(loc) > 2 else "arguments"
    if loc[:1] == ("params",) and len(loc) > 1:
        return json_path(("body", *loc[1:]))
    return json_path(("body", *loc))


def screen(message: bytes, max_bytes: int) -> Screened | None:
    """None when `message` may go on to the SDK; else what to answer instead (see the module)."""
    problem = body_problem(message, max_items=MAX_LIST_ITEMS)
    if problem is None and len(message) <= max_bytes:
        return None
    text = message.decode("utf-8", "replace")
    frame = _scan(text, lossy=problem is not None and "not UTF-8" in problem.message)
    error: AgentDBError
    if problem is None:
        error = PayloadTooLarge(
            f"a message of {len(message)} bytes is over the limit of {max_bytes}",
            path="arguments",
            hint="an operator may raise AGENTDB_MAX_REQUEST_BYTES",
        )
    elif problem.path is not None and problem.path != "body":
        error = InvalidParamValue(problem.message, path=_tool_path(_location(problem.path)))
    elif frame.deep is not None:
        error = InvalidParamValue(problem.message, path=_tool_path(frame.deep))
    elif frame.undecodable is not None:
        error = InvalidParamValue(problem.message, path=_tool_path(frame.undecodable))
    else:
        error = problem  # malformed JSON: nothing in it can be trusted
    framed = frame.balanced and (problem is None or not problem.message.startswith("malformed"))
    envelope = error.to_dict()
    if not framed or frame.request_id is None:
        refusal: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": PARSE_ERROR, "message": error.message, "data": envelope},
        }
        return Screened(refusal, error, answered=False)
    if frame.method == "tools/call":
        from agentdb.mcp.server import tool_error

        result = tool_error(error.to_dict()).model_dump(by_alias=True, exclude_none=True, mode="json")
        return Screened({"jsonrpc": "2.0", "id": frame.request_id, "result": result}, error, answered=True)
    reply: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": frame.request_id,
        "error": {"code": INVALID_PARAMS, "message": error.message, "data": envelope},
    }
    return Screened(reply, error, answered=True)


def _location(path: str) -> tuple[Any, ...]:
    """`params.arguments.filter[0]` back into its parts (keys with dots or brackets are rare enough here: the
    path only decides which prefix to drop)."""
    parts: list[Any] = []
    for piece in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        parts.append(int(piece[1:-1]) if piece.startswith("[") else piece)
    return tuple(parts)


__all__ = ["INVALID_PARAMS", "PARSE_ERROR", "Screened", "screen"]
