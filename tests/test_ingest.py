"""Ingestion of JSONL, JSONL.gz, CSV and Parquet files into document sources, against a real PostgreSQL
and the real MiniLM embedder: chunks, ids, inferred field types, embeddings, the lexical index, bad rows,
re-ingestion, user-supplied vectors and concurrent writers."""

from __future__ import annotations

import gzip
import importlib
import random
import re
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
import psycopg
import pytest
from psycopg import sql

from agentdb.db.pool import configure
from agentdb.embed import check_vector
from agentdb.errors import AgentDBError, InvalidParamValue, StorageContentError, StorageKindMismatch
from agentdb.ingest.chunking import chunk_text
from agentdb.ingest.pipeline import EMBED_BATCH, WRITE_BATCH, Document, FieldMap, _batches, ingest
from agentdb.ingest.readers import Located, read_records
from agentdb.sources import (
    FieldSpec,
    add_fields,
    create_document_source,
    get_source,
    optimize_source,
    register_table,
)
from tests.conftest import without_autovacuum

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DOCS_JSONL = FIXTURES / "docs.jsonl"
DOCS_CSV = FIXTURES / "docs.csv"
LONG_ID = "replication"
SMALL_CHUNKS = {"chunk_size": 32, "chunk_overlap": 8}


# Helpers ---------------------------------------------------------------------------------------------


def lexical_check(conn: psycopg.Connection[Any], name: str) -> dict[str, int]:
    return dict(conn.execute("select what, mismatches from agentdb.lexical_check(%s)", (name,)).fetchall())


def assert_lexical_ok(conn: psycopg.Connection[Any], name: str) -> None:
    assert lexical_check(conn, name) == {"postings": 0, "term_stats": 0, "term_bounds": 0, "corpus_stats": 0}
    source_id = get_source(conn, name).id
    row = conn.execute(
        f"select (select count(*) from agentdb_docs.{name}), n_chunks from agentdb.corpus_stats"  # noqa: S608
        " where source_id = %s",
        (source_id,),
    ).fetchone()
    assert row is not None and row[0] == row[1]


def chunk_rows(conn: psycopg.Connection[Any], name: str) -> dict[str, list[dict[str, Any]]]:
    """Rows of the source grouped by document id, each document's chunks in order."""
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(
            f"select agentdb_chunk_id, doc_id, chunk, title, text, metadata, agentdb_embedding"  # noqa: S608
            f" from agentdb_docs.{name} order by doc_id, chunk"
        ).fetchall()
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["doc_id"], []).append(row)
    return grouped


def field_types(conn: psycopg.Connection[Any], name: str) -> dict[str, str]:
    return {f.name: f.type for f in get_source(conn, name).fields}


def postings(conn: psycopg.Connection[Any], source_id: int) -> list[tuple[Any, ...]]:
    """Source `source_id`'s postings (term, chunk id, tf, dl) in term and chunk order, whichever its layout."""
    return conn.execute(
        "select term, chunk_id, tf, dl from agentdb.postings where source_id = %s"
        " union all"
        " select b.term, b.first_chunk + u.off, u.tf, u.dl from agentdb.posting_blocks b"
        " cross join lateral unnest(agentdb_internal.block_ints(b.offs, b.narrow_offs), b.tfs,"
        "                           agentdb_internal.block_ints(b.dls, b.narrow_dls)) u(off, tf, dl)"
        " where b.source_id = %s order by 1, 2",
        (source_id, source_id),
    ).fetchall()


def snapshot(conn: psycopg.Connection[Any], name: str) -> dict[str, Any]:
    """Everything ingestion may change for source `name`."""
    source = get_source(conn, name)
    return {
        "rows": conn.execute(
            f"select doc_id, chunk, title, text, metadata::text, agentdb_embedding::text"  # noqa: S608
            f" from agentdb_docs.{name} order by doc_id, chunk"
        ).fetchall(),
        "fields": conn.execute(
            "select fields::text from agentdb.sources where id = %s", (source.id,)
        ).fetchall(),
        "postings": postings(conn, source.id),
        "posting_blocks": conn.execute(
            "select term, first_chunk, last_chunk from agentdb.posting_blocks where source_id = %s order by 1, 2",
            (source.id,),
        ).fetchall(),
        "term_stats": conn.execute(
            "select term, df from agentdb.term_stats where source_id = %s order by 1", (source.id,)
        ).fetchall(),
        "corpus_stats": conn.execute(
            "select n_chunks, total_len from agentdb.corpus_stats where source_id = %s", (source.id,)
        ).fetchall(),
    }


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    """One line per item: a dict is dumped as JSON, a str is written as it is (blank or broken lines)."""
    path.write_bytes(
        b"".join((orjson.dumps(x) if isinstance(x, dict) else x.encode()) + b"\n" for x in lines)
    )
    return path


def fixture_records() -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in DOCS_JSONL.read_bytes().splitlines() if line.strip()]


def unit(vector: Any) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float32)
    return array / np.linalg.norm(array)


# JSONL, chunks, types and embeddings ------------------------------------------------------------------------


def test_jsonl_ingestion_chunks_ids_types_and_embeddings(
    conn: psycopg.Connection[Any], embedder: Any
) -> None:
    report = ingest(conn, "docs", read_records(DOCS_JSONL), embedder, progress=False, **SMALL_CHUNKS)
    records = {r["_id"]: r for r in fixture_records()}
    docs = chunk_rows(conn, "docs")

    # BEIR `_id` keys become the document ids; every short document is one chunk holding its whole text.
    assert set(docs) == set(records)
    assert report.documents == 5 and report.replaced == 0 and report.skipped == []
    assert report.chunks == sum(len(chunks) for chunks in docs.values())
    for doc_id, chunks in docs.items():
        if doc_id != LONG_ID:
            assert [(c["chunk"], c["text"], c["title"]) for c in chunks] == [
                (0, records[doc_id]["text"], records[doc_id]["title"])
            ]

    # The long document splits into overlapping windows of at most 32 tokens, positions 0..n-1.
    text = records[LONG_ID]["text"]
    pieces = [c["text"] for c in docs[LONG_ID]]
    assert len(pieces) == 6  # 134 word pieces, windows start every 24: 0, 24, 48, 72, 96, 120
    assert [c["chunk"] for c in docs[LONG_ID]] == list(range(len(pieces)))
    assert all(piece in text for piece in pieces)
    assert text.startswith(pieces[0]) and text.endswith(pieces[-1])
    offsets = [text.index(piece) for piece in pieces]
    assert offsets == sorted(offsets)
    for before, after, start_before, start_after in zip(
        pieces, pieces[1:], offsets, offsets[1:], strict=False
    ):
        overlap = start_before + len(before) - start_after
        assert overlap > 0, "consecutive chunks must overlap"
        assert before[-overlap:] == after[:overlap]
    assert all(len(embedder.token_spans(piece)) <= 32 + 1 for piece in pieces)  # +1: a cut word re-tokenizes
    assert {c["title"] for c in docs[LONG_ID]} == {records[LONG_ID]["title"]}

    # Metadata types are inferred from the values: ints, floats (an int in a float field is promoted),
    # strings, bools and string sets (sorted, duplicates removed).
    assert field_types(conn, "docs") == {
        "year": "int",
        "score": "float",
        "lang": "string",
        "reviewed": "bool",
        "tags": "string_set",
    }
    assert sorted(report.new_fields) == ["lang", "reviewed", "score", "tags", "year"]
    assert docs["vacuum"][0]["metadata"] == {
        "year": 2021,
        "score": 2.0,
        "lang": "en",
        "reviewed": False,
        "tags": ["maintenance"],
    }
    assert docs["planner"][0]["metadata"]["tags"] == ["planner", "statistics"]
    assert docs["index"][0]["metadata"]["tags"] == []
    assert all(c["metadata"] == docs[LONG_ID][0]["metadata"] for c in docs[LONG_ID])

    # Embeddings: 384 dimensions, unit length, the model's vector of "title\nchunk".
    every = [c for chunks in docs.values() for c in chunks]
    stored = np.array([np.asarray(c["agentdb_embedding"].to_list()) for c in every])
    assert stored.shape == (len(every), 384)
    assert np.allclose(np.linalg.norm(stored, axis=1), 1.0, atol=1e-5)
    for c in (docs[LONG_ID][2], docs["wal"][0]):
        vector = np.asarray(c["agentdb_embedding"].to_list())
        expected = embedder.embed([c["title"] + "\n" + c["text"]])[0]
        assert np.allclose(vector, expected, atol=1e-4)
        assert not np.allclose(vector, embedder.embed([c["text"]])[0], atol=1e-2)  # the title counts

    assert_lexical_ok(conn, "docs")
    assert postings(conn, get_source(conn, "docs").id)


