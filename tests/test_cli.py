"""The `agentdb` command end to end, as a user runs it: real processes, a real database, the real model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from agentdb.cli import build_parser

AGENTDB = [sys.executable, "-m", "agentdb.cli"]
DOCS = [
    {
        "_id": "d1",
        "title": "Write-ahead logging",
        "text": "WAL archiving copies segment files to a safe place.",
        "year": 2021,
        "tags": ["wal", "backup"],
    },
    {
        "_id": "d2",
        "title": "Vacuum",
        "text": "VACUUM reclaims storage occupied by dead tuples.",
        "year": 2019,
        "tags": ["maintenance"],
    },
    {
        "_id": "d3",
        "title": "Indexes",
        "text": "A B-tree index speeds up equality and range queries.",
        "year": 2023,
        "tags": ["index"],
    },
]


def run(
    args: list[str], db_url: str | None, *, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if db_url:
        env["DATABASE_URL"] = db_url
    result = subprocess.run([*AGENTDB, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"agentdb {args} failed ({result.returncode}):\n{result.stderr}")
    return result


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(d) for d in DOCS) + b"\n")
    return path


def test_every_command_has_help() -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {
        "serve",
        "demo",
        "migrate",
        "db-url",
        "sources",
        "ingest",
        "register",
        "search",
        "eval",
        "check",
        "principal",
    }
    for name in commands:
        result = subprocess.run([*AGENTDB, name, "--help"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "usage: agentdb " + name in result.stdout


def test_migrate_ingest_sources_search_check(db_url: str, corpus: Path) -> None:
    assert "up to date" in run(["migrate"], db_url).stdout
    out = run(["ingest", "notes", str(corpus), "--no-progress"], db_url).stdout
    assert "3 documents, 3 chunks" in out
    listed = orjson.loads(run(["sources", "--json"], db_url).stdout)
    assert [(s["name"], s["documents"], s["chunks"]) for s in listed] == [("notes", 3, 3)]
    assert {f["name"]: f["type"] for f in listed[0]["fields"]} == {"year": "int", "tags": "string_set"}
    found = orjson.loads(
        run(["search", "notes", "archiving WAL segments", "--json", "--top-k", "2"], db_url).stdout
    )
    assert found["route"] == "found" and found["hits"][0]["id"] == "d1"
    lexical = orjson.loads(
        run(
            [
                "search",
                "notes",
                "vacuum",
                "--mode",
                "lexical",
                "--json",
                "--filter",
                '{"year": {"$lt": 2020}}',
            ],
            db_url,
        ).stdout
    )
    assert [h["id"] for h in lexical["hits"]] == ["d2"] and lexical["hits"][0]["distance"] is None
    assert "match the documents" in run(["check", "notes"], db_url).stdout


def test_check_detects_and_repairs_a_damaged_index(db_url: str, corpus: Path) -> None:
    run(["ingest", "notes", str(corpus), "--no-progress"], db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("delete from agentdb.postings where term = 'vacuum'")
    broken = run(["check", "notes"], db_url, check=False)
    assert broken.returncode == 2 and "postings" in broken.stdout and "--repair" in broken.stderr
    repaired = run(["check", "notes", "--repair"], db_url)
    assert "repaired" in repaired.stdout
    assert "match the documents" in run(["check", "notes"], db_url).stdout


def test_errors_are_one_line_and_exit_non_zero(db_url: str, corpus: Path, tmp_path: Path) -> None:
    result = run(["search", "nosuch", "x"], db_url, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "agentdb: error 3010 StorageFileNotFound: unknown source 'nosuch' (at source); "
        "hint: list the sources with `agentdb sources`"
    ]
    run(["ingest", "notes", str(corpus), "--no-progress"], db_url)
    bad_filter = run(
        ["search", "notes", "x", "--mode", "lexical", "--filter", '{"year": "old"}'], db_url, check=False
    )
    assert (
        bad_filter.returncode == 2
        and "3007 InvalidParamValue" in bad_filter.stderr
        and "(at filter.year)" in bad_filter.stderr
    )
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text('{"_id": "x1", "text": "fine"}\n\n{"_id": "x2", "text": 5}\n')
    bad = run(["ingest", "notes", str(bad_file), "--no-progress"], db_url, check=False)
    assert bad.returncode == 2 and f"{bad_file}:3" in bad.stderr and "'text'" in bad.stderr
    skipped = run(["ingest", "notes", str(bad_file), "--no-progress", "--skip-bad"], db_url)
    assert "1 documents" in skipped.stdout and "skipped:" in skipped.stderr
    unreachable = run(["sources"], "postgresql://nobody@127.0.0.1:1/none", check=False)
    assert unreachable.returncode == 2 and "cannot reach the database" in unreachable.stderr


def test_eval_prints_ndcg_and_recall(db_url: str, corpus: Path, tmp_path: Path) -> None:
    run(["ingest", "notes", str(corpus), "--no-progress"], db_url)
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        '{"_id": "q1", "text": "reclaim storage of dead tuples"}\n{"_id": "q2", "text": "btree index"}\n'
    )
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\nq2\td3\t1\n")
    out = run(
        ["eval", "notes", "--queries", str(queries), "--qrels", str(qrels), "--no-progress"], db_url
    ).stdout
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert set(lines) == {"lexical", "dense", "hybrid"}
    assert "nDCG@10 1.0000" in lines["lexical"] and "Recall@100 1.0000" in lines["hybrid"]


def test_db_url_gives_psql_a_working_url() -> None:
    data_dir = tempfile.mkdtemp(prefix="agentdb-dburl-")
    result = run(["db-url", "--data-dir", data_dir], None)
    url = result.stdout.strip()
    with psycopg.connect(url) as conn:
        assert conn.execute("select current_database()").fetchone() == ("agentdb",)
    psql = subprocess.run(["psql", url, "-Atc", "select 1"], capture_output=True, text=True, timeout=60)
    if psql.returncode != 127:  # psql is optional on the machine; the URL itself was checked above
        assert psql.stdout.strip() == "1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_answers_over_real_http(db_url: str) -> None:
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": db_url}
    server = subprocess.Popen(
        [*AGENTDB, "serve", "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.3)
        assert response.status_code == 200 and response.json()["status"] == "ok"
        assert (
            httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=5).json()["info"]["title"] == "agentdb"
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_demo_loads_the_manual_and_the_readme_sql_works(db_url: str) -> Any:
    """`agentdb demo` loads the PostgreSQL manual once; the README's SQL examples then answer."""
    first = run(["demo", "--no-serve"], db_url, timeout=3600)  # one-time CPU embedding of ~9,000 chunks
    assert "3932 documents" in first.stderr
    again = run(["demo", "--no-serve"], db_url)
    assert "is loaded" in again.stderr
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "select id, rank, bm25_score, left(text, 60)"
            " from agentdb.search('pgdocs', 'continuous archiving', mode => 'lexical', top_k => 5)"
        ).fetchall()
        assert len(rows) == 5 and any(r[0].startswith("continuous-archiving.html") for r in rows)
        kinds = conn.execute(
            "select metadata->>'kind' from agentdb.search('pgdocs', 'wal', mode => 'lexical', filter => '{\"kind\": \"sect2\"}')"
        ).fetchall()
        assert kinds and {k for (k,) in kinds} == {"sect2"}
        similar = conn.execute(
            "select id, distance from agentdb.similar('pgdocs', 'continuous-archiving.html', 5)"
        ).fetchall()
        assert len(similar) == 5 and all(r[0] != "continuous-archiving.html" for r in similar)

    # The README's HTTP example and principal command, against the same demo database.
    from fastapi.testclient import TestClient

    from agentdb.api import create_app
    from agentdb.config import Settings

    readme_request = {
        "query": "how do I set up WAL archiving?",
        "queries": [
            {
                "table": "pgdocs",
                "semantic_search": "set up WAL archiving",
                "full_text_search": "archive_command wal archiving",
                "limit": 5,
                "filter_query": {"term": "sect2", "field": "kind"},
                "fields": ["title", "section"],
            }
        ],
        "diagnostics": True,
    }
    with TestClient(create_app(Settings(database_url=db_url))) as client:
        body = client.post("/agents/retrieval", json=readme_request).json()
        assert body["route"] == "found" and len(body["hits"]) == 5
        assert all(set(h["_source"]) <= {"title", "section"} for h in body["hits"])
        assert any("archiv" in h["_source"]["title"].lower() for h in body["hits"])
    created = run(
        [
            "principal",
            "create",
            "ops",
            "--tables",
            "pgdocs",
            "--row-filter",
            '{"kind": {"$ne": "page"}}',
            "--fields",
            "title,text,kind",
            "--tools",
            "search",
        ],
        db_url,
    )
    key = created.stdout.strip()
    with TestClient(create_app(Settings(database_url=db_url))) as client:
        assert client.post("/agents/retrieval", json=readme_request).status_code == 401
        request = {
            "query": "wal",
            "queries": [
                {
                    "table": "pgdocs",
                    "full_text_search": "wal archiving",
                    "limit": 20,
                    "fields": ["title", "kind"],
                }
            ],
        }
        hits = client.post(
            "/agents/retrieval", json=request, headers={"Authorization": f"Bearer {key}"}
        ).json()["hits"]
        assert hits and all(h["_source"]["kind"] != "page" for h in hits)
