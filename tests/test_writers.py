"""Principals that write documents (the `ingest` tool): they exist, and their writes stay inside their row
filter and field grant."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from psycopg.types.json import Jsonb

from agentdb.api import create_app
from agentdb.auth import create_principal
from agentdb.cli import main
from agentdb.config import Settings
from agentdb.sources import FieldSpec, create_document_source

FIELDS = [FieldSpec(name="tenant", type="string"), FieldSpec(name="secret", type="string")]


def test_a_principal_with_the_ingest_tool_can_be_created(
    conn: Any, db_url: str, monkeypatch: Any, capsys: Any
) -> None:
    create_document_source(conn, "t", embedding_model="all-MiniLM-L6-v2", embedding_dim=384, fields=FIELDS)
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert main(["principal", "create", "w", "--tables", "t", "--tools", "search,ingest"]) == 0
    assert "adb_" in capsys.readouterr().out
    row = conn.execute("select tools from agentdb.principals where name = 'w'").fetchone()
    assert row[0] == ["search", "ingest"]


def test_a_catalog_rule_is_a_clean_error_not_a_traceback(conn: Any) -> None:
    """Integrity errors map to the error tree with the field's path (here: bypassing the tool check)."""
    import psycopg

    from agentdb.auth import _db_error

    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        conn.execute(
            "insert into agentdb.principals (name, key_hash, key_prefix, tools, role)"
            " values ('x', 'h', 'p', array['rm'], 'r')"
        )
    error = _db_error(raised.value)
    assert error is not None and error.code == 3007 and error.path == "tools"


@pytest.fixture
def writer(conn: Any, embedder: Any, db_url: str) -> Iterator[tuple[TestClient, dict[str, str], Any]]:
    create_document_source(conn, "t", embedding_model="all-MiniLM-L6-v2", embedding_dim=384, fields=FIELDS)
    rows = [
        ("a1", {"tenant": "acme"}),
        ("a2", {"tenant": "acme", "secret": "S-1"}),
        ("g1", {"tenant": "globex"}),
    ]
    vector = embedder.embed(["x"])[0]
    for doc_id, meta in rows:
        conn.execute(
            "insert into agentdb_docs.t (doc_id, chunk, title, text, metadata, agentdb_embedding)"
            " values (%s, 0, %s, 'backup and restore', %s, %s)",
            (doc_id, doc_id, Jsonb(meta), vector),
        )
    key = create_principal(
        conn,
        "w",
        tables=["t"],
        row_filter={"tenant": "acme"},
        fields=["title", "text", "tenant"],
        tools=["search", "ingest"],
    )[1]
    reader = create_principal(conn, "r", tables=["t"], tools=["search"])[1]
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        yield client, {"w": f"Bearer {key}", "r": f"Bearer {reader}"}, conn


def stored(conn: Any, doc_id: str) -> list[Any]:
    return conn.execute("select metadata from agentdb_docs.t where doc_id = %s", (doc_id,)).fetchall()


def test_writes_stay_inside_the_row_filter_and_field_grant(writer: Any) -> None:
    client, keys, conn = writer
    w = {"Authorization": keys["w"]}
    ok = client.post("/sources/t/documents", json=[{"_id": "a3", "text": "wal", "tenant": "acme"}], headers=w)
    assert ok.status_code == 200, ok.text
    assert client.get("/sources/t/documents/a3", headers=w).status_code == 200
    # a row it could not read it cannot create ...
    outside = client.post(
        "/sources/t/documents", json=[{"_id": "n1", "text": "x", "tenant": "globex"}], headers=w
    )
    assert outside.status_code == 403 and outside.json()["error"]["path"] == "body:0"
    assert stored(conn, "n1") == []
    # ... nor overwrite (g1 belongs to globex; a2 holds a field it may not see) ...
    for doc_id in ("g1", "a2"):
        replaced = client.post(
            "/sources/t/documents", json=[{"_id": doc_id, "text": "mine now", "tenant": "acme"}], headers=w
        )
        assert replaced.status_code == 403 and replaced.json()["error"]["path"] == "body:0"
    assert stored(conn, "g1") == [({"tenant": "globex"},)]
    assert stored(conn, "a2") == [({"tenant": "acme", "secret": "S-1"},)]
    # ... nor write a field outside its grant (which would also add it to the schema)
    hidden = client.post(
        "/sources/t/documents", json=[{"_id": "a4", "text": "x", "tenant": "acme", "secret": "x"}], headers=w
    )
    assert hidden.status_code == 403 and hidden.json()["error"]["path"] == "body:0.secret"
    assert stored(conn, "a4") == []
    # deleting: only what it can read; the rest answers 404 as if absent
    assert client.delete("/sources/t/documents/g1", headers=w).status_code == 404
    assert stored(conn, "g1") != []
    assert client.delete("/sources/t/documents/a1", headers=w).status_code == 204
    assert stored(conn, "a1") == []
    # a principal without the ingest tool writes nothing; a writer cannot create sources
    r = {"Authorization": keys["r"]}
    assert client.post("/sources/t/documents", json=[{"_id": "z", "text": "x"}], headers=r).status_code == 403
    assert client.delete("/sources/t/documents/a3", headers=r).status_code == 403
    assert (
        client.post("/sources/new/documents", json=[{"_id": "z", "text": "x"}], headers=w).status_code == 403
    )


def test_the_database_role_enforces_the_same_limits_on_writes(writer: Any) -> None:
    """Under the writer's own role (what the HTTP writes run as), bypassing every application check."""
    import psycopg
    from psycopg import sql

    _, _, conn = writer
    role = conn.execute("select role from agentdb.principals where name = 'w'").fetchone()[0]
    insert = "insert into agentdb_docs.t (doc_id, chunk, title, text, metadata) values (%s, 0, 'x', 'wal archive', %s)"

    def as_writer(statement: str, params: tuple[Any, ...]) -> list[Any]:
        with conn.transaction():
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(role)))
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    for metadata in ({"tenant": "globex"}, {"tenant": "acme", "secret": "x"}):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            as_writer(insert, ("n2", Jsonb(metadata)))
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # no SELECT: RETURNING a hidden column
        as_writer(
            "insert into agentdb_docs.t (doc_id, chunk, text, metadata) values ('n3', 0, 'x', '{}') returning metadata",
            (),
        )
    as_writer(insert, ("n1", Jsonb({"tenant": "acme"})))
    assert stored(conn, "n1") == [({"tenant": "acme"},)]
    assert as_writer("delete from agentdb_docs.t where doc_id = %s returning doc_id", ("g1",)) == []
    assert stored(conn, "g1") != []
    assert as_writer("delete from agentdb_docs.t where doc_id = %s returning doc_id", ("n1",)) == [("n1",)]
    # the index triggers ran with their owner's rights: postings and statistics still match the documents
    check = conn.execute("select * from agentdb.lexical_check('t')").fetchall()
    assert all(row[-1] == 0 for row in check), check
