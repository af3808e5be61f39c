"""Where a request is served: a pooled connection with the statement timeout (the primary's for a request that
may write, a replica's when one may serve a read, after it has replayed the caller's `min_lsn`), the retry on
the primary when a replica cannot serve, the headers that say which server answered, and each principal's
share of the pool. Who the caller is and whether it may ask is agentdb.api.access."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from weakref import WeakKeyDictionary

import orjson
import psycopg
from fastapi import Depends, Header, Query, Request, Response
from fastapi.routing import APIRoute
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.concurrency import run_in_threadpool

from agentdb.auth import Principal, any_principals
from agentdb.config import Settings
from agentdb.db.replicas import ReadRouter, Replica, parse_lsn
from agentdb.errors import (
    DatabaseUnavailable,
    InvalidParamValue,
    TooManyRequests,
    Unauthorized,
    is_outage,
)

log = logging.getLogger(__name__)


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
def checkout(
    pool: ConnectionPool, timeout_ms: int, attempts: int = FIRST_STATEMENT_ATTEMPTS
) -> Iterator[tuple[psycopg.Connection[Any], bool]]:
    """A pooled connection with the statement timeout, and whether any principal exists. That question is the
    request's first statement, so it also finds a connection broken since the pool last probed it (a server
    restart): such a one is discarded and the question asked on another, up to `attempts` connections."""
    for attempt in range(attempts):
        conn = _getconn(pool)
        try:
            if _timeouts.get(conn) != timeout_ms:
                conn.execute("select set_config('statement_timeout', %s, false)", (str(timeout_ms),))
                _timeouts[conn] = timeout_ms
            has_principals = any_principals(conn)
        except psycopg.OperationalError:
            pool.putconn(conn)  # a broken connection is discarded by the pool
            if not conn.broken or attempt == attempts - 1:
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


# Read-your-writes and routing, as request headers of the read endpoints and response headers of all.
MIN_LSN_HEADER = "X-Agentdb-Min-LSN"
CONSISTENCY_HEADER = "X-Agentdb-Consistency"
LSN_HEADER = "X-Agentdb-LSN"
SERVED_BY_HEADER = "X-Agentdb-Served-By"
# Requests that change nothing a client would read back (a GET may touch last-access times): no LSN for them.
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
MinLsn = Annotated[
    str | None,
    Header(
        alias=MIN_LSN_HEADER,
        description="the X-Agentdb-LSN of an earlier write: a replica serves this read only once it has "
        "replayed that far (it is waited for a bounded time), else the primary does",
    ),
]
Consistency = Annotated[
    Literal["any", "primary"] | None,
    Header(
        alias=CONSISTENCY_HEADER,
        description='"primary" reads from the primary; "any" (default) from a replica',
    ),
]


MinLsnParam = Annotated[
    str | None,
    Query(
        alias="min_lsn",
        max_length=40,
        description=f"as the {MIN_LSN_HEADER} header (also a field of a JSON body); the stricter wins",
    ),
]
ConsistencyParam = Annotated[
    Literal["any", "primary"] | None,
    Query(
        alias="consistency",
        description=f"as the {CONSISTENCY_HEADER} header (also a field of a JSON body); the stricter wins",
    ),
]
CONSISTENCIES = ("any", "primary")


@dataclass(frozen=True)
class ReadWish:
    """What a read asks of the server that serves it."""

    min_lsn: int | None = None
    primary: bool = False

    @classmethod
    def from_headers(cls, min_lsn: str | None, consistency: str | None) -> ReadWish:
        return cls(
            min_lsn=None if min_lsn is None else parse_lsn(min_lsn, MIN_LSN_HEADER.lower()),
            primary=consistency == "primary",
        )

    @classmethod
    def from_fields(cls, min_lsn: object, consistency: object) -> ReadWish:
        """From a query string's or a JSON body's `min_lsn` and `consistency` (3007 at that name when bad)."""
        if min_lsn is not None and not isinstance(min_lsn, str):
            raise InvalidParamValue(
                f"min_lsn must be a WAL position as a string such as 0/3018DC8, not {type(min_lsn).__name__}",
                path="min_lsn",
            )
        if consistency is not None and consistency not in CONSISTENCIES:
            raise InvalidParamValue(
                f"consistency must be 'any' or 'primary', not {str(consistency)[:40]!r}", path="consistency"
            )
        return cls(
            min_lsn=None if min_lsn is None else parse_lsn(min_lsn, "min_lsn"),
            primary=consistency == "primary",
        )

    def stricter(self, other: ReadWish) -> ReadWish:
        """Both wishes at once: the later WAL position, and the primary if either asks for it."""
        positions = [p for p in (self.min_lsn, other.min_lsn) if p is not None]
        return ReadWish(min_lsn=max(positions) if positions else None, primary=self.primary or other.primary)


async def read_wish(
    request: Request,
    min_lsn: MinLsn = None,
    consistency: Consistency = None,
    query_min_lsn: MinLsnParam = None,
    query_consistency: ConsistencyParam = None,
) -> ReadWish:
    """What a read asks for, from its headers, its query string and the `min_lsn` and `consistency` fields of
    its JSON body: when several say something, the stricter wins (the later position; the primary when any
    asks for it). The body is read as FastAPI read it (cached), before the body model is validated."""
    wish = ReadWish.from_headers(min_lsn, consistency).stricter(
        ReadWish.from_fields(query_min_lsn, query_consistency)
    )
    body = await _json_object(request)
    if body:
        wish = wish.stricter(ReadWish.from_fields(body.get("min_lsn"), body.get("consistency")))
    return wish


async def _json_object(request: Request) -> dict[str, Any] | None:
    """The request's body when it is a JSON object (what else it is, the body model reports)."""
    if request.method in SAFE_METHODS:
        return None
    raw = await request.body()
    if not raw.lstrip().startswith(b"{"):
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _replica_checkout(
    request: Request, router: ReadRouter, wish: ReadWish, timeout_ms: int
) -> tuple[ExitStack, psycopg.Connection[Any], bool] | None:
    """A connection to a replica that may serve this read (held by the returned stack), or None: the primary
    serves it. A replica that fails here leaves the rotation and the next is tried; a replica that has not
    replayed `min_lsn` is waited for, up to the router's bound, once."""
    excluded: frozenset[str] = getattr(request.state, "failed_replicas", frozenset())
    for replica in router.candidates(wish.min_lsn, excluded):
        assert replica.pool is not None
        stack = ExitStack()
        try:
            conn, has_principals = stack.enter_context(checkout(replica.pool, timeout_ms, attempts=1))
            if wish.min_lsn is not None and (replica.replay_lsn or 0) < wish.min_lsn:
                started = time.monotonic()
                reached = router.wait_for(replica, conn, wish.min_lsn, started + router.wait_ms / 1000)
                request.state.lsn_wait_ms = (time.monotonic() - started) * 1000
                if not reached:
                    stack.close()
                    return None
        except (psycopg.OperationalError, PoolTimeout, DatabaseUnavailable) as exc:
            stack.close()
            router.leave_rotation(replica, exc)
            continue
        except BaseException:
            stack.close()
            raise
        request.state.replica = replica
        return stack, conn, has_principals
    return None


