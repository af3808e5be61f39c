"""Database access: the embedded server, the connection pool and the migration runner."""

from __future__ import annotations

from typing import Any

import psycopg

from agentdb.config import Settings, read_url_file
from agentdb.db.server import start_embedded
from agentdb.errors import from_db_error


def resolve_url(settings: Settings, *, keep_running: bool = False) -> str:
    """The URL to use: the one in DATABASE_URL_FILE (read now: it may have changed), else DATABASE_URL, else the
    embedded server (started if needed)."""
    if settings.database_url_file is not None:
        return read_url_file(settings.database_url_file)
    if settings.database_url:
        return settings.database_url
    return start_embedded(settings.data_dir, keep_running=keep_running)


def run_sql(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Execute a statement, translating agentdb's database errors into AgentDBError."""
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.Error as exc:
        mapped = from_db_error(exc)
        if mapped is None:
            raise
        raise mapped from None


def can_vacuum(conn: psycopg.Connection[Any]) -> bool:
    """Whether VACUUM may run on `conn` now: it cannot run inside a transaction block."""
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
