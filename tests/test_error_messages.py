"""The reference's error names mislead for sources: 3010 is called "StorageFileNotFound" and 3011
"StorageKindMismatch". Codes and names stay (the contract); every door's message must say plainly what
happened. This fails if any of them regresses to a message that leans on the name."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from test_cli import run

from agentdb.api import create_app
from agentdb.config import Settings
from agentdb.errors import StorageKindMismatch, from_db_error
from agentdb.sources import create_document_source

UNKNOWN = "no source named 'nope'; `agentdb sources` or GET /sources lists them"


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as test_client:
        yield test_client


def test_an_unknown_source_is_said_plainly_at_every_door(
    client: TestClient, conn: psycopg.Connection[Any], db_url: str
) -> None:
    # HTTP: checked in Python (GET /sources/nope, documents, indexes) and in SQL (retrieval).
    requests = [
        ("GET", "/sources/nope", None, "source"),
        ("GET", "/sources/nope/documents/x", None, "source"),
        ("GET", "/sources/nope/indexes", None, "source"),
        (
            "POST",
            "/agents/retrieval",
            {"query": "x", "queries": [{"table": "nope", "full_text_search": "x"}]},
            "queries[0].table",
        ),
    ]
    for method, url, body, path in requests:
        response = client.request(method, url, json=body)
        assert response.status_code == 404, (url, response.text)
        error = response.json()["error"]
        assert (error["code"], error["name"], error["message"], error["path"]) == (
            3010,
            "StorageFileNotFound",
            UNKNOWN,
            path,
        ), url
    # SQL: the stored functions say the same.
    for statement in (
        "select agentdb.retrieve('nope', 'x', null, 'lexical')",
        "select * from agentdb.lexical_check('nope')",
    ):
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(statement)
        error = from_db_error(caught.value)
        assert error is not None and (error.code, error.message, error.path) == (3010, UNKNOWN, "source")
    # CLI.
    for args in (["search", "nope", "x", "--mode", "lexical"], ["index", "list", "nope"]):
        result = run(args, db_url, check=False)
        assert result.returncode == 2 and f"3010 StorageFileNotFound: {UNKNOWN}" in result.stderr, (
            result.stderr
        )


def test_a_taken_source_name_is_said_plainly(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any, monkeypatch: Any, capsys: Any
) -> None:
    taken = (
        "a source named 'docs' already exists; choose another name (`agentdb sources` lists the taken ones)"
    )
    create_document_source(conn, "docs", embedding_model=embedder.model_name, embedding_dim=embedder.dim)
    with pytest.raises(StorageKindMismatch) as caught:
        create_document_source(conn, "docs", embedding_model=embedder.model_name, embedding_dim=embedder.dim)
    assert (caught.value.message, caught.value.path) == (taken, "source")
    # The CLI's `register` under a taken name (in this process, whose model is loaded already).
    from agentdb.cli import main

    conn.execute("create table notes (id int primary key, body text)")
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setattr(sys, "argv", ["agentdb"])
    code = main(["register", "docs", "--table", "notes", "--id-column", "id", "--text-column", "body"])
    assert code == 2 and f"3011 StorageKindMismatch: {taken}" in capsys.readouterr().err
