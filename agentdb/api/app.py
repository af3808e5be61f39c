"""FastAPI application: lifespan (database, pool, migrations), routes, and the error envelope."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any

import orjson
import psycopg
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from psycopg_pool import ConnectionPool
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from agentdb import __version__
from agentdb.api import agents, docs, documents, indexes, memory, playground, retrieval
from agentdb.api.access import admit_body, guard_open_access, open_access_allowed, principal
from agentdb.api.catalog import SourceOut, source_out, visible_sources
from agentdb.api.guard import RequestGuard, json_path, refuse
from agentdb.api.routing import DatabaseRoute, connection, principal_slots, routing_headers
from agentdb.auth import Principal, any_principals, check_table, read_scope, visible_source
from agentdb.config import Settings
from agentdb.db import resolve_url
from agentdb.db.accel import path_in_use
from agentdb.db.cluster import cluster_nodes
from agentdb.db.migrate import migrate, require_current
from agentdb.db.pool import open_pool
from agentdb.db.primary import PrimaryWatcher
from agentdb.db.replicas import ReadRouter
from agentdb.embed import load_embedder
from agentdb.errors import (
    AgentDBError,
    DatabaseUnavailable,
    Forbidden,
    InternalError,
    InvalidParamValue,
    from_db_error,
    is_outage,
)
from agentdb.ingest.embed_worker import EmbeddingWorker
from agentdb.sources import get_source, pending_embeddings

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    code: int
    name: str
    message: str
    path: str | None = None
    hint: str | None = None


class ErrorEnvelope(BaseModel):
    error: ErrorBody


class ReplicaOut(BaseModel):
    name: str
    url: str
    role: str
    replay_lsn: str | None
    lag_ms: float | None
    in_rotation: bool
    error: str | None = None


class PrimaryOut(BaseModel):
    """Where the primary is, as DATABASE_URL_FILE names it, and a move to another not done yet (and why)."""

    url: str
    file: str | None
    switches: int
    pending: str | None
    error: str | None


class NodeOut(BaseModel):
    id: int
    host: str
    port: int
    role: str  # coordinator or worker
    active: bool
    has_shards: bool
    # Shards of each distributed or reference table this node holds, by table.
    shards: dict[str, int]


class Health(BaseModel):
    # "ok", or "locked": a server on a public address with no principal, which answers no other request
    # and then shows nothing else here (no versions, no replicas).
    status: str
    database: str | None
    version: str | None
    # The read replicas (none configured: empty): role, replay lag and whether reads go to them.
    replicas: list[ReplicaOut] = []
    # With DATABASE_URL_FILE: the primary it names (None without the file).
    primary: PrimaryOut | None = None
    # The path of the lexical leg: "accel" (agentdb's C extension) or "sql" (plain SQL); None when locked.
    lexical_path: str | None = None
    # On a Citus coordinator: the cluster's nodes (empty without Citus).
    nodes: list[NodeOut] = []


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope} for status in (400, 401, 403, 404, 409, 413, 415, 429, 503)
}


# The app's own routes (the others come from the routers of agentdb/api/).
routes = APIRouter(route_class=DatabaseRoute)


@routes.get("/healthz", response_model=Health)
def healthz(request: Request, conn: psycopg.Connection[Any] = Depends(connection)) -> Health:  # noqa: B008
    if locked(request):
        return Health(status="locked", database=None, version=None)
    row = conn.execute("select current_setting('server_version')").fetchone()
    router = request.app.state.router
    watcher = getattr(request.app.state, "watcher", None)
    return Health(
        status="ok",
        database=f"PostgreSQL {row[0] if row else '?'}",
        version=__version__,
        replicas=[ReplicaOut(**vars(s)) for s in router.status()] if router is not None else [],
        primary=None if watcher is None else PrimaryOut(**vars(watcher.status())),
        lexical_path=path_in_use(conn),
        nodes=[NodeOut(**node) for node in cluster_nodes(conn)],
    )


@routes.get("/sources/{name}", response_model=SourceOut)
def source(
    name: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> SourceOut:
    if caller is not None:
        check_table(caller, name, path="name")
    found = get_source(conn, name)
    pending = pending_embeddings(conn, found) if caller is None and found.kind == "table" else None
    with read_scope(conn, caller):  # counts under the caller's row security
        return source_out(conn, visible_source(caller, found), pending)


@routes.get("/sources", response_model=list[SourceOut])
def sources(
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> list[SourceOut]:
    return visible_sources(conn, caller)


# Before /agents/{name}: the retrieval endpoint answers other methods with 405, not "unknown agent".
@routes.api_route("/agents/retrieval", methods=["GET", "PUT", "PATCH", "DELETE"], include_in_schema=False)
def retrieval_other_methods() -> Response:
    raise StarletteHTTPException(405, "use POST /agents/retrieval", headers={"Allow": "POST"})


def _lifespan(
    settings: Settings, pool: ConnectionPool | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the pool (its own on DATABASE_URL or the embedded server unless `pool` is given),
    migrations, the read router, the embedding worker, the primary's watcher and the MCP endpoint's sessions,
    closed in reverse order."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_pool = pool is None
        app.state.settings = settings
        if pool is None:
            url = resolve_url(settings)
            # Migrate before the pool opens: its connections register the vector type, which the first
            # migration creates.
            with psycopg.connect(url) as conn:
                migrate(conn)
            app.state.pool = open_pool(url, min_size=settings.pool_min_size, max_size=settings.pool_max_size)
        else:
            url = str(pool.conninfo)
            app.state.pool = pool
            with pool.connection() as conn:
                migrate(conn)
        app.state.router = open_router(url, replica_urls(settings, embedded=own_pool), settings)
        with app.state.pool.connection() as conn:
            guard_open_access(settings, any_principals(conn))
        worker = None
        if settings.embed_interval_s > 0:
            worker = EmbeddingWorker(app.state.pool, load_embedder, interval=settings.embed_interval_s)
            worker.start()
        app.state.watcher = None
        if own_pool and settings.database_url_file is not None:
            app.state.watcher = PrimaryWatcher(
                settings.database_url_file, url, lambda new: move_primary(app, new, worker)
            )
            app.state.watcher.start()
        try:
            async with app.state.mcp.run():
                yield
        finally:
            if app.state.watcher is not None:
                app.state.watcher.close()
            if worker is not None:
                worker.stop()
            if app.state.router is not None:
                app.state.router.close()
            if own_pool:
                app.state.pool.close()

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as the one envelope: agentdb's own, request validation, HTTP, database, and the unexpected."""

    @app.exception_handler(AgentDBError)
    async def agentdb_error(request: Request, exc: AgentDBError) -> Response:
        headers = {"Retry-After": "1"} if exc.http_status in (429, 503) else {}
        return envelope(exc.to_dict(), exc.http_status, headers | routing_headers(request))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        error = InvalidParamValue(str(first.get("msg")), path=json_path(tuple(first.get("loc", ()))))
        return envelope(error.to_dict(), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        body = {
            "code": 1000 + exc.status_code,
            "name": "HTTPError",
            "message": str(exc.detail),
            "path": request.url.path,
        }
        return envelope(body, exc.status_code, dict(exc.headers or {}))

    @app.exception_handler(psycopg.Error)
    async def database_error(request: Request, exc: psycopg.Error) -> Response:
        mapped = from_db_error(exc)
        if mapped is None and is_outage(exc):
            mapped = DatabaseUnavailable("the database is unavailable; retry shortly")
        if mapped is None:
            log.error("database error on %s %s: %s", request.method, request.url.path, exc)
            mapped = InternalError()
        return await agentdb_error(request, mapped)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return await agentdb_error(request, InternalError())


def create_app(settings: Settings | None = None, *, pool: ConnectionPool | None = None) -> FastAPI:
    """Build the app; with no `pool`, the lifespan opens one on DATABASE_URL or the embedded server."""
    settings = settings or Settings.from_env()
    app = FastAPI(
        title="agentdb",
        version=__version__,
        description="A retrieval agent that lives inside PostgreSQL.",
        lifespan=_lifespan(settings, pool),
        responses=ERROR_RESPONSES,
        docs_url=None,  # agentdb/api/docs.py serves it without a CDN
        redoc_url=None,
    )
    app.router.route_class = DatabaseRoute
    app.state.slots = principal_slots(settings)
    _add_error_handlers(app)
    app.add_middleware(LockedGate, settings=settings)
    from agentdb.mcp.http import MCP_PATH, McpEndpoint  # it imports this package's admission rules
    from agentdb.mcp.screen import screen

    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_body_bytes,
        max_request_bytes=settings.max_request_bytes,
        admit=admit_body,
        screens={MCP_PATH: partial(screen, max_bytes=settings.max_request_bytes)},
    )
    app.include_router(routes)  # its 405 for /agents/retrieval comes before /agents/{name}
    app.include_router(retrieval.router)
    app.include_router(agents.router)
    app.include_router(documents.router)
    app.include_router(indexes.router)
    app.include_router(memory.router)
    app.include_router(playground.router)
    app.mount("/playground/static", playground.assets, name="playground")
    app.include_router(docs.router)
    app.mount("/docs-assets", docs.assets, name="docs-assets")
    app.state.mcp = McpEndpoint(settings)
    app.router.routes.append(Route(MCP_PATH, app.state.mcp, include_in_schema=False))  # every method: the SDK
    return app


