"""Registered tables keep their embeddings current: rows written by other programs are
embedded by the server in the background, `/sources` says how many wait, and registering is idempotent."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient

from agentdb.api import create_app
from agentdb.config import Settings
from agentdb.errors import StorageKindMismatch
from agentdb.sources import register_table


def register(conn: Any, db_url: str, name: str = "notes", text_columns: tuple[str, ...] = ("body",)) -> Any:
    return register_table(
        conn,
        db_url,
        name,
        table="notes",
        id_column="id",
        text_columns=list(text_columns),
        embedding_model="all-MiniLM-L6-v2",
        embedding_dim=384,
    )


@pytest.fixture
def notes(conn: Any) -> None:
    conn.execute("create table notes (id int primary key, body text)")
    conn.execute("insert into notes values (1, 'restore a base backup'), (2, 'rotate the WAL archive')")


def test_registering_again_is_a_no_op_and_other_columns_conflict(conn: Any, db_url: str, notes: None) -> None:
    first = register(conn, db_url)
    assert register(conn, db_url) == first
    with pytest.raises(StorageKindMismatch):
        register(conn, db_url, text_columns=("body", "id"))
    with pytest.raises(StorageKindMismatch):
        register(conn, db_url, name="other")


def wait_for(check: Any, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "the background embedder did not catch up"
        time.sleep(0.2)


def test_the_server_embeds_new_and_changed_rows_in_the_background(
    conn: Any, db_url: str, notes: None, embedder: Any
) -> None:
    register(conn, db_url)
    settings = Settings(database_url=db_url, embed_interval_s=0.2)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:

        def pending() -> int:
            [source] = client.get("/sources").json()
            return int(source["pending_embeddings"])

        wait_for(lambda: pending() == 0)
        # another program adds a row and changes one: both wait, then both are embedded
        with psycopg.connect(db_url) as other:
            other.execute("insert into notes values (3, 'vacuum frees dead tuples')")
            other.execute("update notes set body = 'promote the standby after failover' where id = 1")
        wait_for(lambda: pending() == 0)
        stored = dict(conn.execute("select id, agentdb_embedding from notes").fetchall())
        for note_id, text in ((3, "vacuum frees dead tuples"), (1, "promote the standby after failover")):
            assert np.allclose(stored[note_id].to_numpy(), embedder.embed([text])[0], atol=1e-4)
        found = client.post(
            "/agents/retrieval",
            json={
                "query": "q",
                "queries": [{"table": "notes", "semantic_search": "dead tuples", "threshold": 0}],
            },
        ).json()
        assert found["hits"][0]["_id"] == "3"


def test_pending_rows_are_counted_before_the_embedder_runs(conn: Any, db_url: str, notes: None) -> None:
    register(conn, db_url)
    with TestClient(
        create_app(Settings(database_url=db_url, embed_interval_s=0)), base_url="http://127.0.0.1"
    ) as c:
        [source] = c.get("/sources").json()
        assert source["pending_embeddings"] == 2


def test_a_principal_is_not_shown_the_pending_count(conn: Any, db_url: str, notes: None) -> None:
    """The count covers rows outside a principal's row filter, so principals do not get it."""
    from agentdb.auth import create_principal

    register(conn, db_url)
    key = create_principal(conn, "r", tables=["notes"], row_filter={"ids": ["1"]})[1]
    with TestClient(
        create_app(Settings(database_url=db_url, embed_interval_s=0)), base_url="http://127.0.0.1"
    ) as c:
        [source] = c.get("/sources", headers={"Authorization": f"Bearer {key}"}).json()
        assert source["pending_embeddings"] is None and source["documents"] == 1
