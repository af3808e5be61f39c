"""The HTTP skeleton over the real app and a real database: health, sources, the error envelope, OpenAPI."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from agentdb.api import create_app
from agentdb.config import Settings
from agentdb.db.pool import open_pool
from agentdb.sources import FieldSpec, create_document_source


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as test_client:
        yield test_client


def test_healthz_checks_the_database(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["database"].startswith("PostgreSQL 18")


def test_sources_lists_registered_sources(client: TestClient, conn: Any) -> None:
    assert client.get("/sources").json() == []
    create_document_source(
        conn,
        "notes",
        embedding_model="all-MiniLM-L6-v2",
        embedding_dim=384,
        fields=[FieldSpec(name="year", type="int")],
    )
    conn.execute("insert into agentdb_docs.notes (doc_id, chunk, text) values ('a', 0, 'x'), ('a', 1, 'y')")
    [source] = client.get("/sources").json()
    assert source["name"] == "notes" and source["documents"] == 1 and source["chunks"] == 2
    assert source["fields"][0]["name"] == "year" and source["table"] == "agentdb_docs.notes"


def test_errors_use_the_envelope(client: TestClient) -> None:
    response = client.get("/sources/nosuch")
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "code": 3010,
            "name": "StorageFileNotFound",
            "message": "no source named 'nosuch'; `agentdb sources` or GET /sources lists them",
            "path": "source",
        }
    }
    response = client.get("/no/such/route")
    assert response.status_code == 404 and response.json()["error"]["code"] == 1404


def test_exhausted_pool_is_503_with_retry_after(db_url: str) -> None:
    pool = open_pool(db_url, min_size=1, max_size=1, timeout=0.5)
    try:
        with TestClient(
            create_app(Settings(database_url=db_url), pool=pool), base_url="http://127.0.0.1"
        ) as test_client:
            with pool.connection():
                response = test_client.get("/healthz")
            assert response.status_code == 503
            assert response.headers["Retry-After"] == "1"
            assert response.json()["error"]["name"] == "DatabaseUnavailable"
            assert test_client.get("/healthz").status_code == 200
    finally:
        pool.close()


def test_openapi_lists_the_routes(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert {"/healthz", "/sources"} <= set(spec["paths"])
    assert spec["components"]["schemas"]["ErrorEnvelope"]["properties"]["error"]


def test_a_fresh_database_is_migrated_and_writable(server_url: str, embedder: Any) -> None:
    """The pool's connections must know the vector type even when the first migration creates it."""
    import uuid

    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f"agentdb_test_fresh_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    try:
        with TestClient(
            create_app(Settings(database_url=make_conninfo(server_url, dbname=name))),
            base_url="http://127.0.0.1",
        ) as client:
            response = client.post(
                "/sources/notes/documents", json=[{"_id": "a", "text": "vector types work"}]
            )
            assert response.status_code == 200 and response.json()["chunks"] == 1
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


def test_nul_characters_are_a_clear_400_on_every_endpoint(client: TestClient, conn: Any) -> None:
    """PostgreSQL text cannot hold NUL; found by the OpenAPI fuzzer as a 500 on POST /agents."""
    create_document_source(conn, "docs", embedding_model="all-MiniLM-L6-v2", embedding_dim=384)
    cases = [
        ("/agents", {"source": "do\u0000cs", "name": "t"}, "source"),
        (
            "/agents/retrieval",
            {"query": "x", "queries": [{"table": "docs", "full_text_search": "a\u0000"}]},
            "queries[0].full_text_search",
        ),
        ("/agents/retrieval", {"query": "x", "bad\u0000key": 1}, "bad\u0000key"),
    ]
    for url, body, path in cases:
        response = client.post(url, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["name"], error["path"]) == (3007, "InvalidParamValue", path)
    lines = b'{"_id": "a", "text": "fine"}\n{"_id": "b", "text": "bad\\u0000"}\n'
    response = client.post(
        "/sources/docs/documents", content=lines, headers={"content-type": "application/x-ndjson"}
    )
    assert response.status_code == 400 and response.json()["error"]["path"] == "body:2.text"
    assert conn.execute("select count(*) from agentdb_docs.docs").fetchone() == (0,)
    # Bodies without NUL still reach their endpoints (the middleware read the body first).
    assert client.post("/agents", json={"source": "docs", "name": "ok"}).status_code == 201


def test_docs_work_offline_and_openapi_declares_keys_and_uploads(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and "cdn" not in page.text.lower()
    for asset in ("/docs-assets/swagger-ui-bundle.js", "/docs-assets/swagger-ui.css"):
        assert asset in page.text
        served = client.get(asset)
        assert served.status_code == 200 and len(served.content) > 10_000
    spec = client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert {"HTTPBearer": []} in spec["paths"]["/agents/retrieval"]["post"]["security"]
    upload = spec["paths"]["/sources/{name}/documents"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/x-ndjson"} <= set(upload)