def locked(request: Request) -> bool:
    """Whether this is a locked server: on a public address (open access not allowed) with no principal."""
    return not open_access_allowed(request.app.state.settings) and not request.state.any_principals


# The pages and documents no route's principal check covers: the playground, the API docs and schema.
_PAGES = re.compile(r"^/($|playground|docs|openapi\.json)")


class LockedGate:
    """ASGI middleware: a locked server (see `locked`) serves none of _PAGES (403, as every API route then
    answers), so that it shows nothing about itself beyond /healthz's status. Asks the database only on a
    public bind, where the question arises."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.public = not open_access_allowed(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.public and scope["type"] == "http" and _PAGES.match(scope.get("path", "")):
            pool: ConnectionPool = scope["app"].state.pool
            if not await run_in_threadpool(_has_principals, pool):
                await refuse(
                    send,
                    Forbidden(
                        "this server listens on a public address and no principal exists: it answers no request",
                        hint="create one with `agentdb principal create NAME --tables ...`",
                    ),
                )
                return
        await self.app(scope, receive, send)


def _has_principals(pool: ConnectionPool) -> bool:
    with pool.connection() as conn:
        return any_principals(conn)


# A pool left by a failover is closed this long after the move, so that a request that took it just before
# gets its connection (and fails on the dead server, or finishes on a live one) rather than a closed pool.
RETIRE_AFTER_S = 2.0


def move_primary(app: FastAPI, url: str, worker: EmbeddingWorker | None) -> None:
    """Serve from another primary (DATABASE_URL_FILE named it and it accepts writes): check that its schema and
    stored functions are this agentdb's, open a pool on it, hand that to new requests, the read router and the
    background embedder, and close the old primary's pool shortly after.

    The schema is checked, not migrated: the new primary is a promoted copy of the old one, and re-creating
    the stored functions would fail reads running on the replicas at that moment."""
    settings: Settings = app.state.settings
    with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
        require_current(conn)
    pool = open_pool(url, min_size=settings.pool_min_size, max_size=settings.pool_max_size)
    old, app.state.pool = app.state.pool, pool
    if app.state.router is not None:
        app.state.router.repoint(url)
    if worker is not None:
        worker.pool = pool
    retire = threading.Timer(RETIRE_AFTER_S, old.close)
    retire.daemon = True
    retire.start()


def replica_urls(settings: Settings, *, embedded: bool) -> tuple[str, ...]:
    """The replicas to read from: those configured (AGENTDB_REPLICA_URLS, --replica), else, for the embedded
    server this app started itself, its running standbys (`agentdb start --replicas N`)."""
    if settings.replica_urls or not embedded or settings.database_url or settings.database_url_file:
        return settings.replica_urls
    from agentdb.db.standbys import list_standbys

    return tuple(s.url() for s in list_standbys(settings.data_dir))


def open_router(primary_url: str, urls: tuple[str, ...], settings: Settings) -> ReadRouter | None:
    """The read router over `urls` (None without replicas: every request goes to the primary)."""
    if not urls:
        return None
    router = ReadRouter(
        primary_url,
        urls,
        max_lag_ms=settings.max_replica_lag_ms,
        wait_ms=settings.replica_wait_ms,
        check_interval_s=settings.replica_check_interval_ms / 1000,
        pool_min_size=settings.pool_min_size,
        pool_max_size=settings.pool_max_size,
    )
    router.start()
    log.info("reading from %d replicas", len(urls))
    return router


def envelope(body: dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    """The error envelope {"error": {"code", "name", "message", "path"}} as an orjson response."""
    return Response(
        orjson.dumps({"error": body}), status_code=status, headers=headers, media_type="application/json"
    )
