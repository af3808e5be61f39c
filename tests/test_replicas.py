"""Read replicas for real: an embedded primary of this module's own with two streaming standbys made by the same
helper as `agentdb start --replicas N`, the API over real HTTP routing reads to them, read-your-writes by WAL
position, a lagging replica leaving the rotation, a replica stopped under load, and principals' reads on a
replica equal to those on the primary."""

from __future__ import annotations

import logging
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentdb.api import create_app
from agentdb.auth import create_principal, delete_principal
from agentdb.config import Settings
from agentdb.db import accel
from agentdb.db.pool import configure
from agentdb.db.replicas import redact
from agentdb.db.server import stop_embedded
from agentdb.db.standbys import (
    Standby,
    list_standbys,
    start_standby,
    start_standbys,
    stop_standby,
    stop_standbys,
)
from agentdb.memory import StoreSpec, write_records
from agentdb.sources import FieldSpec
from tests.standby_cluster import WORDS, Cluster, standby_cluster, until

TEAMS = ["red", "blue", "green"]
FIELDS = [FieldSpec(name="team", type="string"), FieldSpec(name="level", type="int")]
DOCS = 80


def _team_and_level(rng: random.Random) -> dict[str, Any]:
    return {"team": rng.choice(TEAMS), "level": rng.randint(1, 5)}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A primary with source `ops` (80 rows of random words, metadata and unit vectors) and two standbys."""
    with standby_cluster(
        "agentdb-replicas-",
        docs=DOCS,
        seed=5,
        standbys=2,
        fields=FIELDS,
        metadata=_team_and_level,
        unit_vectors=True,
    ) as built:
        yield built


def _settings(cluster: Cluster, **extra: Any) -> Settings:
    return Settings(
        database_url=cluster.primary, replica_urls=tuple(cluster.replicas), embed_interval_s=0, **extra
    )


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(cluster)), base_url="http://127.0.0.1") as test_client:
        _wait_rotation(test_client, 2)
        yield test_client


@pytest.fixture(scope="module")
def crash_client(cluster: Cluster) -> Iterator[TestClient]:
    """A client for the tests that crash replicas under a held read. While a read is held the primary keeps a
    transaction open and a loaded machine can hold replay back past the default 1 s limit (CI saw both replicas
    leave the rotation at 1,006 ms, so the read never reached one); these tests are about crashes, not lag, so
    only a replica that is down leaves their rotation."""
    app = create_app(_settings(cluster, max_replica_lag_ms=600_000))
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        _wait_rotation(test_client, 2)
        yield test_client


def _wait_rotation(
    client: TestClient | httpx.Client, count: int, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The /healthz replicas once `count` of them are in rotation."""
    deadline = time.monotonic() + timeout
    while True:
        replicas = client.get("/healthz").json()["replicas"]
        if sum(r["in_rotation"] for r in replicas) == count:
            return list(replicas)
        assert time.monotonic() < deadline, f"not {count} replicas in rotation: {replicas}"
        time.sleep(0.1)


def search(text: str = "backup wal") -> dict[str, Any]:
    return {"query": text, "queries": [{"table": "ops", "full_text_search": text, "limit": 20}]}


def _hits(response: Any) -> list[tuple[str, float]]:
    assert response.status_code == 200, response.text
    return [(h["_id"], round(h["_score"], 9)) for h in response.json()["hits"]]


def test_reads_spread_over_replicas_and_writes_go_to_the_primary(client: TestClient) -> None:
    health = client.get("/healthz").json()
    assert [(r["name"], r["role"], r["in_rotation"]) for r in health["replicas"]] == [
        ("replica1", "standby", True),
        ("replica2", "standby", True),
    ]
    assert all(r["lag_ms"] is not None and r["replay_lsn"] for r in health["replicas"])
    served = [client.post("/agents/retrieval", json=search()) for _ in range(6)]
    assert {r.headers["X-Agentdb-Served-By"] for r in served} == {"replica1", "replica2"}
    on_primary = client.post("/agents/retrieval", json=search(), headers={"X-Agentdb-Consistency": "primary"})
    assert on_primary.headers["X-Agentdb-Served-By"] == "primary"
    assert {tuple(_hits(r)) for r in [*served, on_primary]} == {tuple(_hits(on_primary))}
    doc = client.get("/sources/ops/documents/d1")
    assert doc.status_code == 200 and doc.headers["X-Agentdb-Served-By"].startswith("replica")
    assert "X-Agentdb-LSN" not in doc.headers
    # A write: the primary, and its WAL position afterwards.
    created = client.post(
        "/agents", json={"name": "a1", "source": "ops", "top_k": 3, "retrieval_mode": "lexical"}
    )
    assert created.status_code == 201, created.text
    assert created.headers["X-Agentdb-Served-By"] == "primary"
    assert created.headers["X-Agentdb-LSN"].count("/") == 1
    run = client.post(
        "/agents/a1/run",
        json={"input": "backup"},
        headers={"X-Agentdb-Min-LSN": created.headers["X-Agentdb-LSN"]},
    )
    assert run.status_code == 200, run.text
    assert run.headers["X-Agentdb-Served-By"].startswith("replica")