def test_jsonl_gz_ingests_like_plain_jsonl(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    gz = tmp_path / "docs.jsonl.gz"
    with gzip.open(gz, "wb") as handle:
        handle.write(DOCS_JSONL.read_bytes())
    ingest(conn, "plain", read_records(DOCS_JSONL), embedder, progress=False, **SMALL_CHUNKS)
    report = ingest(conn, "zipped", read_records(gz), embedder, progress=False, **SMALL_CHUNKS)
    assert report.documents == 5
    rows = "select doc_id, chunk, title, text, metadata::text from agentdb_docs.{} order by doc_id, chunk"
    assert conn.execute(rows.format("zipped")).fetchall() == conn.execute(rows.format("plain")).fetchall()
    assert field_types(conn, "zipped") == field_types(conn, "plain")
    assert_lexical_ok(conn, "zipped")


def test_csv_ingestion_plain_ids_and_timestamps(conn: psycopg.Connection[Any], embedder: Any) -> None:
    report = ingest(conn, "csvdocs", read_records(DOCS_CSV), embedder, progress=False)
    assert (report.documents, report.chunks) == (4, 4)
    docs = chunk_rows(conn, "csvdocs")
    assert set(docs) == {"1", "2", "3", "4"}  # plain integer `id` column, stored as text
    assert field_types(conn, "csvdocs") == {
        "year": "int",
        "price": "float",
        "lang": "string",
        "active": "bool",
        "published": "timestamp",
    }
    first = docs["1"][0]
    assert first["title"] == "Checkpoints"
    assert first["text"].startswith("A checkpoint flushes dirty buffers")
    assert first["metadata"] == {
        "year": 2017,
        "price": 9.5,
        "lang": "en",
        "active": True,
        "published": "2020-01-02T03:04:05",
    }
    assert docs["3"][0]["metadata"]["price"] == 7.0
    assert (
        docs["4"][0]["text"]
        == "Extensions package types, functions and operators, installed with CREATE EXTENSION."
    )
    vector = np.asarray(first["agentdb_embedding"].to_list())
    assert np.allclose(vector, embedder.embed(["Checkpoints\n" + first["text"]])[0], atol=1e-4)
    assert_lexical_ok(conn, "csvdocs")


@pytest.fixture
def parquet_file(tmp_path: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "_id": ["p1", "p2", "p3"],
            "title": ["Hot standby", "Logical decoding", "Parallel query"],
            "text": [
                "A hot standby answers read-only queries during recovery.",
                "Logical decoding turns the write-ahead log into a stream of row changes.",
                "Parallel query splits a scan across several background workers.",
            ],
            "year": pa.array([2010, 2014, 2016], pa.int64()),
            "rating": pa.array([4.5, 3.0, 5.0], pa.float64()),
            "stable": [True, False, True],
            "tags": pa.array([["replication", "standby"], [], ["performance"]], pa.list_(pa.string())),
            "released": pa.array(
                [
                    datetime(2010, 9, 20, 8, 0, tzinfo=UTC),
                    datetime(2014, 12, 18, tzinfo=UTC),
                    datetime(2016, 10, 27, 23, 59, 59, tzinfo=UTC),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "note": pa.array(["beta", None, "ga"], pa.string()),
        }
    )
    path = tmp_path / "docs.parquet"
    pq.write_table(table, path)
    return path


def test_parquet_ingestion_types(conn: psycopg.Connection[Any], embedder: Any, parquet_file: Path) -> None:
    report = ingest(conn, "pq", read_records(parquet_file), embedder, progress=False)
    assert (report.documents, report.chunks) == (3, 3)
    docs = chunk_rows(conn, "pq")
    assert set(docs) == {"p1", "p2", "p3"}
    assert field_types(conn, "pq") == {
        "year": "int",
        "rating": "float",
        "stable": "bool",
        "tags": "string_set",
        "released": "timestamp",
        "note": "string",
    }
    meta = docs["p1"][0]["metadata"]
    assert meta["year"] == 2010 and meta["rating"] == 4.5 and meta["stable"] is True
    assert meta["tags"] == ["replication", "standby"]
    assert datetime.fromisoformat(meta["released"]) == datetime(2010, 9, 20, 8, 0, tzinfo=UTC)
    assert "note" not in docs["p2"][0]["metadata"]  # a null is an absent optional value
    assert docs["p2"][0]["metadata"]["tags"] == []
    assert_lexical_ok(conn, "pq")


# Bad rows ------------------------------------------------------------------------------------------------

GOOD = [
    {"_id": "g1", "title": "Good", "text": "a good row before the bad one", "year": 2001, "rank": 1},
    {"_id": "g2", "title": "Good", "text": "another good row with a new field", "rank": 2, "color": "red"},
]
AFTER = [{"_id": "g3", "text": "a good row after the bad one", "year": 2003}]
# (bad line, field named by the error); the bad line comes after GOOD and two blank lines.
BAD_ROWS: list[tuple[str, str, str]] = [
    ("missing_id", '{"title": "No id", "text": "where is my id"}', "id"),
    ("empty_id", '{"_id": "", "text": "an empty id"}', "_id"),
    ("text_not_string", '{"_id": "b", "text": 42}', "text"),
    ("text_missing", '{"_id": "b", "title": "only a title"}', "text"),
    ("year_conflicts_with_source", '{"_id": "b", "text": "t", "year": "abc"}', "year"),
    ("rank_conflicts_with_earlier_rows", '{"_id": "b", "text": "t", "rank": "abc"}', "rank"),
    ("embedding_wrong_dimension", '{"_id": "b", "text": "t", "embedding": [0.1, 0.2, 0.3]}', "embedding"),
    ("embedding_not_numbers", '{"_id": "b", "text": "t", "embedding": "0.1 0.2"}', "embedding"),
    ("nested_metadata", '{"_id": "b", "text": "t", "extra": {"a": 1}}', "extra"),
    ("reserved_key", '{"_id": "b", "text": "t", "chunk": 3}', "chunk"),
    ("invalid_json", '{"_id": "b", "text": "unterminated', ""),
    ("not_an_object", '["_id", "b"]', ""),
]


@pytest.fixture
def seeded(conn: psycopg.Connection[Any], embedder: Any) -> dict[str, Any]:
    """Source `docs` holding one document with an int `year`, and a snapshot of all it owns."""
    base = [{"_id": "seed", "title": "Seed", "text": "checkpoints flush dirty buffers", "year": 1999}]
    ingest(conn, "docs", base_records(base), embedder, progress=False)
    before = snapshot(conn, "docs")
    assert before["postings"] and before["term_stats"]
    return before


def base_records(records: list[dict[str, Any]]) -> Any:
    """Records as a reader yields them, for inputs built in the test."""
    return (Located("<test>", i, r) for i, r in enumerate(records, start=1))


@pytest.mark.parametrize(("case", "line", "field"), BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_bad_row_aborts_and_writes_nothing(
    conn: psycopg.Connection[Any],
    embedder: Any,
    seeded: dict[str, Any],
    tmp_path: Path,
    case: str,
    line: str,
    field: str,
) -> None:
    path = write_jsonl(tmp_path / f"{case}.jsonl", [*GOOD, "", "   ", line, *AFTER])
    bad_line = len(GOOD) + 3
    with pytest.raises(StorageContentError) as caught:
        ingest(conn, "docs", read_records(path), embedder, progress=False)
    error = caught.value
    assert error.code == 8003
    where = f"{path}:{bad_line}"
    assert where in error.message
    assert error.path == (f"{where}.{field}" if field else where)
    if field:
        assert f"field {field!r}" in error.message
    assert f"{path}:{bad_line + 1}" not in error.message
    assert snapshot(conn, "docs") == seeded  # no documents, no new fields, postings unchanged
    assert_lexical_ok(conn, "docs")


def test_bad_row_in_csv_names_its_line(
    conn: psycopg.Connection[Any], embedder: Any, seeded: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(
        "id,title,text,year\n1,One,first row,2001\n2,Two,second row,2002\n3,Three,,2003\n4,Four,x,2004\n"
    )
    with pytest.raises(StorageContentError) as caught:
        ingest(conn, "docs", read_records(path), embedder, progress=False)
    assert caught.value.path == f"{path}:4.text"
    assert f"{path}:4" in caught.value.message
    assert snapshot(conn, "docs") == seeded


def test_bad_row_into_new_source_creates_nothing(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [*GOOD, '{"_id": "b", "text": 42}'])
    with pytest.raises(StorageContentError):
        ingest(conn, "fresh", read_records(path), embedder, progress=False)
    assert conn.execute("select count(*) from agentdb.sources").fetchone() == (0,)
    assert conn.execute("select to_regclass('agentdb_docs.fresh')").fetchone() == (None,)


def test_skip_bad_reports_and_writes_the_rest(
    conn: psycopg.Connection[Any], embedder: Any, seeded: dict[str, Any], tmp_path: Path
) -> None:
    lines: list[Any] = [*GOOD]
    for _, line, _ in BAD_ROWS:
        lines += ["", line]
    lines += AFTER
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    report = ingest(conn, "docs", read_records(path), embedder, progress=False, skip_bad=True)
    expected_lines = [len(GOOD) + 2 * (i + 1) for i in range(len(BAD_ROWS))]
    assert [(bad.file, bad.line, bad.field) for bad in report.skipped] == [
        (str(path), line, field) for line, (_, _, field) in zip(expected_lines, BAD_ROWS, strict=True)
    ]
    assert report.documents == 3 and report.chunks == 3
    assert set(chunk_rows(conn, "docs")) == {"seed", "g1", "g2", "g3"}
    assert field_types(conn, "docs") == {"year": "int", "rank": "int", "color": "string"}
    assert_lexical_ok(conn, "docs")


def test_skipped_rows_do_not_define_fields(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    # The first row is skipped (its `extra` is unsupported) after its `color` was seen as a string; the
    # good rows that follow say `color` is an int and must be accepted as such.
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"_id": "bad", "text": "skipped", "color": "red", "shade": "dark", "extra": {"nested": True}},
            {"_id": "a", "text": "first good row", "color": 1},
            {"_id": "b", "text": "second good row", "color": 2},
        ],
    )
    report = ingest(conn, "docs", read_records(path), embedder, progress=False, skip_bad=True)
    assert [(bad.line, bad.field) for bad in report.skipped] == [(1, "extra")]
    assert report.documents == 2
    assert field_types(conn, "docs") == {"color": "int"}  # no `shade`: only the skipped row had it
    assert chunk_rows(conn, "docs")["b"][0]["metadata"] == {"color": 2}


@pytest.mark.parametrize(
    ("tenant_field", "message"),
    [
        ("title", "invalid tenant field 'title'"),
        ("has space", "invalid tenant field 'has space'"),
        ("year", "the tenant field 'year' has type int; a tenant field holds strings"),
    ],
)
def test_a_bad_tenant_field_is_refused_and_creates_nothing(
    conn: psycopg.Connection[Any], embedder: Any, tenant_field: str, message: str
) -> None:
    records = [{"_id": "a", "text": "first", "year": 2001, "team": "t1"}]
    with pytest.raises(InvalidParamValue, match=re.escape(message)) as caught:
        ingest(conn, "fresh", base_records(records), embedder, progress=False, tenant_field=tenant_field)
    assert caught.value.path == "tenant_field"
    assert conn.execute("select count(*) from agentdb.sources").fetchone() == (0,)
    assert conn.execute("select to_regclass('agentdb_docs.fresh')").fetchone() == (None,)


def test_a_tenant_source_needs_the_tenant_on_every_document_and_keeps_its_field(
    conn: psycopg.Connection[Any], embedder: Any
) -> None:
    """One node records the tenant field (a coordinator distributes the source by it) and holds every document
    to it: a document without a string tenant is refused with its location, nothing written; another tenant
    field for the existing source is refused; searches answer as for any source."""
    good = [
        {"_id": "a", "text": "wal archiving", "team": "t1"},
        {"_id": "b", "text": "wal replay", "team": "t2"},
    ]
    ingest(conn, "tenants", base_records(good), embedder, progress=False, tenant_field="team")
    assert get_source(conn, "tenants").tenant_field == "team"
    before = snapshot(conn, "tenants")
    for bad in ({"_id": "c", "text": "no tenant"}, {"_id": "c", "text": "empty tenant", "team": ""}):
        with pytest.raises(StorageContentError, match="'c' has no tenant") as caught:
            ingest(conn, "tenants", base_records([*good, bad]), embedder, progress=False)
        assert caught.value.path == "<test>:3"
        assert snapshot(conn, "tenants") == before
    with pytest.raises(InvalidParamValue, match="exists with tenant field 'team'") as refused:
        ingest(conn, "tenants", base_records(good), embedder, progress=False, tenant_field="other")
    assert refused.value.path == "tenant_field"
    hits = conn.execute(
        "select id from agentdb.search('tenants', 'wal', mode => 'lexical', filter => '{\"team\": \"t2\"}')"
    ).fetchall()
    assert hits == [("b",)]


def test_an_upload_names_the_tenant_field_of_the_source_it_creates(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any
) -> None:
    """POST /sources/{name}/documents?tenant_field=F: the field of a source the request creates (a bad one is a
    400 at `tenant_field`, nothing made), and the existing one's for later uploads."""
    from fastapi.testclient import TestClient

    from agentdb.api import create_app
    from agentdb.config import Settings

    body = [{"id": "a", "text": "wal archiving", "team": "t1"}]
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        refused = client.post("/sources/up/documents?tenant_field=text", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["path"] == "tenant_field"
        assert conn.execute("select to_regclass('agentdb_docs.up')").fetchone() == (None,)
        assert client.post("/sources/up/documents?tenant_field=team", json=body).status_code == 200
        assert get_source(conn, "up").tenant_field == "team"
        other = client.post("/sources/up/documents?tenant_field=org", json=body)
        assert other.status_code == 400 and "exists with tenant field 'team'" in other.text
        assert client.post("/sources/up/documents", json=body).status_code == 200


@pytest.mark.parametrize(
    ("query", "tenant"),
    [
        ("tenant_field=te%00am", "t1"),  # NUL in the field's name
        ("tenant_field=%ED%A0%80", "t1"),  # a lone surrogate, as its UTF-8 bytes
        ("tenant_field=" + "t" * 10_000, "t1"),
        ("tenant_field=team", "t\\u0000 1"),  # NUL in a document's tenant
        ("tenant_field=team", "\\ud800"),  # a lone surrogate as a document's tenant
    ],
)
def test_a_hostile_tenant_field_or_value_is_a_clear_error_that_makes_nothing(
    conn: psycopg.Connection[Any], db_url: str, query: str, tenant: str
) -> None:
    """Hostile names for the tenant field and hostile tenant values in an upload's documents are refused with
    an error envelope (never a 500) and no source is made."""
    from fastapi.testclient import TestClient

    from agentdb.api import create_app
    from agentdb.config import Settings

    body = '[{"id": "a", "text": "wal archiving", "team": "' + tenant + '"}]'
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        response = client.post(
            f"/sources/up/documents?{query}", content=body, headers={"content-type": "application/json"}
        )
    assert 400 <= response.status_code < 500, response.text
    assert set(response.json()["error"]) >= {"code", "name", "message", "path"}
    assert conn.execute("select to_regclass('agentdb_docs.up')").fetchone() == (None,)
    assert conn.execute("select count(*) from agentdb.sources").fetchone() == (0,)


def test_no_records_is_an_error(conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(InvalidParamValue):
        ingest(conn, "docs", read_records(path), embedder, progress=False)


# Re-ingestion ---------------------------------------------------------------------------------------------


def test_reingest_replaces_the_whole_document(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    long = next(r for r in fixture_records() if r["_id"] == LONG_ID)
    first = write_jsonl(tmp_path / "v1.jsonl", [long, {"_id": "other", "text": "an untouched neighbour"}])
    ingest(conn, "docs", read_records(first), embedder, progress=False, **SMALL_CHUNKS)
    old = chunk_rows(conn, "docs")[LONG_ID]
    assert len(old) == 6
    old_ids = [c["agentdb_chunk_id"] for c in old]

    second = write_jsonl(
        tmp_path / "v2.jsonl",
        [
            {"_id": LONG_ID, "title": "Replication", "text": "Standbys replay the log.", "year": 2024},
        ],
    )
    report = ingest(conn, "docs", read_records(second), embedder, progress=False)
    assert (report.documents, report.chunks, report.replaced) == (1, 1, 1)
    docs = chunk_rows(conn, "docs")
    assert [(c["chunk"], c["title"], c["text"]) for c in docs[LONG_ID]] == [
        (0, "Replication", "Standbys replay the log.")
    ]
    assert docs[LONG_ID][0]["metadata"]["year"] == 2024
    assert len(docs["other"]) == 1
    assert not [p for p in postings(conn, get_source(conn, "docs").id) if p[1] in old_ids]
    # A term only the old text had is gone from the statistics.
    assert conn.execute("select count(*) from agentdb.term_stats where term = 'synchron'").fetchone() == (0,)
    assert_lexical_ok(conn, "docs")


def test_repeated_id_in_one_input_keeps_the_last(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    path = write_jsonl(
        tmp_path / "dup.jsonl",
        [
            {"id": 7, "text": "first version"},
            {"id": "8", "text": "other"},
            {"id": 7, "text": "second version"},
        ],
    )
    report = ingest(conn, "docs", read_records(path), embedder, progress=False)
    assert (report.documents, report.replaced) == (2, 0)
    assert [(c["doc_id"], c["text"]) for c in chunk_rows(conn, "docs")["7"]] == [("7", "second version")]
    assert_lexical_ok(conn, "docs")


# User-supplied vectors and model checks --------------------------------------------------------------------


def test_user_vectors_are_stored_as_given(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    rng = random.Random(7)
    vector = [rng.uniform(-2, 2) for _ in range(384)]  # deliberately not unit length
    long = next(r for r in fixture_records() if r["_id"] == LONG_ID)
    path = write_jsonl(
        tmp_path / "vectors.jsonl",
        [
            {"_id": "mine", "title": "Mine", "text": "my own vector", "embedding": vector},
            {**long, "embedding": list(reversed(vector))},
            {"_id": "model", "title": "Model", "text": "the model embeds this one"},
        ],
    )
    report = ingest(conn, "docs", read_records(path), embedder, progress=False, **SMALL_CHUNKS)
    docs = chunk_rows(conn, "docs")
    assert np.array_equal(
        docs["mine"][0]["agentdb_embedding"].to_numpy(), np.asarray(vector, dtype=np.float32)
    )
    # A document with its own vector is one chunk: the vector stands for the whole text.
    assert [(c["chunk"], c["text"]) for c in docs[LONG_ID]] == [(0, long["text"])]
    assert np.array_equal(
        docs[LONG_ID][0]["agentdb_embedding"].to_numpy(), np.asarray(vector[::-1], dtype=np.float32)
    )
    assert "embedding" not in docs["mine"][0]["metadata"]
    assert np.allclose(
        docs["model"][0]["agentdb_embedding"].to_numpy(),
        embedder.embed(["Model\nthe model embeds this one"])[0],
        atol=1e-4,
    )
    assert report.chunks == 3
    assert_lexical_ok(conn, "docs")


def test_a_bulk_ingestion_leaves_its_tables_vacuumed_and_analyzed(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    """At ANALYZE_AFTER_CHUNKS chunks or more, ingestion vacuums what it wrote (the visibility map set, so the
    postings are read by index-only scans without heap fetches) and analyzes it; autovacuum, turned off on the
    database's tables here, has no part in it (nor can its ANALYZE keep that VACUUM from its work). Inside a
    transaction block the same step only analyzes. (A source in the row layout, whose postings those
    index-only scans read.)"""
    from agentdb.ingest.pipeline import ANALYZE_AFTER_CHUNKS, analyze_source

    rng = np.random.default_rng(3)

    def records(n: int, start: int) -> list[dict[str, Any]]:
        return [
            {"_id": f"d{i}", "text": f"alpha beta w{i}", "embedding": rng.normal(size=384).tolist()}
            for i in range(start, start + n)
        ]

    ingest(
        conn,
        "bulk",
        read_records(write_jsonl(tmp_path / "one.jsonl", records(1, 0))),
        embedder,
        progress=False,
        lexical_layout="rows",
    )
    without_autovacuum(conn)
    path = write_jsonl(tmp_path / "many.jsonl", records(ANALYZE_AFTER_CHUNKS, 1))
    ingest(conn, "bulk", read_records(path), embedder, progress=False)
    # (The file may end in pages extended for COPY and never used; a VACUUM that does not truncate keeps them.)
    used, visible = conn.execute(
        "select count(distinct (ctid::text::point)[0]),"
        " (select relallvisible from pg_class where oid = 'agentdb_docs.bulk'::regclass) from agentdb_docs.bulk"
    ).fetchone()
    assert used > 10 and visible == used
    plan = "\n".join(
        line
        for (line,) in conn.execute(
            "explain (analyze, costs off) select count(*) from agentdb.postings p"
            " where p.source_id = (select id from agentdb.sources where name = 'bulk') and p.term = 'alpha'"
        )
    )
    assert "Index Only Scan" in plan and re.search(r"Heap Fetches: 0\b", plan), plan
    assert conn.execute(
        "select last_analyze is not null from pg_stat_user_tables where relid = 'agentdb_docs.bulk'::regclass"
    ).fetchone() == (True,)
    with conn.transaction():
        analyze_source(conn, get_source(conn, "bulk"))
    assert_lexical_ok(conn, "bulk")


def vector_index(conn: psycopg.Connection[Any], name: str) -> str | None:
    """The definition of source `name`'s HNSW index, or None."""
    row = conn.execute(
        "select indexdef from pg_indexes where schemaname = 'agentdb_docs' and tablename = %s"
        " and indexdef like '%% USING hnsw %%'",
        (name,),
    ).fetchone()
    return None if row is None else str(row[0])


def vector_records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {"_id": f"v{i}", "text": f"gamma delta w{i}", "embedding": rng.normal(size=384).tolist()}
        for i in range(n)
    ]


def nearest(conn: psycopg.Connection[Any], name: str, vector: Any) -> tuple[str, str]:
    """The nearest chunk's document to `vector` by the HNSW index (sequential scans off), and the plan."""
    with conn.transaction():
        conn.execute("set local enable_seqscan = off")
        query = (
            f"select doc_id from agentdb_docs.{name}"  # noqa: S608 - a test's own source name
            " order by agentdb_embedding <=> %s::vector limit 1"
        )
        plan = "\n".join(r[0] for r in conn.execute("explain " + query, (str(list(vector)),)).fetchall())
        row = conn.execute(query, (str(list(vector)),)).fetchone()
    assert row is not None
    return str(row[0]), plan


def test_a_new_source_is_loaded_without_its_vector_index_and_gets_it_after(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ingestion into a source it creates writes the rows first and builds the HNSW index once over all of
    them (faster than inserting each vector into the graph); into an existing source it writes into the index."""
    pipeline = importlib.import_module("agentdb.ingest.pipeline")  # (agentdb.ingest is also a function)

    during: list[str | None] = []
    real_write = pipeline.write_documents

    def observed_write(*args: Any, **kwargs: Any) -> Any:
        during.append(vector_index(conn, "fresh"))
        return real_write(*args, **kwargs)

    monkeypatch.setattr(pipeline, "write_documents", observed_write)
    records = vector_records(80, 5)
    ingest(
        conn, "fresh", read_records(write_jsonl(tmp_path / "a.jsonl", records[:70])), embedder, progress=False
    )
    assert during == [None]
    definition = vector_index(conn, "fresh")
    assert definition is not None and "(agentdb_embedding vector_cosine_ops)" in definition
    assert nearest(conn, "fresh", records[42]["embedding"])[0] == "v42"
    ingest(
        conn, "fresh", read_records(write_jsonl(tmp_path / "b.jsonl", records[70:])), embedder, progress=False
    )
    assert during == [None, definition]
    doc, plan = nearest(conn, "fresh", records[75]["embedding"])
    assert doc == "v75" and "fresh_agentdb_embedding_idx" in plan
    assert_lexical_ok(conn, "fresh")


def test_a_failed_load_into_a_new_source_still_builds_its_vector_index(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that fails ends the ingestion; the batches before it stay (each is its own transaction), and
    the source gets its vector index over them."""
    pipeline = importlib.import_module("agentdb.ingest.pipeline")  # (agentdb.ingest is also a function)

    real_copy = pipeline.copy_chunks
    calls: list[int] = []

    def failing_copy(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the second batch fails")
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(pipeline, "copy_chunks", failing_copy)
    records = vector_records(WRITE_BATCH + 6, 6)  # batches of WRITE_BATCH documents: the second one fails
    with pytest.raises(RuntimeError, match="second batch"):
        ingest(
            conn, "broken", read_records(write_jsonl(tmp_path / "a.jsonl", records)), embedder, progress=False
        )
    assert conn.execute("select count(*) from agentdb_docs.broken").fetchone() == (WRITE_BATCH,)
    assert vector_index(conn, "broken") is not None
    doc, plan = nearest(conn, "broken", records[10]["embedding"])
    assert doc == "v10" and "broken_agentdb_embedding_idx" in plan
    assert_lexical_ok(conn, "broken")


def test_small_ingestions_into_a_block_source_merge_the_blocks_of_their_terms(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    """A source fed one document at a time (each ingestion far below ANALYZE_AFTER_CHUNKS) keeps its terms'
    blocks merged: each ingestion merges the partly filled blocks of its documents' terms, so a term every
    document holds stays in the one block its postings need instead of a block per document. A term of other
    writes (not through ingestion) is left as they cut it."""

    def blocks(term: str) -> list[int]:
        return [
            n
            for (n,) in conn.execute(
                "select cardinality(tfs) from agentdb.posting_blocks where term = %s order by first_chunk",
                (term,),
            )
        ]

    records = vector_records(40, 11)
    for i, record in enumerate(records):
        path = write_jsonl(tmp_path / f"{i}.jsonl", [record | {"text": f"{record['text']} zeta"}])
        ingest(conn, "drip", read_records(path), embedder, progress=False)
        assert blocks("zeta") == [i + 1], i
    assert get_source(conn, "drip").lexical_layout == "blocks"
    conn.execute(
        "insert into agentdb_docs.drip (doc_id, chunk, title, text, metadata) values"
        " ('x1', 0, '', 'omega', '{}'), ('x2', 0, '', 'omega', '{}')"
    )
    conn.execute(
        "insert into agentdb_docs.drip (doc_id, chunk, title, text, metadata) values ('x3', 0, '', 'omega', '{}')"
    )
    assert blocks("omega") == [2, 1]
    path = write_jsonl(tmp_path / "last.jsonl", [records[0] | {"_id": "last", "text": "zeta eta"}])
    ingest(conn, "drip", read_records(path), embedder, progress=False)
    assert blocks("zeta") == [41] and blocks("omega") == [2, 1]
    assert_lexical_ok(conn, "drip")


@pytest.mark.parametrize(
    ("vector", "message"),
    [
        ([1.0, 2.0, 10**400], "finite numbers only"),  # an integer beyond any float (and 64 bits)
        ([1.0, 2.0, float("nan")], "finite numbers only"),
        ([1.0, 2.0, 1e39], "within float4's range"),  # finite as a double, infinite as pgvector's float4
        ([1.0, 2.0, 2**200], "within float4's range"),
        ([1.0, True, 2.0], "array of numbers"),
        ([[1.0], [2.0], [3.0]], "array of numbers"),  # nested
        ([1.0, 2.0, "3\u0000"], "array of numbers"),
        ([1.0, 2.0, "\ud800"], "array of numbers"),  # a lone surrogate
        (np.array([["1", "2", "3"]]), "array of numbers"),
        (np.ones((3, 1)), "array of numbers"),
        ({"a": 1.0, "b": 2.0, "c": 3.0}, "array of numbers"),
        ([1.0, 2.0], "dimension 2"),
    ],
)
def test_a_hostile_vector_is_a_clear_error(vector: Any, message: str) -> None:
    """check_vector, which every user-supplied vector passes (ingestion, memory records and entities)."""
    with pytest.raises(StorageContentError, match=message) as raised:
        check_vector(vector, 3, "records[0].embedding")
    assert raised.value.path == "records[0].embedding"


def test_a_vector_of_numbers_is_kept_as_the_float4_values_pgvector_stores() -> None:
    for vector, expected in [
        ([1, 2**70, 0.5], [1.0, float(2**70), 0.5]),
        (np.array([1, 2, 3], dtype=np.int64), [1.0, 2.0, 3.0]),
        ([0.1, -3.4e38, 1e-50], [float(np.float32(0.1)), float(np.float32(-3.4e38)), 0.0]),
    ]:
        kept = check_vector(vector, 3, "e")
        assert kept.dtype == np.float32 and kept.tolist() == expected


def test_write_batches_hold_many_documents_with_vectors_and_few_to_embed() -> None:
    """A write batch takes up to WRITE_BATCH documents that carry their vectors, and ends once EMBED_BATCH of its
    documents need embedding; every document is written once, in order."""
    docs = [Document(f"d{i}", "", "text", {}, None if 100 <= i < 300 else [0.0], "f", i) for i in range(1200)]
    batches = list(_batches(docs))
    assert [d for b in batches for d in b] == docs
    # d0..d99 carry vectors, d100..d299 do not, d300..d1199 do
    assert EMBED_BATCH == 64 and WRITE_BATCH == 512
    assert [len(b) for b in batches] == [164, 64, 64, 512, 396]


def test_a_source_named_with_63_characters_is_loaded_indexed_and_searched(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    """A source name may be as long as a PostgreSQL name (63 characters). Its table's indexes are named by
    PostgreSQL, which shortens the table's name in them: names made here from the whole table name were cut at
    63 bytes, and the metadata index's became the table's own ('relation ... already exists', nothing loaded).
    Loaded in two ingestions (the first drops and rebuilds the vector index), then searched by both legs."""
    name = "s" + "x" * 62
    records = [r | {"team": f"t{i % 2}"} for i, r in enumerate(vector_records(8, 9))]
    for part in (records[:5], records[5:]):
        ingest(conn, name, read_records(write_jsonl(tmp_path / "a.jsonl", part)), embedder, progress=False)
    indexes = conn.execute(
        "select indexrelid::regclass::text, pg_get_indexdef(indexrelid) from pg_index"
        " where indrelid = format('agentdb_docs.%%I', %s::text)::regclass",
        (name,),
    ).fetchall()
    methods = sorted(definition.split(" USING ")[1].split(" ")[0] for _, definition in indexes)
    assert methods == ["btree", "btree", "gin", "hnsw"], indexes
    assert all(len(index.split(".")[1]) <= 63 for index, _ in indexes)
    doc, plan = nearest(conn, name, records[6]["embedding"])
    assert doc == "v6" and "Index Scan using" in plan
    assert_lexical_ok(conn, name)
    hits = conn.execute(
        "select id from agentdb.search(%s, 'w3', mode => 'lexical', top_k => 10, threshold => 0)", (name,)
    ).fetchall()
    assert hits == [("v3",)]


def test_an_ingestion_builds_a_vector_index_a_dead_load_left_out(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    """A process that died while loading a new source leaves it without its vector index; the next
    ingestion into the source builds it before writing."""
    records = vector_records(6, 7)
    ingest(
        conn, "orphan", read_records(write_jsonl(tmp_path / "a.jsonl", records[:5])), embedder, progress=False
    )
    conn.execute("drop index agentdb_docs.orphan_agentdb_embedding_idx")  # what the dead load left
    ingest(
        conn, "orphan", read_records(write_jsonl(tmp_path / "b.jsonl", records[5:])), embedder, progress=False
    )
    assert vector_index(conn, "orphan") is not None
    doc, plan = nearest(conn, "orphan", records[2]["embedding"])
    assert doc == "v2" and "orphan_agentdb_embedding_idx" in plan


def test_any_hnsw_index_of_a_table_counts_as_its_vector_index(
    conn: psycopg.Connection[Any], embedder: Any
) -> None:
    """A memory store's records table has its HNSW index under a name of its own: ensuring a vector index
    adds no second one."""
    from agentdb.memory import StoreSpec, write_records
    from agentdb.sources import ensure_vector_index

    write_records(
        conn,
        "ensure_{var.u}",
        [{"text": "one note"}],
        variables={"u": "a"},
        embedder=embedder,
        spec=StoreSpec(schema="n"),
    )
    name, table = conn.execute(
        "select name, format('%I.%I', table_schema, table_name) from agentdb.sources"
        " where table_schema = 'agentdb_memory' order by id desc limit 1"
    ).fetchone()
    assert hnsw_indexes(conn, table) == 1
    ensure_vector_index(conn, get_source(conn, name))
    assert hnsw_indexes(conn, table) == 1


def hnsw_indexes(conn: psycopg.Connection[Any], table: str) -> int:
    """How many HNSW indexes table `table` (schema-qualified) has."""
    row = conn.execute(
        "select count(*) from pg_index i join pg_class c on c.oid = i.indexrelid join pg_am a on a.oid = c.relam"
        " where i.indrelid = %s::regclass and a.amname = 'hnsw'",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def wait_until_blocked(conn: psycopg.Connection[Any], pid: int) -> None:
    """Wait until backend `pid` waits for a lock (at most 30 s)."""
    for _ in range(600):
        row = conn.execute("select wait_event_type from pg_stat_activity where pid = %s", (pid,)).fetchone()
        if row is not None and row[0] == "Lock":
            return
        time.sleep(0.05)
    raise AssertionError(f"backend {pid} never waited for a lock")


@pytest.mark.parametrize("first_writes", [False, True], ids=["two-builders", "builder-already-writing"])
def test_two_ingestions_ensuring_the_vector_index_at_once_build_it_once(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any, first_writes: bool
) -> None:
    """Two ingestions that both find the index missing (one finishing a load into the source it created, the
    other starting one): the second waits for the first's build and then finds it, instead of failing on
    the index's name. When the first already holds a writer's lock on the table in its own transaction,
    the server lets it go ahead of the waiting builder rather than deadlocking."""
    from agentdb.sources import drop_vector_index, ensure_vector_index

    name = f"twice_{int(first_writes)}"
    source = create_document_source(
        conn, name, embedding_model=embedder.model_name, embedding_dim=embedder.dim
    )
    drop_vector_index(conn, source)
    errors: list[BaseException] = []
    with psycopg.connect(db_url) as first, psycopg.connect(db_url, autocommit=True) as second:
        configure(first)
        configure(second)

        def build_second() -> None:
            try:
                ensure_vector_index(second, source)
            except BaseException as exc:  # noqa: BLE001 - reported to the test thread
                errors.append(exc)

        thread = threading.Thread(target=build_second)
        if first_writes:
            first.execute(sql.SQL("lock table {} in row exclusive mode").format(source.table))
            thread.start()
            wait_until_blocked(conn, second.info.backend_pid)
            ensure_vector_index(first, source)
        else:
            ensure_vector_index(first, source)
            thread.start()
            wait_until_blocked(conn, second.info.backend_pid)
        first.commit()
        thread.join(timeout=60)
    assert not thread.is_alive() and errors == []
    assert hnsw_indexes(conn, f"agentdb_docs.{name}") == 1


def test_other_model_source_refuses_model_embedding(
    conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path
) -> None:
    create_document_source(conn, "other", embedding_model="other-model", embedding_dim=384)
    before = snapshot(conn, "other")
    path = write_jsonl(tmp_path / "plain.jsonl", [{"_id": "a", "text": "needs the model", "color": "red"}])
    with pytest.raises(StorageContentError) as caught:
        ingest(conn, "other", read_records(path), embedder, progress=False)
    assert caught.value.code == 8003
    assert "other-model" in caught.value.message and embedder.model_name in caught.value.message
    assert snapshot(conn, "other") == before  # not even the new field `color`

    # Records that bring their own vectors need no model and are accepted.
    vector = unit(np.arange(1, 385)).tolist()
    path = write_jsonl(
        tmp_path / "vectors.jsonl", [{"_id": "b", "text": "brings a vector", "embedding": vector}]
    )
    assert ingest(conn, "other", read_records(path), None, progress=False).documents == 1
    assert_lexical_ok(conn, "other")


def test_without_embedder_records_need_vectors(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    create_document_source(conn, "nomodel", embedding_model="other-model", embedding_dim=3)
    path = write_jsonl(tmp_path / "plain.jsonl", [{"_id": "a", "text": "no vector"}])
    with pytest.raises(StorageContentError) as caught:
        ingest(conn, "nomodel", read_records(path), None, progress=False)
    assert caught.value.path == "embedding"
    assert conn.execute("select count(*) from agentdb_docs.nomodel").fetchone() == (0,)


def test_registered_table_is_not_an_ingestion_target(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any
) -> None:
    conn.execute("create table notes (id int primary key, body text)")
    register_table(
        conn,
        db_url,
        "notes",
        table="notes",
        id_column="id",
        text_columns=["body"],
        embedding_model=embedder.model_name,
        embedding_dim=embedder.dim,
    )
    with pytest.raises(StorageKindMismatch):
        ingest(conn, "notes", read_records(DOCS_CSV), embedder, progress=False)


# Concurrency -------------------------------------------------------------------------------------------------

VOCABULARY = (
    "replication standby primary log checkpoint vacuum tuple index planner statistics buffer "
    "commit durability recovery archive segment"
).split()


def worker_records(
    prefix: str, count: int, rng: random.Random, field: str, *, vectors: bool
) -> list[dict[str, Any]]:
    records = []
    for i in range(count):
        record: dict[str, Any] = {
            "_id": f"{prefix}{i}",
            "title": prefix,
            "text": " ".join(rng.choices(VOCABULARY, k=12)),
            field: i,
        }
        if vectors:
            record["embedding"] = unit([rng.gauss(0, 1) for _ in range(384)]).tolist()
        records.append(record)
    return records


def run_threads(db_url: str, jobs: list[Any]) -> list[BaseException]:
    """Run each job(conn) in its own thread on its own connection, all released at once."""
    barrier = threading.Barrier(len(jobs))
    errors: list[BaseException] = []

    def run(job: Any) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as own:
                configure(own)
                barrier.wait()
                job(own)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "an ingestion thread hung"
    return errors


def test_two_threads_ingest_into_one_source(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any
) -> None:
    create_document_source(conn, "shared", embedding_model=embedder.model_name, embedding_dim=embedder.dim)
    rng = random.Random(11)
    batches = {
        "a": worker_records("a", 6, rng, "a_rank", vectors=False),
        "b": worker_records("b", 6, rng, "b_rank", vectors=False),
    }

    def job(prefix: str) -> Any:
        return lambda own: ingest(own, "shared", base_records(batches[prefix]), embedder, progress=False)

    assert run_threads(db_url, [job("a"), job("b")]) == []
    assert set(chunk_rows(conn, "shared")) == {f"{p}{i}" for p in "ab" for i in range(6)}
    assert field_types(conn, "shared") == {"a_rank": "int", "b_rank": "int"}
    assert_lexical_ok(conn, "shared")


def test_two_threads_create_a_new_source_on_first_use(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any
) -> None:
    rng = random.Random(12)
    batches = {p: worker_records(p, 3, rng, "rank", vectors=True) for p in "ab"}

    def job(prefix: str) -> Any:
        return lambda own: ingest(own, "born", base_records(batches[prefix]), embedder, progress=False)

    assert run_threads(db_url, [job("a"), job("b")]) == []
    assert conn.execute("select count(*) from agentdb.sources where name = 'born'").fetchone() == (1,)
    assert len(chunk_rows(conn, "born")) == 6
    assert_lexical_ok(conn, "born")


@pytest.mark.parametrize("layout", ["rows", "blocks"])
def test_concurrent_replacing_ingestions_keep_term_counts(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any, layout: Literal["rows", "blocks"]
) -> None:
    """Many small transactions over a shared vocabulary, each replacing the thread's previous documents:
    the term_stats upserts and decrements of both threads interleave without deadlock or lost counts (with
    block postings, a fourth thread merges the blocks meanwhile)."""
    create_document_source(
        conn, "busy", embedding_model=embedder.model_name, embedding_dim=embedder.dim, lexical_layout=layout
    )

    def job(prefix: str, seed: int) -> Any:
        def run(own: psycopg.Connection[Any]) -> None:
            rng = random.Random(seed)
            for _ in range(12):
                ingest(
                    own,
                    "busy",
                    base_records(worker_records(prefix, 4, rng, "n", vectors=True)),
                    None,
                    progress=False,
                )

        return run

    def merge(own: psycopg.Connection[Any]) -> None:
        for _ in range(12):
            optimize_source(own, "busy")

    jobs = [job("a", 1), job("b", 2), job("c", 3)] + ([merge] if layout == "blocks" else [])
    assert run_threads(db_url, jobs) == []
    assert len(chunk_rows(conn, "busy")) == 12
    assert_lexical_ok(conn, "busy")


def test_tokenizer_and_model_can_be_used_from_two_threads(embedder: Any) -> None:
    """Chunking (token spans) in one ingestion while another embeds: the shared fast tokenizer must not
    have its padding settings changed under the model."""
    text = next(r for r in fixture_records() if r["_id"] == LONG_ID)["text"]
    expected_spans = embedder.token_spans(text)
    errors: list[BaseException] = []
    done = threading.Event()

    def spans() -> None:
        try:
            while not done.is_set():
                assert embedder.token_spans(text) == expected_spans
                time.sleep(0)  # let the other thread take the lock too
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)

    thread = threading.Thread(target=spans)
    thread.start()
    try:
        for _ in range(12):
            embedder.embed(["short", "a longer text, to pad the batch"])
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        done.set()
        thread.join()
    assert errors == []


def test_add_fields_merges_with_fields_added_meanwhile(conn: psycopg.Connection[Any], db_url: str) -> None:
    create_document_source(
        conn, "merge", embedding_model="m", embedding_dim=3, fields=[FieldSpec(name="year", type="int")]
    )
    with psycopg.connect(db_url, autocommit=True) as other:
        seen_here, seen_there = get_source(conn, "merge"), get_source(other, "merge")
        add_fields(conn, seen_here, [FieldSpec(name="lang", type="string")])
        merged = add_fields(other, seen_there, [FieldSpec(name="score", type="float")])
        assert [f.name for f in merged.fields] == ["year", "lang", "score"]
        with pytest.raises(StorageContentError) as caught:
            add_fields(other, seen_there, [FieldSpec(name="lang", type="int")])
        assert caught.value.path == "fields.lang"
    assert field_types(conn, "merge") == {"year": "int", "lang": "string", "score": "float"}


# chunk_text ------------------------------------------------------------------------------------------------


def words(text: str) -> list[tuple[int, int]]:
    """A fake tokenizer: one token per run of non-space characters."""
    return [m.span() for m in re.finditer(r"\S+", text)]


def numbered(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_chunk_text_empty_and_short_texts_are_one_chunk() -> None:
    assert chunk_text("", words, 4, 1) == [""]
    assert chunk_text("   ", words, 4, 1) == ["   "]
    exactly = "  w0 w1  w2 w3 "
    assert chunk_text(exactly, words, 4, 1) == [exactly]  # exactly `size` tokens: the text, untrimmed


def test_chunk_text_one_token_over_size() -> None:
    assert chunk_text(numbered(5), words, 4, 1) == ["w0 w1 w2 w3", "w3 w4"]
    assert chunk_text(numbered(5), words, 4, 0) == ["w0 w1 w2 w3", "w4"]
    assert chunk_text(numbered(33), words, 32, 8) == [numbered(32), " ".join(f"w{i}" for i in range(24, 33))]


def test_chunk_text_windows_overlap_and_cover_everything() -> None:
    for n in range(0, 40):
        for size in (1, 2, 3, 5, 8):
            for overlap in range(size):
                text = numbered(n)
                chunks = chunk_text(text, words, size, overlap)
                tokens = [c.split() for c in chunks]
                if n <= size:
                    assert chunks == [text]
                    continue
                step = size - overlap
                assert all(len(t) <= size for t in tokens)
                assert all(c in text for c in chunks)
                for before, after in zip(tokens, tokens[1:], strict=False):
                    assert before[-overlap:] == after[:overlap] if overlap else True
                    assert int(after[0][1:]) - int(before[0][1:]) == step
                assert tokens[0][0] == "w0" and tokens[-1][-1] == f"w{n - 1}"
                assert len(tokens[-1]) > overlap  # the last window adds something new
                covered = {t for chunk in tokens for t in chunk}
                assert covered == {f"w{i}" for i in range(n)}


def test_chunk_text_keeps_the_original_characters_between_tokens() -> None:
    text = "alpha,\tbeta\n\ngamma  delta épsilon"
    assert chunk_text(text, words, 2, 1) == ["alpha,\tbeta", "beta\n\ngamma", "gamma  delta", "delta épsilon"]


def test_chunk_text_rejects_overlap_not_below_size() -> None:
    with pytest.raises(ValueError):
        chunk_text("a b c", words, 2, 2)


# Errors from the reader ------------------------------------------------------------------------------------------


def test_unknown_files_and_types(tmp_path: Path) -> None:
    with pytest.raises(AgentDBError) as missing:
        list(read_records(tmp_path / "nope.jsonl"))
    assert missing.value.code == 3010
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(StorageContentError):
        list(read_records(tmp_path / "x.txt"))


def test_field_map_renames_and_excludes(conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "mapped.jsonl",
        [
            {
                "key": "k1",
                "heading": "Heading",
                "body": "the body text",
                "secret": "s",
                "year": 2000,
                "doc_id": "x",
            },
        ],
    )
    mapping = FieldMap(id_field="key", title_field="heading", text_field="body", exclude=("secret", "doc_id"))
    ingest(conn, "mapped", read_records(path), embedder, mapping=mapping, progress=False)
    row = chunk_rows(conn, "mapped")["k1"][0]
    assert (row["title"], row["text"], row["metadata"]) == ("Heading", "the body text", {"year": 2000})
