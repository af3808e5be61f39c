"""Knowledge packs: export and import against a real PostgreSQL, the real model and the shipped demo pack."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson
import psycopg
import pytest

from agentdb.errors import StorageContentError, StorageKindMismatch
from agentdb.ingest.chunking import chunk_text
from agentdb.ingest.pipeline import _embedding_input, ingest
from agentdb.ingest.readers import read_records
from agentdb.pack import MANIFEST_KEY, export_pack, import_pack, read_manifest, read_rows
from agentdb.resources import DEMO, DEMO_CORPUS, DEMO_PACK, resource_path
from agentdb.retrieval import retrieve
from agentdb.sources import create_document_source, get_source, list_sources

MODEL = "all-MiniLM-L6-v2"
AGENTDB = [sys.executable, "-m", "agentdb.cli"]
RECORDS = [
    {
        "_id": "wal",
        "title": "Write-ahead log",
        "text": "The write-ahead log records every change before it reaches the data files. After a crash the "
        "server replays the log from the last checkpoint, so committed transactions survive. Archiving the "
        "segments elsewhere makes point-in-time recovery possible.",
        "year": 2019,
        "score": 0.5,
        "reviewed": True,
        "tags": ["wal", "durability"],
        "updated": "2024-05-01T10:00:00+00:00",
    },
    {
        "_id": "vacuum",
        "title": "Vacuum",
        "text": "Vacuum reclaims the storage occupied by dead tuples. Autovacuum runs it in the background when "
        "enough rows changed, and it also refreshes the visibility map that index-only scans rely on.",
        "year": 2021,
        "score": 2.25,
        "reviewed": False,
        "tags": ["maintenance"],
    },
    {
        "_id": "index",
        "title": "B-tree indexes",
        "text": "A B-tree index keeps keys in sorted order for equality and range lookups.",
        "year": 2018,
        "lang": "de",
    },
    {
        "_id": "planner",
        "title": "",
        "text": "The planner estimates the cost of each plan from table statistics and picks the cheapest one; "
        "ANALYZE collects those statistics, and stale ones lead to bad plans for large tables.",
        "year": 2022,
        "tags": ["planner", "statistics"],
    },
]
QUERIES = ["crash recovery from the log", "dead tuples storage", "sorted keys range lookup", "statistics"]


@pytest.fixture
def docs(conn: psycopg.Connection[Any], embedder: Any, tmp_path: Path) -> str:
    """A source with several chunks per document (small chunks) and metadata of every kind."""
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in RECORDS) + b"\n")
    ingest(conn, "docs", read_records(path), embedder, progress=False, chunk_size=24, chunk_overlap=6)
    return "docs"


def _rows(conn: psycopg.Connection[Any], source: str) -> list[tuple[Any, ...]]:
    table = get_source(conn, source).table.as_string(conn)
    return conn.execute(
        f"select doc_id, chunk, title, text, metadata, agentdb_embedding::real[] from {table}"  # noqa: S608 - from the registry
        " order by doc_id, chunk"
    ).fetchall()


def _hits(
    conn: psycopg.Connection[Any], source: str, embedder: Any, mode: str
) -> list[list[tuple[Any, ...]]]:
    return [
        [
            (h.id, h.chunk, h.rank, h.score, h.distance, h.bm25_score, h.text)
            for h in retrieve(conn, source, q, mode=mode, top_k=5, threshold=0, embedder=embedder).hits
        ]
        for q in QUERIES
    ]


def _schema(conn: psycopg.Connection[Any], source: str) -> dict[str, Any]:
    s = get_source(conn, source)
    return s.model_dump(exclude={"id", "name", "table_name"})


def test_float32_round_trip_is_exact(
    conn: psycopg.Connection[Any], docs: str, embedder: Any, tmp_path: Path
) -> None:
    pack = tmp_path / "docs.pack.parquet"
    manifest = export_pack(conn, docs, pack, dtype="float32", progress=False)
    original = _rows(conn, docs)
    assert len(original) > len(RECORDS)  # several chunks per document: the chunks travel, not the documents
    assert (manifest.documents, manifest.chunks) == (len(RECORDS), len(original))
    report = import_pack(conn, pack, embedding_model=MODEL, source_name="copy", progress=False)
    assert (report.documents, report.chunks) == (manifest.documents, manifest.chunks)
    assert _schema(conn, "copy") == _schema(conn, docs)
    # The pack says which backend embedded the vectors, and the imported source keeps it.
    assert manifest.embedding.backends == get_source(conn, "copy").embedding_backends == [embedder.backend]
    assert _rows(conn, "copy") == original
    for mode in ("lexical", "dense", "hybrid"):
        assert _hits(conn, "copy", embedder, mode) == _hits(conn, docs, embedder, mode), mode
    checked = conn.execute("select what, mismatches from agentdb.lexical_check('copy')").fetchall()
    assert checked and all(n == 0 for _, n in checked)


def test_float16_pack_keeps_rows_and_rankings(
    conn: psycopg.Connection[Any], docs: str, embedder: Any, tmp_path: Path
) -> None:
    """float16 vectors are the originals rounded to half precision; everything else is exact, and the
    rankings do not move on this corpus."""
    pack = tmp_path / "docs.pack.parquet"
    export_pack(conn, docs, pack, progress=False)
    assert read_manifest(pack).embedding.dtype == "float16"
    import_pack(conn, pack, embedding_model=MODEL, source_name="half", progress=False)
    original, imported = _rows(conn, docs), _rows(conn, "half")
    assert [r[:5] for r in imported] == [r[:5] for r in original]
    for a, b in zip(original, imported, strict=True):
        assert np.array_equal(
            np.asarray(a[5], dtype=np.float32).astype(np.float16).astype(np.float32),
            np.asarray(b[5], dtype=np.float32),
        )
    assert _hits(conn, "half", embedder, "lexical") == _hits(conn, docs, embedder, "lexical")
    for mode in ("dense", "hybrid"):
        here, there = _hits(conn, "half", embedder, mode), _hits(conn, docs, embedder, mode)
        assert [[h[:3] for h in q] for q in here] == [[h[:3] for h in q] for q in there], mode
        for q_here, q_there in zip(here, there, strict=True):
            for h, g in zip(q_here, q_there, strict=True):
                if h[4] is not None:
                    assert h[4] == pytest.approx(g[4], abs=1e-3)


def test_the_manifest_describes_the_source(conn: psycopg.Connection[Any], docs: str, tmp_path: Path) -> None:
    pack = tmp_path / "docs.pack.parquet"
    export_pack(conn, docs, pack, progress=False)
    with duckdb.connect() as duck:
        raw = duck.execute(
            "select value from parquet_kv_metadata(?) where decode(key) = ?", [str(pack), MANIFEST_KEY]
        ).fetchone()
        columns = duck.execute("describe select * from read_parquet(?)", [str(pack)]).fetchall()
    assert raw is not None
    manifest = orjson.loads(raw[0])
    source = get_source(conn, docs)
    assert manifest["source"] == {
        "name": "docs",
        "fields": [f.model_dump() for f in source.fields],
        "chunk_size": 24,
        "chunk_overlap": 6,
        "ts_config": source.ts_config,
        "bm25_k1": source.bm25_k1,
        "bm25_b": source.bm25_b,
    }
    assert {f["name"]: f["type"] for f in manifest["source"]["fields"]} == {
        "year": "int",
        "score": "float",
        "reviewed": "bool",
        "tags": "string_set",
        "updated": "timestamp",  # an ISO-8601 string in JSON Lines
        "lang": "string",
    }
    assert manifest["embedding"]["model"] == MODEL and manifest["embedding"]["dim"] == 384
    assert manifest["indexes"] == []
    assert [(c[0], c[1]) for c in columns] == [
        ("doc_id", "VARCHAR"),
        ("chunk", "INTEGER"),
        ("title", "VARCHAR"),
        ("text", "VARCHAR"),
        ("metadata", "VARCHAR"),
        ("embedding", "BLOB"),
    ]


def test_a_pack_of_another_model_is_8003_and_writes_nothing(
    conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    create_document_source(conn, "other", embedding_model="other-model", embedding_dim=3)
    data = tmp_path / "other.jsonl"
    data.write_text(
        '{"_id": "a", "text": "alpha", "embedding": [1, 0, 0]}\n{"_id": "b", "text": "beta", "embedding": [0, 1, 0]}\n'
    )
    ingest(conn, "other", read_records(data), None, progress=False)
    pack = tmp_path / "other.pack.parquet"
    export_pack(conn, "other", pack, progress=False)
    before = [s.name for s in list_sources(conn)]
    with pytest.raises(StorageContentError) as caught:
        import_pack(conn, pack, embedding_model=MODEL, source_name="other_copy", progress=False)
    assert caught.value.code == 8003 and caught.value.path == "pack.embedding.model"
    assert "'other-model'" in caught.value.message and caught.value.hint
    assert [s.name for s in list_sources(conn)] == before
    assert conn.execute("select to_regclass('agentdb_docs.other_copy')").fetchone() == (None,)


def test_an_existing_source_needs_replace(conn: psycopg.Connection[Any], docs: str, tmp_path: Path) -> None:
    pack = tmp_path / "docs.pack.parquet"
    export_pack(conn, docs, pack, progress=False)
    rows = _rows(conn, docs)
    with pytest.raises(StorageKindMismatch) as caught:
        import_pack(conn, pack, embedding_model=MODEL, progress=False)
    assert caught.value.code == 3011 and "--replace" in (caught.value.hint or "")
    assert _rows(conn, docs) == rows
    report = import_pack(conn, pack, embedding_model=MODEL, replace=True, progress=False)
    assert report.replaced and [s.name for s in list_sources(conn)] == ["docs"]
    assert [r[:5] for r in _rows(conn, docs)] == [r[:5] for r in rows]


def _tamper(pack: Path, out: Path, metadata_sql: str) -> None:
    """Copy `pack` with its metadata column rewritten by `metadata_sql`, keeping its manifest."""
    with duckdb.connect() as duck:
        manifest = duck.execute(
            "select value from parquet_kv_metadata(?) where decode(key) = ?", [str(pack), MANIFEST_KEY]
        ).fetchone()
        assert manifest is not None
        duck.execute(
            f"copy (select * replace ({metadata_sql} as metadata) from read_parquet(?)) to ?"  # noqa: S608 - test constant
            " (format parquet, kv_metadata {'agentdb.pack': ?})",
            [str(pack), str(out), manifest[0].decode()],
        )


def test_a_failed_import_leaves_nothing(conn: psycopg.Connection[Any], docs: str, tmp_path: Path) -> None:
    """A bad row near the end aborts the whole import: no new source, and a replaced one stays as it was."""
    pack = tmp_path / "docs.pack.parquet"
    export_pack(conn, docs, pack, progress=False)
    bad = tmp_path / "bad.pack.parquet"
    _tamper(pack, bad, "case when doc_id = 'wal' and chunk = 1 then '{\"year\": \"old\"}' else metadata end")
    with pytest.raises(StorageContentError) as caught:
        import_pack(conn, bad, embedding_model=MODEL, source_name="broken", progress=False)
    assert caught.value.path and caught.value.path.endswith(".metadata.year")
    assert "broken" not in {s.name for s in list_sources(conn)}
    assert conn.execute("select to_regclass('agentdb_docs.broken')").fetchone() == (None,)
    before = _rows(conn, docs)
    with pytest.raises(StorageContentError):
        import_pack(conn, bad, embedding_model=MODEL, replace=True, progress=False)
    assert _rows(conn, docs) == before
    assert all(n == 0 for _, n in conn.execute("select what, mismatches from agentdb.lexical_check('docs')"))


def test_cli_export_import_then_check(
    db_url: str, conn: psycopg.Connection[Any], docs: str, tmp_path: Path
) -> None:
    """The commands as a user runs them, without pyarrow or pandas importable (DuckDB alone reads and writes
    the Parquet); `agentdb check` finds the BM25 postings consistent after the import."""
    pack = tmp_path / "docs.pack.parquet"
    env = {**os.environ, "DATABASE_URL": db_url}
    blocked = "import sys; sys.modules['pyarrow'] = None; sys.modules['pandas'] = None; from agentdb.cli import main; "

    def agentdb(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", blocked + f"sys.exit(main({list(args)!r}))"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    exported = agentdb("pack", "export", docs, str(pack), "--no-progress")
    assert exported.returncode == 0, exported.stderr
    assert f"{len(RECORDS)} documents" in exported.stdout
    imported = agentdb("pack", "import", str(pack), "--source", "docs2", "--no-progress")
    assert imported.returncode == 0, imported.stderr
    assert f"imported {len(RECORDS)} documents" in imported.stdout
    checked = agentdb("check", "docs2")
    assert checked.returncode == 0 and "match the documents" in checked.stdout
    again = agentdb("pack", "import", str(pack), "--source", "docs2", "--no-progress")
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        "agentdb: error 3011 StorageKindMismatch: source 'docs2' already exists; nothing was imported "
        "(at source); hint: pass --replace to replace it, or --source NAME to import under another name"
    ]
    missing = agentdb("pack", "import", str(tmp_path / "nope.parquet"))
    assert missing.returncode == 2 and "3010 StorageFileNotFound" in missing.stderr


@pytest.mark.corpus
def test_the_shipped_pack_matches_the_corpus_and_the_live_model() -> None:
    """The demo pack holds every record of pgdocs.jsonl.gz; a sample of its chunks re-chunked from the corpus
    and re-embedded with the model as the pack was built (the PyTorch backend) gives the same text and,
    against the stored float16 vectors, a cosine of at least 0.999. (The int8 ONNX backend that queries it
    by default agrees with PyTorch to 0.99; tests/test_embed_backend.py.)"""
    from agentdb.embed import load_embedder

    embedder = load_embedder(backend="torch")
    with resource_path(DEMO, DEMO_CORPUS) as path, gzip.open(path, "rb") as handle:
        corpus = {r["_id"]: r for r in map(orjson.loads, handle)}
    with resource_path(DEMO, DEMO_PACK) as pack:
        manifest = read_manifest(pack)
        rows = list(read_rows(pack, manifest))
    assert manifest.documents == len(corpus)
    assert manifest.embedding.model == embedder.model_name and manifest.embedding.dim == embedder.dim
    assert len(rows) == manifest.chunks and {r.doc_id for r in rows} == set(corpus)
    sample = [rows[i] for i in np.random.default_rng(20240501).choice(len(rows), size=50, replace=False)]
    for row in sample:
        record = corpus[row.doc_id]
        pieces = chunk_text(
            record["text"], embedder.token_spans, manifest.source.chunk_size, manifest.source.chunk_overlap
        )
        assert row.text == pieces[row.chunk] and row.title == record["title"]
    live = embedder.embed([_embedding_input(r.title, r.text) for r in sample])
    stored = np.stack([r.embedding for r in sample])
    cosine = np.sum(live * stored, axis=1) / (np.linalg.norm(live, axis=1) * np.linalg.norm(stored, axis=1))
    print(f"cosine over {len(sample)} sampled chunks: min {cosine.min():.6f}, mean {cosine.mean():.6f}")
    assert cosine.min() >= 0.999
