"""Failover for real: an embedded primary of this test's own with two streaming standbys; the primary dies, one
standby is promoted, the other made to follow it, and the file DATABASE_URL_FILE names the new primary. The
same running app then writes and reads there without a restart, its old pool closed, while readers that never
stopped saw no failed request. Repointing before the promotion is safe: the app moves once the server named
accepts writes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentdb.api import create_app
from agentdb.config import Settings
from agentdb.db.replicas import redact
from agentdb.db.server import run_binary
from agentdb.db.standbys import Standby
from tests.standby_cluster import Cluster, standby_cluster, until


@pytest.fixture
def trio() -> Iterator[Cluster]:
    """A primary with source `ops` (40 rows) and two standbys; everything stopped afterwards."""
    with standby_cluster("agentdb-failover-", docs=40, seed=7, standbys=2) as cluster:
        yield cluster


def search() -> dict[str, Any]:
    return {
        "query": "backup wal",
        "queries": [{"table": "ops", "full_text_search": "backup wal", "limit": 10}],
    }


def _lsn(url: str, function: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"select {function}() - '0/0'::pg_lsn").fetchone()  # noqa: S608 - a constant name
    assert row is not None and row[0] is not None
    return int(row[0])


def _until(what: str, test: Any, timeout: float = 60.0) -> Any:
    """Poll `test` until it returns something true, at most `timeout` seconds."""
    return until(what, test, timeout=timeout, interval=0.05)


def _write_url(path: Path, url: str) -> None:
    """Replace the file at once (as an orchestrator does): a reader never sees it half written."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(url + "\n")
    os.replace(tmp, path)


def _follow(follower: Standby, leader: Standby) -> None:
    """Make `follower` stream from `leader` (promoted) through its own slot there, without a restart."""
    socket = conninfo_to_dict(leader.url())
    with psycopg.connect(leader.url(), autocommit=True) as conn:
        conn.execute("select pg_create_physical_replication_slot(%s)", (follower.slot,))
    conninfo = f"host={socket['host']} port={socket['port']} user=postgres application_name={follower.name}"
    with psycopg.connect(follower.url(), autocommit=True) as conn:
        conn.execute(sql.SQL("alter system set primary_conninfo = {}").format(sql.Literal(conninfo)))
        conn.execute("select pg_reload_conf()")


def _crash_primary(trio: Cluster) -> tuple[Standby, Standby]:
    """Once both standbys have replayed everything, the primary dies (no shutdown checkpoint). Returns the
    standby to promote (the one that received the most; they received the same here) and the other."""
    end = _lsn(trio.primary, "pg_current_wal_lsn")
    for standby in trio.standbys:
        _until(f"{standby.name} replays", lambda s=standby: _lsn(s.url(), "pg_last_wal_replay_lsn") >= end)
    run_binary("pg_ctl", ("-w", "-D", str(trio.data_dir / "pg"), "stop", "-m", "immediate"))
    leader, follower = sorted(trio.standbys, key=lambda s: -_lsn(s.url(), "pg_last_wal_receive_lsn"))
    return leader, follower