def test_the_sql_door_answers_the_same_on_every_replica(cluster: Cluster) -> None:
    """An analyst's `agentdb.search` in psql runs read-only on a standby and returns the primary's rows."""
    statement = "select * from agentdb.search('ops', %s, mode => 'lexical', top_k => 20)"
    answers = []
    for url in [cluster.primary, *cluster.replicas]:
        with psycopg.connect(url, autocommit=True) as conn:
            answers.append([conn.execute(statement, (text,)).fetchall() for text in WORDS])
    assert all(answers[0]) and answers[1] == answers[0] and answers[2] == answers[0]


def test_each_standby_loads_the_accelerator_from_its_own_build(cluster: Cluster) -> None:
    """The base backup copies the primary's agentdb-accel.conf; each standby rewrites it to its own build."""
    primary_build = str(cluster.data_dir / "pg" / accel.BUILD_DIR)
    standbys = list_standbys(cluster.data_dir)
    assert len(standbys) == len(cluster.replicas)
    for standby, url in zip(standbys, cluster.replicas, strict=True):
        own = str(standby.pgdata / accel.BUILD_DIR)
        conf = (standby.pgdata / accel.CONF_FILE).read_text()
        assert own in conf and primary_build not in conf
        with psycopg.connect(url) as conn:
            (path,) = conn.execute("show dynamic_library_path").fetchone() or ("",)
            assert path.startswith(f"$libdir:{own}/")
            assert conn.execute("select agentdb_internal.lexical_path()").fetchone() == ("accel",)
            # The call loads the library from that path.
            call = "select count(*) from agentdb_accel.bm25_topk(1, '{}', '{}', '{}', '{}', '{}', '{}', 10, 1, 1.2, 0.75)"
            assert conn.execute(call).fetchone() == (0,)


def test_a_bad_lsn_or_consistency_is_a_clear_error(client: TestClient) -> None:
    bad = client.get("/sources/ops/documents/d1", headers={"X-Agentdb-Min-LSN": "yesterday"})
    assert bad.status_code == 400
    assert bad.json()["error"] | {"message": ""} == {
        "code": 3007,
        "name": "InvalidParamValue",
        "message": "",
        "path": "x-agentdb-min-lsn",
    }
    assert "yesterday" in bad.json()["error"]["message"]
    wrong = client.get("/sources/ops/documents/d1", headers={"X-Agentdb-Consistency": "eventual"})
    assert wrong.status_code == 400
    assert wrong.json()["error"]["code"] == 3007 and wrong.json()["error"]["path"] == "X-Agentdb-Consistency"


def test_read_your_writes_waits_for_the_replica_or_uses_the_primary(
    cluster: Cluster, client: TestClient
) -> None:
    # A document written a moment ago is seen by the read that names the write's position.
    for i in range(5):
        with psycopg.connect(cluster.primary, autocommit=True) as conn:
            conn.execute(
                "insert into agentdb_docs.ops (doc_id, chunk, title, text, metadata) values (%s, 0, 'new', 'fresh', '{}')",
                (f"new{i}",),
            )
            lsn = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
        read = client.get(f"/sources/ops/documents/new{i}", headers={"X-Agentdb-Min-LSN": lsn})
        assert read.status_code == 200, read.text
        assert read.headers["X-Agentdb-Served-By"].startswith("replica")
    # A delete over HTTP, then the read naming its position: gone on whichever replica serves it.
    deleted = client.delete("/sources/ops/documents/new0")
    assert deleted.status_code == 204
    after = client.get(
        "/sources/ops/documents/new0", headers={"X-Agentdb-Min-LSN": deleted.headers["X-Agentdb-LSN"]}
    )
    assert after.status_code == 404 and after.headers["X-Agentdb-Served-By"].startswith("replica")
    # Both replicas paused: the read waits its bound, then the primary serves it.
    paused = [psycopg.connect(url, autocommit=True) for url in cluster.replicas]
    try:
        for conn in paused:
            conn.execute("select pg_wal_replay_pause()")
        deleted = client.delete("/sources/ops/documents/new1")
        after = client.get(
            "/sources/ops/documents/new1", headers={"X-Agentdb-Min-LSN": deleted.headers["X-Agentdb-LSN"]}
        )
        assert after.status_code == 404 and after.headers["X-Agentdb-Served-By"] == "primary"
        assert after.headers["Server-Timing"].startswith("lsn-wait;dur=")  # the wait that ran out
    finally:
        for conn in paused:
            conn.execute("select pg_wal_replay_resume()")
            conn.close()


