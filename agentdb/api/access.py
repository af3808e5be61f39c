"""Who is calling and whether it may ask: the bearer key's principal (asked of the primary even for a read a
replica serves), and for a server without principals the loopback, Host and Origin rules that keep other
machines and other sites' pages out. Also the admission of a large body before it is read."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import AsyncIterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

import psycopg
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from agentdb.api.routing import (
    ReadWish,
    checkout,
    connection,
    hold_slot,
    read_connection,
    read_wish,
    request_connection,
)
from agentdb.auth import Principal, any_principals, authenticate
from agentdb.config import Settings
from agentdb.db.replicas import ReadRouter
from agentdb.errors import (
    DatabaseSetupError,
    DatabaseUnavailable,
    Forbidden,
    Unauthorized,
)

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Whether `host` (a Host or Origin name, or a bind address) is this machine's loopback: an IP literal in
    127.0.0.0/8 or ::1 (with or without brackets), or exactly `localhost`. A name that only looks like one
    (`127.attacker.example`) is not: DNS may point it anywhere."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


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


def read_principal(
    request: Request,
    conn: psycopg.Connection[Any] = Depends(read_connection),  # noqa: B008
    _declared: HTTPAuthorizationCredentials | None = Security(BEARER),  # noqa: B008
) -> Principal | None:
    """`request_principal` on the read's connection, as a dependency."""
    return request_principal(request, conn)


async def request_scope(
    request: Request,
    wish: ReadWish = Depends(read_wish),  # noqa: B008
    _declared: HTTPAuthorizationCredentials | None = Security(BEARER),  # noqa: B008
) -> AsyncIterator[tuple[psycopg.Connection[Any], Principal | None]]:
    """`read_connection` and `read_principal` in one: a connection for a read and the authenticated caller, for
    a route that does its blocking work in one call to the thread pool. Checkout and authentication take one hop
    to the pool's threads (as two sync dependencies they take three), and run before the body is validated, as
    with those dependencies; the connection goes back on the event loop (a put needs no I/O). Declare it with
    `scope="function"` so that it is back before a streamed response starts."""
    stack = ExitStack()

    def enter() -> tuple[psycopg.Connection[Any], Principal | None]:
        with ExitStack() as attempt:
            conn = attempt.enter_context(request_connection(request, wish))
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
    authorization = request.headers.get("authorization")
    if getattr(request.state, "replica", None) is not None:
        decided = _primary_principal(request, authorization)
        if decided is not None:
            if decided[0]:
                assert decided[1] is not None
                return hold_slot(request, decided[1])
            _open_access(request)
            return None
    has_principals = getattr(request.state, "any_principals", None)
    if has_principals is None:
        has_principals = any_principals(conn)
    if has_principals or authorization:
        return hold_slot(request, authenticate(conn, authorization))  # no principal: any key is wrong
    _open_access(request)
    return None


def admit_body(scope: Scope) -> None:
    """Before a large body is read (RequestGuard): the error its sender gets anyway, so that no keyless or
    wrongly keyed client makes the server read and parse megabytes. Asked of the primary, as every key is."""
    request = Request(scope)
    settings: Settings = request.app.state.settings
    authorization = request.headers.get("authorization")
    with checkout(request.app.state.pool, settings.statement_timeout_ms) as (conn, has_principals):
        if has_principals or authorization:
            authenticate(conn, authorization)
        else:
            _open_access(request)


def _primary_principal(request: Request, authorization: str | None) -> tuple[bool, Principal | None] | None:
    """For a read a replica serves: whether principals exist and who the caller is, asked of the primary, so
    that a key deleted (or a principal created: the server no longer answers keyless requests) a moment ago
    counts at once and not once the replica has replayed it. None when the primary cannot be reached (its
    monitor saw it down, or this checkout failed): the replica decides, as it is the best copy left."""
    router: ReadRouter | None = request.app.state.router
    if router is not None and not router.primary_reachable:
        return None
    settings: Settings = request.app.state.settings
    try:
        with checkout(request.app.state.pool, settings.statement_timeout_ms) as (conn, has_principals):
            if not (has_principals or authorization):
                return False, None
            try:
                return True, authenticate(conn, authorization)
            except Unauthorized:
                request.state.key_refused = True  # by the primary: no point in retrying there
                raise
    except (psycopg.OperationalError, PoolTimeout, DatabaseUnavailable) as exc:
        reason = (
            exc.message if isinstance(exc, DatabaseUnavailable) else str(exc).strip() or type(exc).__name__
        )
        log.warning(
            "the primary cannot authenticate a read (%s); the replica serving it does", reason.splitlines()[0]
        )
        return None


def _open_access(request: Request) -> None:
    """A request to a server without principals: Forbidden unless `open_access_allowed` and
    `check_local_request` allow it."""
    settings: Settings = request.app.state.settings
    if not open_access_allowed(settings):
        raise Forbidden(
            f"this server listens on {settings.host} and no principal exists: it answers no request",
            hint="create one with `agentdb principal create NAME --tables ...`, or serve on 127.0.0.1",
        )
    check_local_request(request, settings)


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
