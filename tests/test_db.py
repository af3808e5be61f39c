"""The embedded server, migrations and the pgvector check, against a real PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentdb.db.migrate import discover, functions_digest, migrate
from agentdb.db.pool import check_server
from agentdb.db.server import (
    SERVER_MALLOC_ENV,
    forget_dead_handles,
    server_environment,
    start_embedded,
    tuning,
)
from agentdb.errors import DatabaseSetupError


def test_embedded_server_reuses_its_data_directory(embedded_dir: Path) -> None:
    tmp_path = embedded_dir
    url = start_embedded(tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create table kept (x int)")
        conn.execute("insert into kept values (42)")
        version = conn.execute("select current_setting('server_version_num')::int").fetchone()
    assert version is not None and version[0] >= 180000
    again = start_embedded(tmp_path)
    with psycopg.connect(again) as conn:
        assert conn.execute("select x from kept").fetchall() == [(42,)]
    assert (tmp_path / "pg" / "PG_VERSION").read_text().strip() == "18"


def test_embedded_server_is_tuned_for_the_machine(embedded_dir: Path) -> None:
    """A fresh data directory gets agentdb.conf (memory-sized settings): the reloadable ones apply at once,
    shared_buffers waits for the next start; the include line is written once."""
    tmp_path = embedded_dir
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    wanted = tuning(memory)
    url = start_embedded(tmp_path)
    with psycopg.connect(url) as conn:
        rows = dict(
            conn.execute(
                "select name, pg_size_bytes(current_setting(name)) / 1048576 from pg_settings"
                " where name in ('effective_cache_size', 'maintenance_work_mem')"
            ).fetchall()
        )
        assert len(rows) == 2
        assert rows == {name: int(wanted[name].removesuffix("MB")) for name in rows}
        pending = conn.execute(
            "select pending_restart from pg_settings where name = 'shared_buffers'"
        ).fetchone()
    assert pending == (wanted["shared_buffers"] != "128MB",)
    start_embedded(tmp_path)
    conf = (tmp_path / "pg" / "postgresql.conf").read_text()
    assert conf.count("include_if_exists = 'agentdb.conf'") == 1
    assert tuning(64 * 2**30) == {
        "shared_buffers": "8192MB",
        "effective_cache_size": "32768MB",
        "maintenance_work_mem": "2048MB",
    }


def _minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (the 10th field of /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])


def test_a_warm_backend_reuses_the_memory_its_queries_free(server_url: str) -> None:
    """The embedded server's backends keep the memory a query frees (SERVER_MALLOC_ENV): a 10 MB in-memory
    sort repeated on one connection faults in almost no fresh pages (measured 2 a query; with glibc's defaults,
    3,300: the whole sort again)."""
    with psycopg.connect(server_url) as conn:
        pid = conn.execute("select pg_backend_pid()").fetchone()[0]
        conn.execute("set work_mem = '64MB'")
        statement = (
            "select count(*) from (select md5(g::text) as h from generate_series(1, 100000) g order by h) s"
        )
        for _ in range(3):
            assert conn.execute(statement).fetchone() == (100000,)
        before = _minor_faults(pid)
        for _ in range(10):
            conn.execute(statement)
        per_query = (_minor_faults(pid) - before) / 10
    assert per_query < 300


def test_the_server_environment_leaves_a_callers_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    with server_environment():
        assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "12345"
        assert os.environ["MALLOC_MMAP_THRESHOLD_"] == SERVER_MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "12345"
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ


def test_migrations_are_recorded_and_idempotent(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        recorded = conn.execute(
            "select version, name from agentdb.schema_migrations order by version"
        ).fetchall()
        assert recorded == [(m.version, m.name) for m in discover()]
        tables_before = conn.execute(
            "select count(*) from pg_tables where schemaname like 'agentdb%'"
        ).fetchone()
        conn.commit()
        assert migrate(conn) == []
        assert conn.execute("select count(*) from agentdb.schema_migrations").fetchone() == (len(recorded),)
        assert (
            conn.execute("select count(*) from pg_tables where schemaname like 'agentdb%'").fetchone()
            == tables_before
        )


def test_current_functions_are_not_recreated_under_running_readers(db_url: str) -> None:
    """A migrate with nothing to do leaves the stored functions as they are (re-creating them fails the
    statements other sessions are running with them); stale ones (another digest) are re-created."""
    oid = "select 'agentdb.retrieve'::regproc::oid"
    with psycopg.connect(db_url, autocommit=True) as conn:
        before = conn.execute(oid).fetchone()
        assert migrate(conn) == [] and conn.execute(oid).fetchone() == before
        conn.execute("update agentdb.schema_functions set digest = 'an older agentdb'")
        assert migrate(conn) == [] and conn.execute(oid).fetchone() != before
        assert conn.execute("select digest from agentdb.schema_functions").fetchone() == (functions_digest(),)


def test_a_reinstall_drops_stale_overloads_and_replaces_what_is_held(db_url: str) -> None:
    """Re-installing sql/ drops every other signature of the functions it defines (an overload left from an
    earlier agentdb would make calls ambiguous), while a function that something holds (here a view) is only
    replaced, so what holds it keeps working."""
    signatures = (
        "select array_agg(p.oid::regprocedure::text order by 1) from pg_proc p"
        " where p.pronamespace = 'agentdb'::regnamespace and p.proname = %s"
    )
    with psycopg.connect(db_url, autocommit=True) as conn:
        (current,) = conn.execute(signatures, ("expand",)).fetchone()
        conn.execute("create function agentdb.expand(stale int) returns int language sql as 'select 1'")
        conn.execute("create view public.holds_overlap as select agentdb.chunk_overlap('abc', 'bcd') as n")
        held = conn.execute("select 'agentdb.chunk_overlap'::regproc::oid").fetchone()
        conn.execute("update agentdb.schema_functions set digest = 'an older agentdb'")
        migrate(conn)
        assert conn.execute(signatures, ("expand",)).fetchone() == (current,)
        assert "agentdb.expand(integer)" not in current
        assert conn.execute("select 'agentdb.chunk_overlap'::regproc::oid").fetchone() == held
        assert conn.execute("select n from public.holds_overlap").fetchone() == (2,)
        conn.execute("drop view public.holds_overlap")


def test_concurrent_migrators_wait_for_each_other(server_url: str) -> None:
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = "agentdb_test_concurrent"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    url = make_conninfo(server_url, dbname=name)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(url) as conn:
                results.append(migrate(conn))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    applied = sorted(results, key=len)
    assert applied[:2] == [[], []] and applied[2] == [m.version for m in discover()]
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


@pytest.mark.parametrize(
    ("server", "available", "installed", "message"),
    [
        (140010, "0.8.0", None, "PostgreSQL 14 is too old"),
        (180004, None, None, "pgvector extension \\('vector'\\) is not available"),
        (160002, "0.6.2", None, "pgvector 0.6.2 is too old"),
        (160002, "0.8.0", "0.5.1", "pgvector 0.5.1 is too old"),
    ],
)
def test_missing_or_old_pgvector_is_a_clear_error(
    server: int, available: Any, installed: Any, message: str
) -> None:
    with pytest.raises(DatabaseSetupError, match=message) as caught:
        check_server(server, available, installed)
    assert caught.value.hint


def test_current_pgvector_passes_the_check() -> None:
    check_server(180004, "0.8.5", "0.8.5")
    check_server(150000, "0.7.0", None)


def test_dead_handles_are_forgotten(tmp_path: Path) -> None:
    """A killed agentdb process stays in pgserver's handle list and would keep the server alive forever."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    handles = tmp_path / ".handle_pids.json"
    handles.write_text(json.dumps([dead.pid, os.getpid()]))
    forget_dead_handles(handles)
    assert json.loads(handles.read_text()) == [os.getpid()]


def test_unreaped_handles_are_forgotten_too(tmp_path: Path) -> None:
    """An agentdb process that exited but was not reaped yet (a zombie, as under a container's init that
    does not reap) still has a /proc entry; it is no user of the server either."""
    exited = subprocess.Popen(["true"])
    stat = Path(f"/proc/{exited.pid}/stat")
    deadline = time.monotonic() + 10
    while stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    handles = tmp_path / ".handle_pids.json"
    handles.write_text(json.dumps([exited.pid, os.getpid()]))
    forget_dead_handles(handles)
    assert json.loads(handles.read_text()) == [os.getpid()]
    exited.wait()