@contextmanager
def request_connection(request: Request, wish: ReadWish | None = None) -> Iterator[psycopg.Connection[Any]]:
    """A connection for one request, with the statement timeout; 503 (with Retry-After) when none is free or
    the database is down. Errors of the request itself (bad input, a statement timeout) pass through. Whether
    principals exist is read on it and kept for `request_principal`.

    With a `wish` the request only reads: a replica serves it when one is in rotation (and has replayed
    `wish.min_lsn`), else the primary. Without one it may write: the primary serves it, and the response to
    a POST, PUT, PATCH or DELETE carries the primary's WAL position afterwards (`X-Agentdb-LSN`)."""
    settings = request.app.state.settings
    router: ReadRouter | None = request.app.state.router
    request.state.replica = None
    try:
        with ExitStack() as stack:
            found = None
            if wish is not None and router is not None and not wish.primary and not _primary_only(request):
                found = _replica_checkout(request, router, wish, settings.statement_timeout_ms)
            if found is not None:
                inner, conn, has_principals = found
                stack.enter_context(inner)
            else:
                conn, has_principals = stack.enter_context(
                    checkout(request.app.state.pool, settings.statement_timeout_ms)
                )
                if wish is None:
                    request.state.write_connection = conn
            request.state.any_principals = has_principals
            yield conn
    except PoolTimeout as exc:
        raise DatabaseUnavailable("no database connection is free; retry shortly") from exc
    except psycopg.Error as exc:
        if not is_outage(exc):
            raise
        raise DatabaseUnavailable(f"the database is unavailable: {str(exc).strip().splitlines()[0]}") from exc
    finally:
        _give_back_slot(request)


def _primary_only(request: Request) -> bool:
    return bool(getattr(request.state, "primary_only", False))


def read_pool(request: Request) -> ConnectionPool:
    """The pool of the server that serves this read (a stream takes its own connection from it)."""
    replica: Replica | None = getattr(request.state, "replica", None)
    return replica.pool if replica is not None and replica.pool is not None else request.app.state.pool


def connection(request: Request) -> Iterator[psycopg.Connection[Any]]:
    """`request_connection` as a dependency: a connection to the primary, for a request that may write."""
    with request_connection(request) as conn:
        yield conn


