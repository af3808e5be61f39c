"""Connections are configured in one place: pgvector types and orjson for json/jsonb."""

from __future__ import annotations

import time
from typing import Any
from weakref import WeakKeyDictionary

import orjson
import psycopg
from pgvector.psycopg import register_vector
from psycopg.pq import TransactionStatus
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg_pool import ConnectionPool

from agentdb.errors import DatabaseSetupError

MIN_PGVECTOR = (0, 7, 0)
MIN_POSTGRES = 150000
# A connection handed out again within this many seconds of its last probe is not probed again: the probe is a
# round trip, which on a busy server costs as much as the rest of a short request. One that broke meanwhile
# (a server restart in that second) fails its first statement instead; the HTTP API retries that request's
# first statement on another connection (agentdb.api.routing), the background embedder on its next round.
RECHECK_AFTER_S = 1.0
_probed: WeakKeyDictionary[psycopg.Connection[Any], float] = WeakKeyDictionary()


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def configure(conn: psycopg.Connection[Any]) -> None:
    """Register pgvector and orjson on a new connection (the pool's `configure` hook)."""
    set_json_dumps(_dumps, conn)
    set_json_loads(orjson.loads, conn)
    try:
        register_vector(conn)
    except psycopg.ProgrammingError:
        # The vector type does not exist yet (before the first migration); the check says what to do.
        conn.rollback()
    conn.commit()


def check_unless_fresh(conn: psycopg.Connection[Any]) -> None:
    """The pool's check: probe the connection (a round trip) unless it was probed less than RECHECK_AFTER_S
    ago and is idle as far as the client knows (a closed or failed one is always probed)."""
    now = time.monotonic()
    last = _probed.get(conn)
    if (
        last is not None
        and now - last < RECHECK_AFTER_S
        and conn.info.transaction_status == TransactionStatus.IDLE
    ):
        return
    ConnectionPool.check_connection(conn)
    _probed[conn] = now


def open_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, timeout: float = 10.0, wait: bool = True
) -> ConnectionPool:
    """Open a pool of autocommit connections on `url` (agentdb's `conn.transaction()` blocks are then real
    transactions); each connection is configured once when it is created. Connections are checked when
    they are handed out (at most once a second each: `check_unless_fresh`), so one left broken by a server
    restart is replaced instead of failing a request, and reconnection attempts give up after 10 s (then
    start afresh, without a long backoff), so the pool refills soon after the server is back. With `wait` False
    the pool opens without waiting for its first connections (a replica that is down must not stop a start)."""
    pool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        configure=configure,
        check=check_unless_fresh,
        reconnect_timeout=10.0,
        open=False,
        kwargs={"autocommit": True},
    )
    pool.open(wait=wait, timeout=timeout)
    return pool


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def check_server(server_version_num: int, vector_available: str | None, vector_installed: str | None) -> None:
    """Fail fast with a clear message when the server or its pgvector is missing or too old."""
    if server_version_num < MIN_POSTGRES:
        raise DatabaseSetupError(
            f"PostgreSQL {server_version_num // 10000} is too old: agentdb needs PostgreSQL 15 or newer",
            hint="upgrade the server, or unset DATABASE_URL to use the embedded PostgreSQL 18",
        )
    version = vector_installed or vector_available
    if version is None:
        raise DatabaseSetupError(
            "the pgvector extension ('vector') is not available on this server",
            hint="install pgvector >= 0.7 on the server (e.g. the pgvector/pgvector image), "
            "or unset DATABASE_URL to use the embedded PostgreSQL",
        )
    if parse_version(version) < MIN_PGVECTOR:
        raise DatabaseSetupError(
            f"pgvector {version} is too old: agentdb needs pgvector >= 0.7 (0.8 for iterative index scans)",
            hint="run ALTER EXTENSION vector UPDATE after upgrading the pgvector package on the server",
        )


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """Read the server version and pgvector availability, then apply `check_server`."""
    row = conn.execute(
        "select current_setting('server_version_num')::int,"
        " (select default_version from pg_available_extensions where name = 'vector'),"
        " (select extversion from pg_extension where extname = 'vector')"
    ).fetchone()
    assert row is not None
    check_server(row[0], row[1], row[2])