def test_a_lagging_replica_leaves_the_rotation_until_it_catches_up(cluster: Cluster) -> None:
    app = create_app(_settings(cluster, max_replica_lag_ms=300))
    with (
        TestClient(app, base_url="http://127.0.0.1") as client,
        psycopg.connect(cluster.replicas[0], autocommit=True) as replica,
        psycopg.connect(cluster.primary, autocommit=True) as primary,
    ):
        _wait_rotation(client, 2)
        replica.execute("select pg_wal_replay_pause()")
        try:
            primary.execute("update agentdb_docs.ops set title = title where doc_id = 'd2'")
            health = _wait_rotation(client, 1)
            assert [r["name"] for r in health if not r["in_rotation"]] == ["replica1"]
            assert next(r for r in health if r["name"] == "replica1")["lag_ms"] > 300
            served = {
                client.get("/sources/ops/documents/d2").headers["X-Agentdb-Served-By"] for _ in range(4)
            }
            assert served == {"replica2"}
        finally:
            replica.execute("select pg_wal_replay_resume()")
        _wait_rotation(client, 2)


def test_a_replica_stopped_under_load_fails_no_request(cluster: Cluster, client: TestClient) -> None:
    """Readers keep reading while replica 1 stops, comes back, and while both are down; every read answers
    200 with the primary's hits."""
    expected = _hits(
        client.post("/agents/retrieval", json=search(), headers={"X-Agentdb-Consistency": "primary"})
    )
    failures: list[str] = []
    served: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            response = client.post("/agents/retrieval", json=search())
            if response.status_code != 200 or _hits(response) != expected:
                failures.append(response.text)
            served.append(response.headers.get("X-Agentdb-Served-By", "?"))

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        standbys = {s.name: s for s in list_standbys(cluster.data_dir)}
        _until("reads under way", lambda: len(served) >= 10)
        stop_standby(standbys["replica1"])
        assert _wait_rotation(client, 1)[0]["in_rotation"] is False
        # Reads under way when the rotation changed (one per reader) may still name the old server.
        mark = len(served) + len(threads)
        _until("reads after the stop", lambda: len(served) >= mark + 10)
        assert set(served[mark:]) == {"replica2"}
        start_standby(cluster.data_dir, 1)
        _wait_rotation(client, 2)
        stop_standbys(cluster.data_dir)
        _wait_rotation(client, 0)
        mark = len(served) + len(threads)
        _until("reads with both down", lambda: len(served) >= mark + 10)
        assert set(served[mark:]) == {"primary"}
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        start_standbys(cluster.data_dir, 2)
    _wait_rotation(client, 2)
    assert failures == []
    assert {"replica1", "replica2", "primary"} <= set(served)


@contextmanager
def _new_principal(cluster: Cluster, **grant: Any) -> Iterator[tuple[str, str]]:
    """A principal on source `ops` created now: its key and the creation's WAL position. Deleted afterwards, so
    that the module's server stays keyless for the other tests."""
    name = f"p{uuid.uuid4().hex[:12]}"
    with psycopg.connect(cluster.primary, autocommit=True) as conn:
        configure(conn)
        _, key = create_principal(conn, name, tables=["ops"], **grant)
        lsn = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
    try:
        yield key, lsn
    finally:
        with psycopg.connect(cluster.primary, autocommit=True) as conn:
            delete_principal(conn, name)


FILTERS = st.one_of(
    st.none(),
    st.builds(
        lambda team: {"op": "eq", "lhs": {"knowledge": "team"}, "rhs": {"value": team}},
        st.sampled_from(TEAMS),
    ),
    st.builds(
        lambda level: {"op": "le", "lhs": {"knowledge": "level"}, "rhs": {"value": level}}, st.integers(1, 5)
    ),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    row_filter=FILTERS,
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
    doc=st.integers(0, DOCS - 1),
)
def test_a_principal_reads_the_same_on_a_replica_as_on_the_primary(
    cluster: Cluster, client: TestClient, row_filter: dict[str, Any] | None, query: list[str], doc: int
) -> None:
    """A principal created a moment before (its role and row-security policies replicate physically): with the
    creation's WAL position its first read is served by a replica and sees exactly what the primary shows it."""
    with _new_principal(cluster, row_filter=row_filter, fields=["title", "text", "team"]) as (key, lsn):
        key_header = {"Authorization": f"Bearer {key}"}
        text = " ".join(query)
        on_replica = client.post(
            "/agents/retrieval", json=search(text), headers=key_header | {"X-Agentdb-Min-LSN": lsn}
        )
        on_primary = client.post(
            "/agents/retrieval", json=search(text), headers=key_header | {"X-Agentdb-Consistency": "primary"}
        )
        fetched = [
            client.get(f"/sources/ops/documents/d{doc}", headers=key_header | extra)
            for extra in ({"X-Agentdb-Min-LSN": lsn}, {"X-Agentdb-Consistency": "primary"})
        ]
    assert on_replica.headers["X-Agentdb-Served-By"].startswith("replica")
    assert on_replica.json()["hits"] == on_primary.json()["hits"]
    assert fetched[0].headers["X-Agentdb-Served-By"].startswith("replica")
    assert (fetched[0].status_code, fetched[0].json()) == (fetched[1].status_code, fetched[1].json())