def test_failover_by_repointing_the_url_file(trio: Cluster) -> None:
    url_file = trio.data_dir / "primary-url"
    _write_url(url_file, trio.primary)
    replica_urls = tuple(s.url() for s in trio.standbys)
    settings = Settings(database_url_file=url_file, replica_urls=replica_urls, embed_interval_s=0)
    app = create_app(settings)
    failures: list[str] = []
    served: list[str] = []
    stop = threading.Event()
    with TestClient(app, base_url="http://127.0.0.1") as client:

        def reader() -> None:
            while not stop.is_set():
                response = client.post("/agents/retrieval", json=search())
                if response.status_code != 200 or not response.json()["hits"]:
                    failures.append(f"{response.status_code} {response.text[:300]}")
                served.append(response.headers.get("X-Agentdb-Served-By", "?"))

        _until(
            "both replicas in rotation", lambda: sum(r.in_rotation for r in app.state.router.replicas) == 2
        )
        health = client.get("/healthz").json()
        assert health["primary"] == {
            "url": redact(trio.primary),
            "file": str(url_file),
            "switches": 0,
            "pending": None,
            "error": None,
        }
        before = client.post("/agents", json={"name": "before", "source": "ops", "retrieval_mode": "lexical"})
        assert before.status_code == 201, before.text
        old_pool = app.state.pool
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for thread in readers:
            thread.start()
        try:
            leader, follower = _crash_primary(trio)
            # Writes fail while no primary is named; reads go on (replicas).
            down = client.post("/agents", json={"name": "lost", "source": "ops", "retrieval_mode": "lexical"})
            assert down.status_code == 503 and down.json()["error"]["code"] == 9001, down.text
            assert down.headers["Retry-After"] == "1"
            # Repointed before the promotion: the app waits (and says why) until the server accepts writes.
            _write_url(url_file, leader.url())
            waiting = _until("the wait", lambda: app.state.watcher.status().error)
            assert "standby" in waiting and app.state.watcher.status().pending == redact(leader.url())
            assert app.state.watcher.switches == 0 and app.state.pool is old_pool
            with psycopg.connect(leader.url(), autocommit=True) as conn:
                assert conn.execute("select pg_promote()").fetchone() == (True,)
            _until("the move", lambda: app.state.watcher.switches == 1)
            _follow(follower, leader)
            replicas = {r.name: r for r in app.state.router.replicas}
            _until("the promoted one out", lambda: replicas[leader.name].role == "primary")
            mark = len(served)
            _until("reads after the promotion", lambda: len(served) >= mark + 10)
            # Not a replica any more: only reads already under way (one per reader) may have been on it.
            assert leader.name not in served[mark + len(readers) :]
            # The same app now writes and reads on the new primary.
            assert app.state.pool is not old_pool
            after = client.post(
                "/agents", json={"name": "after", "source": "ops", "retrieval_mode": "lexical"}
            )
            assert after.status_code == 201, after.text
            assert after.headers["X-Agentdb-Served-By"] == "primary"
            assert client.get("/agents/before").status_code == 200
            for name in ("before", "after"):
                run = client.post(
                    f"/agents/{name}/run",
                    json={"input": "backup"},
                    headers={"X-Agentdb-Min-LSN": after.headers["X-Agentdb-LSN"]},
                )
                assert run.status_code == 200 and run.json()["hits"], run.text
                assert run.headers["X-Agentdb-Served-By"] in ("primary", follower.name)
            # The old primary's pool is closed; the promoted standby is no replica; the follower, replaying the
            # new primary's WAL, serves reads again.
            _until("the old pool closed", lambda: old_pool.closed)
            health = client.get("/healthz").json()
            assert health["primary"] | {"error": None} == {
                "url": redact(leader.url()),
                "file": str(url_file),
                "switches": 1,
                "pending": None,
                "error": None,
            }
            promoted = next(r for r in health["replicas"] if r["name"] == leader.name)
            assert (promoted["role"], promoted["in_rotation"]) == ("primary", False)
            assert "it is the primary now" in promoted["error"]

            def follower_serves() -> bool:
                fresh = client.post("/agents", json={"name": f"w{time.monotonic_ns()}", "source": "ops"})
                assert fresh.status_code == 201, fresh.text
                read = client.post(
                    "/agents/retrieval",
                    json=search() | {"min_lsn": fresh.headers["X-Agentdb-LSN"]},
                )
                assert read.status_code == 200, read.text
                return bool(read.headers["X-Agentdb-Served-By"] == follower.name)

            _until(f"{follower.name} serves reads of the new primary's writes", follower_serves)
        finally:
            stop.set()
            for thread in readers:
                thread.join()
    assert failures == []
    assert leader.name in served and follower.name in served


def test_failover_with_a_multi_host_url(trio: Cluster) -> None:
    """DATABASE_URL naming every candidate with `target_session_attrs=read-write`: no file to rewrite; once the
    old primary's connections break, the pool's new ones find the promoted standby by themselves."""
    hosts = [conninfo_to_dict(url) for url in (trio.primary, *(s.url() for s in trio.standbys))]
    multi = make_conninfo(
        "",
        host=",".join(str(h["host"]) for h in hosts),
        port=",".join(str(h.get("port") or 5432) for h in hosts),
        dbname="agentdb",
        user="postgres",
        target_session_attrs="read-write",
    )
    settings = Settings(
        database_url=multi, replica_urls=tuple(s.url() for s in trio.standbys), embed_interval_s=0
    )
    app = create_app(settings)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        _until(
            "both replicas in rotation", lambda: sum(r.in_rotation for r in app.state.router.replicas) == 2
        )
        assert client.post("/agents", json={"name": "before", "source": "ops"}).status_code == 201
        leader, follower = _crash_primary(trio)
        reads = [client.post("/agents/retrieval", json=search()) for _ in range(4)]
        assert [r.status_code for r in reads] == [200] * 4
        with psycopg.connect(leader.url(), autocommit=True) as conn:
            assert conn.execute("select pg_promote()").fetchone() == (True,)

        def written() -> Any:
            response = client.post(
                "/agents", json={"name": "after", "source": "ops", "retrieval_mode": "lexical"}
            )
            assert response.status_code in (201, 503), response.text
            return response if response.status_code == 201 else None

        after = _until("a write on the promoted standby", written)
        assert after.headers["X-Agentdb-Served-By"] == "primary"
        with psycopg.connect(leader.url(), autocommit=True) as conn:
            names = conn.execute("select name from agentdb.saved_agents order by name").fetchall()
        assert names == [("after",), ("before",)]
        run = client.post(
            "/agents/after/run", json={"input": "backup", "min_lsn": after.headers["X-Agentdb-LSN"]}
        )
        assert run.status_code == 200 and run.json()["hits"], run.text
        assert run.headers["X-Agentdb-Served-By"] != leader.name
