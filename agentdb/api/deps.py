"""Request dependencies: a pooled connection with the statement timeout, and the calling principal."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from urllib.parse import urlsplit
from weakref import WeakKeyDictionary

import psycopg
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.concurrency import run_in_threadpool

from agentdb.auth import Principal, any_principals, authenticate
from agentdb.config import Settings
from agentdb.errors import DatabaseSetupError, DatabaseUnavailable, Forbidden, is_outage

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


# How long a request waits for a pooled connection before asking whether the database is up at all.
FIRST_WAIT_S = 0.5


# A request's first statement may find its pooled connection broken (the pool probes a connection at most once a
# second, agentdb.db.pool): it is then retried on another connection, this many times in all.
FIRST_STATEMENT_ATTEMPTS = 3
# The statement timeout each pooled connection has been given (a session setting: set on a connection's first
# request, not on every one).
_timeouts: WeakKeyDictionary[psycopg.Connection[Any], int] = WeakKeyDictionary()


def _getconn(pool: ConnectionPool) -> psycopg.Connection[Any]:
    """A pooled connection. When none comes within FIRST_WAIT_S, a direct connection attempt tells an outage
    (503 at once, instead of after the pool's whole timeout) from a busy pool (wait the rest)."""
    try:
        return pool.getconn(timeout=FIRST_WAIT_S)
    except PoolTimeout:
        try:
            psycopg.connect(str(pool.conninfo), connect_timeout=2).close()
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(
                f"the database is unavailable: {str(exc).strip().splitlines()[0]}"
            ) from exc
        return pool.getconn(timeout=max(pool.timeout - FIRST_WAIT_S, 0.1))


@contextmanager
def _checkout(pool: ConnectionPool, timeout_ms: int) -> Iterator[tuple[psycopg.Connection[Any], bool]]:
    """A pooled connection with the statement timeout, and whether any principal exists. That question is the
    request's first statement, so it also finds a connection broken since the pool last probed it (a server
    restart): such a one is discarded and the question asked on another."""
    for attempt in range(FIRST_STATEMENT_ATTEMPTS):
        conn = _getconn(pool)
        try:
            if _timeouts.get(conn) != timeout_ms:
                conn.execute("select set_config('statement_timeout', %s, false)", (str(timeout_ms),))
                _timeouts[conn] = timeout_ms
            has_principals = any_principals(conn)
        except psycopg.OperationalError:
            pool.putconn(conn)  # a broken connection is discarded by the pool
            if not conn.broken or attempt == FIRST_STATEMENT_ATTEMPTS - 1:
                raise
            continue
        except BaseException:
            pool.putconn(conn)
            raise
        try:
            yield conn, has_principals
        finally:
            pool.putconn(conn)
        return


@contextmanager
def request_connection(request: Request) -> Iterator[psycopg.Connection[Any]]:
    """A connection from the pool for one request, with the statement timeout; 503 (with Retry-After) when none
    is free or the database is down. Errors of the request itself (bad input, a statement timeout) pass
    through. Whether principals exist is read on it and kept for `request_principal`."""
    settings = request.app.state.settings
    try:
        with _checkout(request.app.state.pool, settings.statement_timeout_ms) as (conn, has_principals):
            request.state.any_principals = has_principals
            yield conn
    except PoolTimeout as exc:
        raise DatabaseUnavailable("no database connection is free; retry shortly") from exc
    except psycopg.Error as exc:
        if not is_outage(exc):
            raise
        raise DatabaseUnavailable(f"the database is unavailable: {str(exc).strip().splitlines()[0]}") from exc


def connection(request: Request) -> Iterator[psycopg.Connection[Any]]:
    """`request_connection` as a dependency."""
    with request_connection(request) as conn:
        yield conn


# Declares the bearer scheme in the OpenAPI document; the header itself is read by `authenticate`, which
# tells a missing, malformed and wrong key apart.
BEARER = HTTPBearer(auto_error=False, description="an API key from `agentdb principal create`")


def principal(
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    _declared: HTTPAuthorizationCredentials | None = Security(BEARER),  # noqa: B008
) -> Principal | None:
    """`request_principal` as a dependency."""
    return request_principal(request, conn)


async def request_scope(
    request: Request,
    _declared: HTTPAuthorizationCredentials | None = Security(BEARER),  # noqa: B008
) -> AsyncIterator[tuple[psycopg.Connection[Any], Principal | None]]:
    """`connection` and `principal` in one: a pooled connection and the authenticated caller, for a route that
    does its blocking work in one call to the thread pool. Checkout and authentication take one hop to the
    pool's threads (as two sync dependencies they take three), and run before the body is validated, as
    with those dependencies; the connection goes back on the event loop (a put needs no I/O). Declare it with
    `scope="function"` so that it is back before a streamed response starts."""
    stack = ExitStack()

    def enter() -> tuple[psycopg.Connection[Any], Principal | None]:
        with ExitStack() as attempt:
            conn = attempt.enter_context(request_connection(request))
            caller = request_principal(request, conn)
            stack.push(attempt.pop_all())
            return conn, caller

    scoped = await run_in_threadpool(enter)
    with stack:  # errors of the route pass through request_connection, as with `connection`
        yield scoped


def request_principal(request: Request, conn: psycopg.Connection[Any]) -> Principal | None:
    """The authenticated principal, or None in local development (no principals defined, loopback bind).

    Whether principals exist is decided on every request, so a server that loses its last principal does
    not open up: bound to a non-loopback address it then refuses every request. A keyless server also
    answers only requests addressed to it by a loopback name (or a configured one: DNS rebinding) and not
    sent by another site's page (a browser's Origin header; cross-site request forgery)."""
    has_principals = getattr(request.state, "any_principals", None)
    if has_principals is None:
        has_principals = any_principals(conn)
    if has_principals or request.headers.get("authorization"):
        return authenticate(conn, request.headers.get("authorization"))  # no principal: any key is wrong
    settings: Settings = request.app.state.settings
    if not open_access_allowed(settings):
        raise Forbidden(
            f"this server listens on {settings.host} and no principal exists: it answers no request",
            hint="create one with `agentdb principal create NAME --tables ...`, or serve on 127.0.0.1",
        )
    check_local_request(request, settings)
    return None


def open_access_allowed(settings: Settings) -> bool:
    """Whether a server without principals may answer: on a loopback bind, or when AGENTDB_ALLOW_OPEN says
    its port is reachable only from the host's loopback (a container)."""
    return is_loopback(settings.host) or settings.allow_open


def guard_open_access(settings: Settings, has_principals: bool) -> None:
    """At startup: without principals every request is allowed, which is only acceptable on a loopback bind
    (or when explicitly allowed); say which case this is in the log."""
    if has_principals:
        log.info("API keys required: principals are defined")
    elif is_loopback(settings.host):
        log.warning(
            "no principals defined: every request is allowed (local development on %s)", settings.host
        )
    elif settings.allow_open:
        log.warning(
            "no principals defined and AGENTDB_ALLOW_OPEN=1: every request to %s is allowed; publish the port "
            "on the host's loopback only",
            settings.host,
        )
    else:
        raise DatabaseSetupError(
            f"refusing to serve on {settings.host} without principals: anyone could read every source",
            hint="create one with `agentdb principal create NAME --tables ...`, bind 127.0.0.1, or set "
            "AGENTDB_ALLOW_OPEN=1 when the port is published only on the host's loopback",
        )


def check_local_request(request: Request, settings: Settings) -> None:
    """Forbidden unless the Host header names this machine (or a configured name) and the Origin, when a
    browser sends one, is this server's own (or a configured one)."""
    host = urlsplit(f"//{request.headers.get('host', '')}").hostname or ""
    if not (is_loopback(host) or host in settings.allowed_hosts):
        raise Forbidden(
            f"a server without principals answers only requests to a loopback address, not to {host!r}",
            path="host",
            hint="add the name to AGENTDB_ALLOWED_HOSTS, or create a principal and send its key",
        )
    origin = request.headers.get("origin")
    if origin is None:
        return
    parts = urlsplit(origin)
    own = (
        parts.scheme in ("http", "https")
        and is_loopback(parts.hostname or "")
        and ((parts.port or (443 if parts.scheme == "https" else 80)) == settings.port)
    )
    if not (own or origin in settings.allowed_origins):
        raise Forbidden(
            f"a server without principals does not answer requests from another site's page ({origin})",
            path="origin",
            hint="add the origin to AGENTDB_ALLOWED_ORIGINS, or create a principal and send its key",
        )
