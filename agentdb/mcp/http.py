"""MCP over streamable HTTP at /mcp of the `agentdb serve` app, under the rules of every other route.

Each HTTP request to /mcp is admitted as an API request is (agentdb.api.access: the bearer key, or a keyless
server's loopback Host and own Origin; the principal's share of the server), after the request guard checked
its body; each tool call is then authenticated again on its own connection, so a key deleted mid-session
stops at once. A session belongs to the principal that opened it (the SDK answers another's requests for it
as for an unknown session), and its budget lives as long as it does. Only the session protocol (the
initialize handshake) is served: the sessionless 2026 era would have no session to hold a budget."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.types import INVALID_REQUEST, ErrorData, JSONRPCError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agentdb.api.access import request_principal
from agentdb.api.guard import refuse
from agentdb.api.routing import request_connection
from agentdb.auth import Principal
from agentdb.config import Settings
from agentdb.errors import AgentDBError, DatabaseUnavailable, InvalidParamValue
from agentdb.mcp.budget import Budget
from agentdb.mcp.server import build_server

MCP_PATH = "/mcp"
# Budgets of this many sessions are kept (the SDK's own bound on open sessions); the oldest go first.
MAX_SESSIONS = 10_000


class HttpDoor:
    """Calls on the API's pool as the bearer of the HTTP request that carries them; a budget per session."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._budgets: OrderedDict[str, Budget] = OrderedDict()

    def budget(self, ctx: ServerRequestContext[Any, Any]) -> Budget:
        request: Request | None = ctx.request
        session = None if request is None else request.headers.get(MCP_SESSION_ID_HEADER)
        if session is None:
            raise InvalidParamValue("a tool call needs an MCP session", path=MCP_SESSION_ID_HEADER.lower())
        budget = self._budgets.get(session)
        if budget is None:
            budget = self._budgets[session] = Budget.of(self.settings)
            while len(self._budgets) > MAX_SESSIONS:
                self._budgets.popitem(last=False)
        return budget

    @contextmanager
    def connect(
        self, ctx: ServerRequestContext[Any, Any]
    ) -> Iterator[tuple[psycopg.Connection[Any], Principal | None]]:
        request = ctx.request
        assert isinstance(request, Request)  # streamable HTTP hands every message its HTTP request
        with request_connection(request) as conn:
            yield conn, request_principal(request, conn)


def _admit(request: Request) -> Principal | None:
    """The caller of an HTTP request to /mcp, as any API route decides it (raises its 401 / 403 / 429)."""
    with request_connection(request) as conn:
        return request_principal(request, conn)


class McpEndpoint:
    """The ASGI app at /mcp: admission, then the SDK's stateful streamable HTTP session manager (JSON
    responses), a new one for each run of the app's lifespan (`run()`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.door = HttpDoor(settings)
        self.server = build_server(self.door)
        self.manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        manager = StreamableHTTPSessionManager(
            app=self.server, json_response=True, max_request_body_size=self.settings.max_request_bytes
        )
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            body = JSONRPCError(
                jsonrpc="2.0",
                id=None,
                error=ErrorData(
                    code=INVALID_REQUEST,
                    message=f"protocol {version[:40]!r} is not served here: agentdb keeps a budget per session, "
                    "so it speaks the session protocol (initialize)",
                ),
            )
            response = Response(
                body.model_dump_json(by_alias=True, exclude_unset=True), 400, media_type="application/json"
            )
            await response(scope, receive, send)
            return
        try:
            caller = await run_in_threadpool(_admit, request)
        except AgentDBError as error:
            await refuse(send, error)
            return
        owner = "keyless" if caller is None else f"principal:{caller.id}"
        scope["user"] = AuthenticatedUser(AccessToken(token="-", client_id=owner, scopes=[]))
        if self.manager is None:
            await refuse(send, DatabaseUnavailable("the MCP endpoint is not running; retry shortly"))
            return
        await self.manager.handle_request(scope, receive, send)


__all__ = ["MCP_PATH", "HttpDoor", "McpEndpoint"]
