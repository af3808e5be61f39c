"""`agentdb mcp`: the MCP server over stdio, the way MCP clients start local servers.

It runs as the principal whose key is in AGENTDB_API_KEY, or keyless on a database that has no principals,
and refuses to start otherwise. As over HTTP, the key is checked again on every call (a deleted key stops
working at once, and a principal created meanwhile ends keyless access). The process is the session: one
budget for its whole life. Each line from the client is screened first (agentdb.mcp.screen): one agentdb
refuses, or one the SDK could not parse, is answered (a tool error, or a JSON-RPC error) and never dropped.
While it serves, fd 0 reads the null device and fd 1 writes to stderr, so that nothing a call prints reaches
the wire; the wire is served from private duplicates, restored on exit."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import ConnectionPool

from agentdb.auth import Principal, any_principals, authenticate
from agentdb.config import Settings
from agentdb.db import resolve_url
from agentdb.db.migrate import require_current
from agentdb.db.pool import open_pool
from agentdb.errors import Unauthorized
from agentdb.mcp.budget import Budget

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext


class StdioDoor:
    """Calls on a small pool, as the key's principal (or keyless where no principal exists)."""

    def __init__(self, pool: ConnectionPool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self._budget = Budget.of(settings)

    def budget(self, ctx: ServerRequestContext[Any, Any]) -> Budget:
        return self._budget

    def caller(self, conn: psycopg.Connection[Any]) -> Principal | None:
        """The principal of AGENTDB_API_KEY; None on a database without principals; else Unauthorized."""
        if self.settings.api_key:
            return authenticate(conn, f"Bearer {self.settings.api_key}")
        if any_principals(conn):
            raise Unauthorized(
                "this database has principals: `agentdb mcp` needs one's key in AGENTDB_API_KEY",
                path="AGENTDB_API_KEY",
                hint="create one with `agentdb principal create NAME --tables ...` and set its key",
            )
        return None

    @contextmanager
    def connect(
        self, ctx: ServerRequestContext[Any, Any]
    ) -> Iterator[tuple[psycopg.Connection[Any], Principal | None]]:
        with self.pool.connection() as conn:
            conn.execute(
                "select set_config('statement_timeout', %s, false)",
                (str(self.settings.statement_timeout_ms),),
            )
            yield conn, self.caller(conn)


@contextmanager
def _claimed_wire() -> Iterator[tuple[int, int]]:
    """Private duplicates of fds 0 and 1 (the wire), with fd 0 on the null device and fd 1 on stderr meanwhile."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield wire_in, wire_out
    finally:
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        os.close(wire_in)
        os.close(wire_out)


@asynccontextmanager
async def screened_stdio(max_bytes: int) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's stdio transport, with every line screened before it is parsed: the server's read and write
    streams. A line the screen answers gets its reply; one that is JSON but not a JSON-RPC message gets -32600
    (with its id, when it has one)."""
    import anyio
    import orjson
    from mcp import types
    from mcp.shared.message import SessionMessage

    from agentdb.mcp.screen import screen

    with _claimed_wire() as (wire_in, wire_out):
        stdin = anyio.wrap_file(os.fdopen(wire_in, "rb", closefd=False))
        stdout = anyio.wrap_file(os.fdopen(wire_out, "wb", closefd=False))
        lock = anyio.Lock()
        to_server, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write, from_server = anyio.create_memory_object_stream[SessionMessage](0)

        async def emit(data: bytes) -> None:
            async with lock:  # one frame at a time: replies of the screen and of the server share the wire
                await stdout.write(data + b"\n")
                await stdout.flush()

        async def reader() -> None:
            async with to_server:
                async for line in stdin:
                    if not line.strip():
                        continue
                    screened = await anyio.to_thread.run_sync(screen, line.rstrip(b"\r\n"), max_bytes)
                    if screened is not None:
                        await emit(orjson.dumps(screened.reply))
                        continue
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError as exc:
                        parsed = orjson.loads(line)
                        rid = parsed.get("id") if isinstance(parsed, dict) else None
                        error = {
                            "code": types.INVALID_REQUEST,
                            "message": f"not a JSON-RPC message: {exc}"[:500],
                        }
                        await emit(orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": error}))
                        continue
                    await to_server.send(SessionMessage(message))

        drained = anyio.Event()

        async def writer() -> None:
            try:
                async with from_server:
                    async for session_message in from_server:
                        data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                        await emit(data.encode())
            finally:
                drained.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            try:
                yield read, write
            finally:
                write.close()  # the server is done: what it sent goes out, then the reader stops
                await drained.wait()
                tg.cancel_scope.cancel()


def serve_stdio(settings: Settings) -> None:
    """Check the schema and the caller, load the embedder, then serve MCP on stdin/stdout until the client
    closes them."""
    url = resolve_url(settings)
    with psycopg.connect(url, autocommit=True) as conn:
        require_current(conn)
    pool = open_pool(url, min_size=1, max_size=4)
    try:
        door = StdioDoor(pool, settings)
        with pool.connection() as conn:
            door.caller(conn)  # refuse at once, before the client is told of any tool
        # Only now the heavy imports (the tools import the whole read path): a refused start says so at once.
        import anyio

        from agentdb.embed import load_embedder
        from agentdb.mcp.server import build_server

        load_embedder()
        server = build_server(door)

        async def run() -> None:
            async with screened_stdio(settings.max_request_bytes) as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(run)
    finally:
        pool.close()


__all__ = ["StdioDoor", "screened_stdio", "serve_stdio"]