def test_start_replicas_status_and_stop_from_the_command_line() -> None:
    """`agentdb start --replicas 1` prints the server's URL and the standby's; `agentdb status` lists the standby
    with its role, replay lag and rotation; `agentdb stop` stops both."""
    from test_cli import _free_port, _serve_embedded, _wait_healthy, run

    data_dir = Path(tempfile.mkdtemp(prefix="agentdb-start-replicas-"))
    try:
        urls = run(["start", "--replicas", "1", "--data-dir", str(data_dir)], None).stdout.split()
        assert len(urls) == 2
        with psycopg.connect(urls[1], autocommit=True) as standby:
            assert standby.execute("select pg_is_in_recovery()").fetchone() == (True,)
        report = orjson.loads(run(["status", "--json", "--data-dir", str(data_dir)], None).stdout)
        (replica,) = report["replicas"]
        assert replica["name"] == "replica1" and replica["state"] == "running"
        assert replica["role"] == "standby" and replica["in_rotation"] is True
        assert replica["url"] == urls[1] and replica["data_dir"] == str(
            data_dir.resolve() / "replicas" / "1" / "pg"
        )
        text = run(["status", "--data-dir", str(data_dir)], None).stdout
        assert re.search(r"^replica1: +standby, replay lag \d+ ms, in rotation \(", text, re.MULTILINE), text
        # `agentdb serve` on the embedded database reads from its standbys without being told.
        port = _free_port()
        server = _serve_embedded(data_dir, port)
        try:
            assert _wait_healthy(server, port).status_code == 200
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
                replicas = _wait_rotation(http, 1)
            assert [(r["name"], r["url"]) for r in replicas] == [
                (
                    "replica1",
                    f"user=postgres dbname=agentdb host={data_dir.resolve()}/replicas/1/pg port=5433",
                )
            ]
        finally:
            server.terminate()
            server.wait(timeout=60)
        stopped = run(["stop", "--data-dir", str(data_dir)], None).stdout
        assert "stopped standby replica1" in stopped and "stopped the embedded server" in stopped
        assert [s.running for s in list_standbys(data_dir)] == [False]
        report = orjson.loads(run(["status", "--json", "--data-dir", str(data_dir)], None).stdout)
        assert report["state"] == "stopped" and report["replicas"][0]["state"] == "stopped"
    finally:
        stop_standbys(data_dir)
        stop_embedded(data_dir, force=True)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_key_newer_than_the_replicas_is_served_by_the_primary(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Both replicas paused (and kept in rotation by a generous lag limit): a principal created now is unknown
    to them, so its read, sent without the creation's position, fails authentication on a replica and is run
    again on the primary. Its hits are the row-filtered ones."""
    app = create_app(_settings(cluster, max_replica_lag_ms=600_000))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        _wait_rotation(client, 2)
        paused = [psycopg.connect(url, autocommit=True) for url in cluster.replicas]
        try:
            for conn in paused:
                conn.execute("select pg_wal_replay_pause()")
            row_filter = {"op": "eq", "lhs": {"knowledge": "team"}, "rhs": {"value": "red"}}
            with (
                _new_principal(cluster, row_filter=row_filter) as (key, _),
                caplog.at_level(logging.INFO, logger="agentdb.api.routing"),
            ):
                response = client.post(
                    "/agents/retrieval", json=search(), headers={"Authorization": f"Bearer {key}"}
                )
        finally:
            for conn in paused:
                conn.execute("select pg_wal_replay_resume()")
                conn.close()
    assert response.status_code == 200, response.text
    assert response.headers["X-Agentdb-Served-By"] == "primary"
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retrying")]
    assert len(retries) == 1, retries
    assert re.match(
        r"retrying POST /agents/retrieval after replica[12] failed it: .*invalid API key", retries[0]
    )
    hits = response.json()["hits"]
    assert hits and {h["_source"]["team"] for h in hits} == {"red"}


def test_a_promoted_replica_leaves_the_rotation(cluster: Cluster) -> None:
    """A third standby, promoted (a failover elsewhere): it no longer follows the primary, so /healthz calls it
    a primary out of rotation and reads go to the standby left."""
    third = start_standby(cluster.data_dir, 3)
    try:
        app = create_app(replace(_settings(cluster), replica_urls=(cluster.replicas[0], third.url())))
        with TestClient(app, base_url="http://127.0.0.1") as client:
            _wait_rotation(client, 2)
            with psycopg.connect(third.url(), autocommit=True) as conn:
                conn.execute("select pg_promote()")
            health = _wait_rotation(client, 1)
            assert [(r["name"], r["role"], r["in_rotation"]) for r in health] == [
                ("replica1", "standby", True),
                ("replica2", "primary", False),
            ]
            served = {
                client.get("/sources/ops/documents/d3").headers["X-Agentdb-Served-By"] for _ in range(4)
            }
            assert served == {"replica1"}
    finally:
        stop_standby(next(s for s in list_standbys(cluster.data_dir) if s.number == 3))
        shutil.rmtree(third.pgdata.parent)
        with psycopg.connect(cluster.primary, autocommit=True) as conn:
            conn.execute("select pg_drop_replication_slot(%s)", (third.slot,))


def test_memory_recall_reads_on_a_replica_only_when_it_touches_nothing(
    cluster: Cluster, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Recall updates the recalled memories' last-access times unless `touch=false`: the primary serves it,
    a replica only the touch-free one. A retrieval that recalls hands itself to the primary before any work."""
    with psycopg.connect(cluster.primary, autocommit=True) as conn:
        configure(conn)
        written = write_records(
            conn,
            "notes",
            [{"text": "the nightly backup runs at two", "importance": 7, "embedding": [0.1] * 384}],
            spec=StoreSpec(schema="notes"),
        )
        lsn = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
    fresh = {"X-Agentdb-Min-LSN": lsn}
    look = client.get("/memory/notes", params={"touch": "false", "top_k": 3}, headers=fresh)
    touch = client.get("/memory/notes", params={"top_k": 3})
    assert look.status_code == touch.status_code == 200, (look.text, touch.text)
    assert look.headers["X-Agentdb-Served-By"].startswith("replica")
    assert touch.headers["X-Agentdb-Served-By"] == "primary"
    ids = [c["id"] for c in look.json()["candidates"]]
    assert ids == written.ids == [c["id"] for c in touch.json()["candidates"]]
    # A saved agent over the store searches it like a source (no recall, no touch): a replica runs it.
    agent = {"name": "notes-agent", "source_kind": "name", "storage": "notes", "schema": "notes"}
    agent |= {"retrieval_mode": "lexical"}
    created = client.post("/agents", json=agent)
    assert created.status_code == 201, created.text
    run = client.post(
        "/agents/notes-agent/run",
        json={"input": "backup"},
        headers={"X-Agentdb-Min-LSN": created.headers["X-Agentdb-LSN"]},
    )
    assert run.status_code == 200 and run.json()["hits"][0]["_id"] == written.ids[0], run.text
    assert run.headers["X-Agentdb-Served-By"].startswith("replica")
    with caplog.at_level(logging.INFO, logger="agentdb.api.routing"):
        recalled = client.post(
            "/agents/retrieval", json=search() | {"memory": {"stores": ["notes"]}}, headers=fresh
        )
    assert recalled.status_code == 200, recalled.text
    assert recalled.headers["X-Agentdb-Served-By"] == "primary"
    retries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retrying")]
    assert len(retries) == 1 and re.match(
        r"retrying POST /agents/retrieval after replica[12] failed it", retries[0]
    )


def _wait_replayed(url: str, lsn: str, timeout: float = 30.0) -> None:
    """Until the standby at `url` has replayed WAL position `lsn`."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while not conn.execute("select pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, f"{url} has not replayed {lsn}"
            time.sleep(0.02)


def test_a_deleted_key_is_refused_at_once_while_the_replicas_lag(cluster: Cluster) -> None:
    """Replay paused on both replicas (kept in rotation by a generous lag limit): a key deleted on the primary
    fails at once although the replicas still hold it, and once a principal exists on the primary a keyless read
    is refused although the replicas know of none. Reads are authenticated on the primary."""
    app = create_app(_settings(cluster, max_replica_lag_ms=600_000))
    name = f"p{uuid.uuid4().hex[:12]}"
    with psycopg.connect(cluster.primary, autocommit=True) as conn:
        configure(conn)
        _, key = create_principal(conn, name, tables=["ops"])
        lsn = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
    for url in cluster.replicas:
        _wait_replayed(url, lsn)
    key_header = {"Authorization": f"Bearer {key}"}
    paused = [psycopg.connect(url, autocommit=True) for url in cluster.replicas]
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            _wait_rotation(client, 2)
            before = [client.post("/agents/retrieval", json=search(), headers=key_header) for _ in range(2)]
            assert [r.status_code for r in before] == [200, 200], before[0].text
            assert {r.headers["X-Agentdb-Served-By"] for r in before} == {"replica1", "replica2"}
            for conn in paused:
                conn.execute("select pg_wal_replay_pause()")
            with psycopg.connect(cluster.primary, autocommit=True) as conn:
                delete_principal(conn, name)
            for conn in paused:  # the replicas still know the key
                assert conn.execute(
                    "select count(*) from agentdb.principals where name = %s", (name,)
                ).fetchone() == (1,)
            after = [client.post("/agents/retrieval", json=search(), headers=key_header) for _ in range(2)]
            fetched = client.get("/sources/ops/documents/d1", headers=key_header)
            for response in [*after, fetched]:
                assert response.status_code == 401, response.text
                assert response.json()["error"] | {"message": ""} == {
                    "code": 1401,
                    "name": "Unauthorized",
                    "message": "",
                    "path": "authorization",
                }
            assert {r.headers["X-Agentdb-Served-By"] for r in after} == {"replica1", "replica2"}
            # The other direction: a principal created now closes the keyless server at once.
            assert client.post("/agents/retrieval", json=search()).status_code == 200
            with _new_principal(cluster):
                keyless = client.post("/agents/retrieval", json=search())
                assert keyless.status_code == 401, keyless.text
                assert keyless.json()["error"]["path"] == "authorization"
                for conn in paused:  # they still know only the one deleted above
                    assert conn.execute("select array_agg(name) from agentdb.principals").fetchone() == (
                        [name],
                    )
    finally:
        for conn in paused:
            conn.execute("select pg_wal_replay_resume()")
            conn.close()


def _error(response: Any) -> tuple[int, int, str | None]:
    return response.status_code, response.json()["error"]["code"], response.json()["error"]["path"]


def test_min_lsn_and_consistency_in_the_body(cluster: Cluster, client: TestClient) -> None:
    """`min_lsn` and `consistency` as fields of the JSON body (retrieval, saved-agent runs) or of the query
    string (GET reads) work as the headers do; with both, the stricter wins; bad values are 3007 at their
    name."""
    body = search()
    assert client.post("/agents/retrieval", json=body).headers["X-Agentdb-Served-By"].startswith("replica")
    primary = client.post("/agents/retrieval", json=body | {"consistency": "primary"})
    assert primary.status_code == 200 and primary.headers["X-Agentdb-Served-By"] == "primary"
    # "any" in the body does not undo the header's "primary", nor the reverse.
    for header, field in (("primary", "any"), ("any", "primary")):
        mixed = client.post(
            "/agents/retrieval", json=body | {"consistency": field}, headers={"X-Agentdb-Consistency": header}
        )
        assert mixed.headers["X-Agentdb-Served-By"] == "primary"
    created = client.post(
        "/agents", json={"name": "body-agent", "source": "ops", "retrieval_mode": "lexical"}
    )
    assert created.status_code == 201, created.text
    run = client.post("/agents/body-agent/run", json={"input": "backup", "consistency": "primary"})
    assert run.status_code == 200 and run.headers["X-Agentdb-Served-By"] == "primary"
    doc = client.get("/sources/ops/documents/d1", params={"consistency": "primary"})
    assert doc.status_code == 200 and doc.headers["X-Agentdb-Served-By"] == "primary"
    # Replay paused on both (kept in rotation by a generous lag limit): a body's min_lsn of a later write waits
    # its bound, then the primary serves; an older position in the header does not weaken it, and the same
    # position in the header alone does the same.
    paused = [psycopg.connect(url, autocommit=True) for url in cluster.replicas]
    lenient = TestClient(
        create_app(_settings(cluster, max_replica_lag_ms=600_000)), base_url="http://127.0.0.1"
    )
    with lenient:
        _wait_rotation(lenient, 2)
        _paused_reads(client, lenient, paused, body)
    # Bad values: the stable error at the field's name.
    assert _error(client.post("/agents/retrieval", json=body | {"min_lsn": "yesterday"})) == (
        400,
        3007,
        "min_lsn",
    )
    assert _error(client.post("/agents/retrieval", json=body | {"min_lsn": 5})) == (400, 3007, "min_lsn")
    assert _error(client.post("/agents/retrieval", json=body | {"consistency": "eventual"})) == (
        400,
        3007,
        "consistency",
    )
    assert _error(client.post("/agents/body-agent/run", json={"input": "x", "min_lsn": "1-2"})) == (
        400,
        3007,
        "min_lsn",
    )
    assert _error(client.get("/sources/ops/documents/d1", params={"min_lsn": "later"})) == (
        400,
        3007,
        "min_lsn",
    )
    assert _error(client.get("/sources/ops/documents/d1", params={"consistency": "eventual"})) == (
        400,
        3007,
        "consistency",
    )
    assert client.delete("/agents/body-agent").status_code == 204


def _paused_reads(
    client: TestClient, lenient: TestClient, paused: list[psycopg.Connection[Any]], body: dict[str, Any]
) -> None:
    """Reads naming a position the paused replicas have not replayed, in the body, a header or both."""
    try:
        for conn in paused:
            conn.execute("select pg_wal_replay_pause()")
        written = client.patch("/agents/body-agent", json={"top_k": 4})
        assert written.status_code == 200, written.text
        lsn = written.headers["X-Agentdb-LSN"]
        for extra, headers in (
            ({"min_lsn": lsn}, {}),
            ({"min_lsn": lsn}, {"X-Agentdb-Min-LSN": "0/1"}),
            ({"min_lsn": "0/1"}, {"X-Agentdb-Min-LSN": lsn}),
        ):
            read = lenient.post("/agents/retrieval", json=body | extra, headers=headers)
            assert read.status_code == 200, read.text
            assert read.headers["X-Agentdb-Served-By"] == "primary", (extra, headers)
            assert read.headers.get("Server-Timing", "").startswith("lsn-wait;dur="), (
                extra,
                headers,
                read.headers,
            )
            ran = lenient.post("/agents/body-agent/run", json={"input": "backup"} | extra, headers=headers)
            assert ran.status_code == 200 and ran.headers["X-Agentdb-Served-By"] == "primary"
            assert len(ran.json()["hits"]) == 4  # the agent as just changed
        old = lenient.post("/agents/retrieval", json=body | {"min_lsn": "0/1"})
        assert old.headers["X-Agentdb-Served-By"].startswith("replica") and "Server-Timing" not in old.headers
        fetched = lenient.get(
            "/sources/ops/documents/d1", params={"min_lsn": lsn}, headers={"X-Agentdb-Min-LSN": "0/1"}
        )
        assert fetched.status_code == 200 and fetched.headers["X-Agentdb-Served-By"] == "primary"
    finally:
        for conn in paused:
            conn.execute("select pg_wal_replay_resume()")
            conn.close()


def _until(what: str, test: Any, timeout: float = 30.0) -> Any:
    """Poll `test` until it returns something true, at most `timeout` seconds."""
    return until(what, test, timeout=timeout, interval=0.02)


@contextmanager
def _ops_locked(cluster: Cluster) -> Iterator[psycopg.Connection[Any]]:
    """Table `ops` locked on the primary (ACCESS EXCLUSIVE, in an open transaction) and, through the WAL, on
    both replicas: a read of it waits there until the transaction ends. Rolled back on leaving."""
    with psycopg.connect(cluster.primary) as primary:
        primary.execute("lock table agentdb_docs.ops in access exclusive mode")
        primary.execute("select pg_current_wal_lsn()")  # the lock's WAL record leaves with the next flush
        for url in cluster.replicas:
            with psycopg.connect(url, autocommit=True) as conn:
                _until(
                    "the lock replayed",
                    lambda c=conn: (
                        c.execute(
                            "select count(*) from pg_locks where locktype = 'relation'"
                            " and relation = 'agentdb_docs.ops'::regclass and mode = 'AccessExclusiveLock'"
                        ).fetchone()
                        == (1,)
                    ),
                )
        try:
            yield primary
        finally:
            primary.rollback()


def _blocked_on(cluster: Cluster) -> int:
    """The number (1 or 2) of the running replica where a read waits for the lock of `_ops_locked`; 0 while
    none."""
    for number, url in enumerate(cluster.replicas, start=1):
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and state = 'active'"
                ).fetchone()
        except psycopg.OperationalError:  # the replica stopped by the test
            continue
        if row and row[0]:
            return number
    return 0


def _in_background(call: Any) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    return thread, result


def _retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("retrying")]


@dataclass
class HeldRead:
    """A read sent in the background and waiting on replica `victim` for the lock of `_ops_locked`, which the
    open transaction `primary` holds; `expected` are the primary's hits for it, `standbys` the cluster's by
    number, and `response` the read's answer once the block has left."""

    expected: list[tuple[str, float]]
    standbys: dict[int, Standby]
    primary: psycopg.Connection[Any]
    victim: int
    response: Any = None


@contextmanager
def _a_read_held_on_a_replica(
    cluster: Cluster, client: TestClient, caplog: pytest.LogCaptureFixture
) -> Iterator[HeldRead]:
    """The set-up shared by the tests that crash replicas under a read. In the block the test stops replicas
    and ends `held.primary`'s transaction; leaving it waits for the read (60 s at most), releases the lock and
    puts the read's answer in `held.response`. agentdb.api.routing's messages (the retries) are captured meanwhile."""
    expected = _hits(
        client.post("/agents/retrieval", json=search(), headers={"X-Agentdb-Consistency": "primary"})
    )
    standbys = {s.number: s for s in list_standbys(cluster.data_dir)}
    _wait_rotation(client, 2)  # a replica the test before restarted is back
    with caplog.at_level(logging.INFO, logger="agentdb.api.routing"), _ops_locked(cluster) as primary:
        thread, result = _in_background(lambda: client.post("/agents/retrieval", json=search()))
        victim = _until("a read waiting on a replica", lambda: _blocked_on(cluster))
        held = HeldRead(expected, standbys, primary, victim)
        yield held
        thread.join(timeout=60)
    (held.response,) = result


def test_a_replica_stopped_under_a_read_is_retried_once_on_the_other(
    cluster: Cluster, crash_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A read waits on a replica (a lock replayed from the primary holds it); that replica crashes under it. The
    read runs once more, on the other replica, and answers 200 with the primary's hits; the crashed one is out
    of the rotation at once, and back by itself once it runs again."""
    client = crash_client
    try:
        with _a_read_held_on_a_replica(cluster, client, caplog) as held:
            victim = held.victim
            other = 3 - victim
            stop_standby(held.standbys[victim], mode="immediate")
            # The retry now waits for the same lock on the other replica; the primary's rollback frees it.
            _until("the retry waiting on the other replica", lambda: _blocked_on(cluster) == other)
            held.primary.rollback()
        response = held.response
        assert response.status_code == 200, response.text
        assert response.headers["X-Agentdb-Served-By"] == f"replica{other}"
        assert _hits(response) == held.expected
        (retry,) = _retries(caplog)
        assert retry.startswith(f"retrying POST /agents/retrieval after replica{victim} failed it")
        health = {r["name"]: r for r in client.get("/healthz").json()["replicas"]}
        assert health[f"replica{victim}"]["in_rotation"] is False
        assert {
            client.post("/agents/retrieval", json=search()).headers["X-Agentdb-Served-By"] for _ in range(4)
        } == {f"replica{other}"}
        start_standby(cluster.data_dir, victim)
        _wait_rotation(client, 2)
        assert {
            client.post("/agents/retrieval", json=search()).headers["X-Agentdb-Served-By"] for _ in range(4)
        } == {
            "replica1",
            "replica2",
        }
    finally:
        start_standbys(cluster.data_dir, 2)


def test_all_replicas_down_under_a_read_sends_it_to_the_primary(
    cluster: Cluster, crash_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A read waits on one replica; the other stops, then that one crashes under it: the retry finds no replica
    and the primary answers. With both down every read goes to the primary, without a failure; both come back
    by themselves when they run again."""
    client = crash_client
    try:
        with _a_read_held_on_a_replica(cluster, client, caplog) as held:
            stop_standby(held.standbys[3 - held.victim], mode="immediate")
            stop_standby(held.standbys[held.victim], mode="immediate")
            held.primary.rollback()  # the retry on the primary waits for the lock too
        response = held.response
        assert response.status_code == 200, response.text
        assert response.headers["X-Agentdb-Served-By"] == "primary"
        assert _hits(response) == held.expected
        assert len(_retries(caplog)) == 1
        reads = [client.post("/agents/retrieval", json=search()) for _ in range(6)]
        assert [(r.status_code, r.headers["X-Agentdb-Served-By"]) for r in reads] == [(200, "primary")] * 6
        assert all(_hits(r) == held.expected for r in reads)
        assert [r["in_rotation"] for r in client.get("/healthz").json()["replicas"]] == [False, False]
        start_standbys(cluster.data_dir, 2)
        _wait_rotation(client, 2)
        served = {
            client.post("/agents/retrieval", json=search()).headers["X-Agentdb-Served-By"] for _ in range(4)
        }
        assert served == {"replica1", "replica2"}
    finally:
        start_standbys(cluster.data_dir, 2)


def test_a_replica_down_before_the_monitor_sees_it_fails_no_read(cluster: Cluster) -> None:
    """The monitor checks once at start and then not for an hour: a replica that crashes is still in its
    rotation, so reads reach it, find it down at checkout, take it out and go to the other replica."""
    app = create_app(_settings(cluster, replica_check_interval_ms=3_600_000))
    standbys = {s.number: s for s in list_standbys(cluster.data_dir)}
    try:
        with TestClient(app, base_url="http://127.0.0.1") as client:
            _wait_rotation(client, 2)
            stop_standby(standbys[1], mode="immediate")
            assert [r.in_rotation for r in app.state.router.replicas] == [
                True,
                True,
            ]  # the monitor has not seen it
            reads = [client.post("/agents/retrieval", json=search()) for _ in range(6)]
            assert [(r.status_code, r.headers["X-Agentdb-Served-By"]) for r in reads] == [
                (200, "replica2")
            ] * 6
            health = {r["name"]: r for r in client.get("/healthz").json()["replicas"]}
            assert health["replica1"]["in_rotation"] is False and health["replica1"]["error"]
    finally:
        start_standbys(cluster.data_dir, 2)


def test_the_url_file_moves_only_to_a_writable_agentdb_database(cluster: Cluster, tmp_path: Path) -> None:
    """DATABASE_URL_FILE naming a server that is no primary (a standby), one that cannot be reached, a database
    without agentdb's schema, or nothing at all: the app stays where it is and says why in /healthz; named
    again, the current primary clears that."""
    url_file = tmp_path / "primary-url"
    url_file.write_text(cluster.primary)
    app = create_app(replace(_settings(cluster), database_url=None, database_url_file=url_file))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        pool = app.state.pool
        elsewhere = psycopg.conninfo.make_conninfo(cluster.primary, dbname="postgres")
        gone = psycopg.conninfo.make_conninfo(cluster.primary, port="1")
        for url, reason in (
            (cluster.replicas[0], "it is a standby (in recovery): promote it first"),
            (gone, "cannot connect to it: "),
            (elsewhere, "moving to it failed: the database has no agentdb schema yet"),
            ("", "names no database URL (it is empty)"),
        ):
            url_file.write_text(url)
            primary = _until(
                reason,
                lambda r=reason: (
                    (p := client.get("/healthz").json()["primary"])["error"] and r in p["error"] and p
                ),
            )
            assert primary["switches"] == 0 and primary["url"] == redact(cluster.primary)
            assert app.state.pool is pool
            assert (
                client.post(
                    "/agents/retrieval", json=search(), headers={"X-Agentdb-Consistency": "primary"}
                ).status_code
                == 200
            )
        url_file.write_text(cluster.primary)
        _until("the error cleared", lambda: client.get("/healthz").json()["primary"]["error"] is None)
        assert app.state.watcher.switches == 0 and app.state.pool is pool
