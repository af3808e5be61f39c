"""`agentdb mcp`: the MCP server over stdio, the way MCP clients start local servers.

It runs as the principal whose key is in AGENTDB_API_KEY, or keyless on a database that has no principals,
and refuses to start otherwise. As over HTTP, the key is checked again on every call (a deleted key stops
working at once, and a principal created meanwhile ends keyless access). The process is the session: one
budget for its whole life."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
        from mcp.server.stdio import stdio_server

        from agentdb.embed import load_embedder
        from agentdb.mcp.server import build_server

        load_embedder()
        server = build_server(door)

        async def run() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(run)
    finally:
        pool.close()


__all__ = ["StdioDoor", "serve_stdio"]
