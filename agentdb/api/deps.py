"""Request dependencies: a pooled connection with the statement timeout, and the calling principal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
from fastapi import Depends, Request
from psycopg_pool import PoolTimeout

from agentdb.auth import Principal, any_principals, authenticate
from agentdb.errors import DatabaseUnavailable


def connection(request: Request) -> Iterator[psycopg.Connection[Any]]:
    """A connection from the pool for one request; 503 (with Retry-After) when none is free or the
    database is down."""
    settings = request.app.state.settings
    try:
        with request.app.state.pool.connection() as conn:
            conn.execute(
                "select set_config('statement_timeout', %s, false)", (str(settings.statement_timeout_ms),)
            )
            yield conn
    except PoolTimeout as exc:
        raise DatabaseUnavailable("no database connection is free; retry shortly") from exc
    except psycopg.errors.QueryCanceled:
        raise  # the statement timeout (an OperationalError too) is the caller's 400, not an outage
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"the database is unavailable: {str(exc).strip().splitlines()[0]}") from exc


def principal(
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
) -> Principal | None:
    """The authenticated principal, or None in local development (no principals defined, loopback bind)."""
    if not any_principals(conn):
        return None
    return authenticate(conn, request.headers.get("authorization"))