def read_connection(
    request: Request,
    wish: ReadWish = Depends(read_wish),  # noqa: B008
) -> Iterator[psycopg.Connection[Any]]:
    """`request_connection` as a dependency for a request that only reads: a replica's when one may serve it."""
    with request_connection(request, wish) as conn:
        yield conn


class DatabaseRoute(APIRoute):
    """A route whose response says which server served it and, after a write, the primary's WAL position; a
    read that lost its replica (stopped, or a connection broken) is run again once on another server, and a
    read a replica cannot serve (it turned out to write, or the key is newer than the replica) on the
    primary."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                response = await handler(request)
            except Exception as exc:
                if not _retry_elsewhere(request, exc):
                    raise
                response = await handler(request)
            await _label(request, response)
            return response

        return handle


class NeedsPrimary(Exception):  # noqa: N818 - a signal to DatabaseRoute, never an error response
    """Raised by a read that learns, once it has its request, that it will write: run it on the primary."""


def require_primary(request: Request) -> None:
    """Hand this read to the primary if a replica was chosen for it (DatabaseRoute runs it again there)."""
    if getattr(request.state, "replica", None) is not None:
        raise NeedsPrimary


def _retry_elsewhere(request: Request, exc: Exception) -> bool:
    """Whether the read failed because of the replica that served it, and may run again elsewhere (once)."""
    replica: Replica | None = getattr(request.state, "replica", None)
    if replica is None or getattr(request.state, "retried", False):
        return False
    if isinstance(exc, psycopg.Error) and is_outage(exc):
        request.app.state.router.leave_rotation(replica, exc)
        request.state.failed_replicas = frozenset({replica.name})
    elif isinstance(exc, NeedsPrimary | psycopg.errors.ReadOnlySqlTransaction) or (
        isinstance(exc, Unauthorized)
        and request.headers.get("authorization")  # a key newer than the replica (its role not replayed yet)?
        and not getattr(request.state, "key_refused", False)
    ):
        request.state.primary_only = True
    else:
        return False
    log.info("retrying %s %s after %s failed it: %s", request.method, request.url.path, replica.name, exc)
    request.state.retried = True
    return True


async def _label(request: Request, response: Response) -> None:
    response.headers.update(routing_headers(request))
    writer: psycopg.Connection[Any] | None = getattr(request.state, "write_connection", None)
    if writer is not None and response.status_code < 400 and request.method not in SAFE_METHODS:
        response.headers[LSN_HEADER] = await run_in_threadpool(_position, writer)


def routing_headers(request: Request) -> dict[str, str]:
    """Which server served the request (when it reached one), and how long it waited for a replica to replay
    the read's `min_lsn` (also when the wait ran out and the primary served it); for error responses too."""
    replica: Replica | None = getattr(request.state, "replica", None)
    if replica is None and not hasattr(request.state, "any_principals"):
        return {}
    waited = getattr(request.state, "lsn_wait_ms", None)
    timing = {} if waited is None else {"Server-Timing": f"lsn-wait;dur={waited:.1f}"}
    return {SERVED_BY_HEADER: "primary" if replica is None else replica.name, **timing}


def _position(conn: psycopg.Connection[Any]) -> str:
    """The primary's WAL position after the request's writes committed: a replica that has replayed it sees
    them."""
    row = conn.execute("select pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


class PrincipalSlots:
    """How many requests each principal has in flight, against its share of the server (`limit`): one
    principal's flood is refused (429) instead of holding every pooled connection while others wait."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[int, int] = {}
        self._lock = threading.Lock()

    def take(self, principal: Principal) -> None:
        with self._lock:
            held = self._held.get(principal.id, 0)
            if held >= self.limit:
                raise TooManyRequests(
                    f"principal {principal.name!r} already has {held} requests in flight, its share of this server",
                    hint="retry after the ones in flight end; an operator may raise AGENTDB_PRINCIPAL_CONCURRENCY",
                )
            self._held[principal.id] = held + 1

    def give_back(self, principal: Principal) -> None:
        with self._lock:
            left = self._held.get(principal.id, 1) - 1
            if left:
                self._held[principal.id] = left
            else:
                self._held.pop(principal.id, None)


def principal_slots(settings: Settings) -> PrincipalSlots:
    """The share of one principal: AGENTDB_PRINCIPAL_CONCURRENCY, else half the pool (at least 1)."""
    return PrincipalSlots(settings.principal_concurrency or max(1, settings.pool_max_size // 2))


def hold_slot(request: Request, caller: Principal) -> Principal:
    """`caller`, holding one of its slots until the request's connection goes back (request_connection)."""
    if getattr(request.state, "slot", None) is None:
        request.app.state.slots.take(caller)
        request.state.slot = caller
    return caller


def _give_back_slot(request: Request) -> None:
    caller: Principal | None = getattr(request.state, "slot", None)
    if caller is not None:
        request.state.slot = None
        request.app.state.slots.give_back(caller)
