"""`agentdb sources --similarity` (agentdb/similarity.py): the top-1 cosine similarities short probes get,
computed in SQL, equal an exact numpy computation over the same probes and stored vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psycopg
from test_cli import run

from agentdb.db.pool import configure
from agentdb.ingest.pipeline import ingest
from agentdb.ingest.readers import Located
from agentdb.similarity import PROBE_WORDS, probe_text, similarity_profile
from agentdb.sources import get_source

# Titled and untitled documents, so that both kinds of probe are sampled.
DOCS = [
    ("wal", "Write-ahead logging", "WAL archiving copies segment files to a safe place. Restore reads them."),
    ("vacuum", "Vacuum", "VACUUM reclaims storage occupied by dead tuples. Autovacuum runs it."),
    ("btree", "B-tree indexes", "A B-tree index speeds up equality and range queries on sortable data."),
    ("gin", "", "GIN indexes serve full text search and jsonb containment. They are slower to update."),
    ("hot", "Hot standby", "A hot standby answers read-only queries while it replays the primary's WAL."),
    (
        "ckpt",
        "",
        "A checkpoint flushes every dirty buffer to disk and writes a checkpoint record to the log.",
    ),
    ("locks", "Explicit locking", "LOCK TABLE takes a table-level lock; SELECT FOR UPDATE locks rows."),
    ("bread", "", "Knead the dough for ten minutes, let it rise for an hour, then bake it at 220 degrees."),
    ("soup", "Tomato soup", "Simmer tomatoes with onion and garlic, then blend until smooth and season."),
    ("tz", "", "Timestamps with time zone are stored in UTC and shown in the session's time zone."),
]


def _load(conn: psycopg.Connection[Any], embedder: Any) -> None:
    records = [
        Located(Path("docs.jsonl"), i + 1, {"_id": d, **({"title": t} if t else {}), "text": x})
        for i, (d, t, x) in enumerate(DOCS)
    ]
    ingest(conn, "notes", records, embedder, progress=False)


def test_probe_is_the_title_else_the_first_sentence_cut_short() -> None:
    assert probe_text("  Vacuum ", "ignored. text") == ("Vacuum", "title")
    assert probe_text(None, "First one here. Second.") == ("First one here.", "sentence")
    long = " ".join(f"w{i}" for i in range(30)) + ". Next."
    assert probe_text("", long) == (" ".join(f"w{i}" for i in range(PROBE_WORDS)), "sentence")


def test_the_profile_equals_exact_numpy_over_the_same_probes(
    conn: psycopg.Connection[Any], embedder: Any
) -> None:
    _load(conn, embedder)
    source = get_source(conn, "notes")
    profile = similarity_profile(conn, source, embedder, sample=8)
    assert profile is not None and profile.embedded == len(DOCS)
    assert len(profile.probes) == 8 and len(set(profile.chunk_ids)) == 8
    assert set(profile.kinds) == {"title", "sentence"}
    # The exact computation: every stored vector, the probe's own chunk left out, cosine in numpy.
    rows = conn.execute(
        "select agentdb_chunk_id, title, text, agentdb_embedding from agentdb_docs.notes"
    ).fetchall()
    by_id = {r[0]: r for r in rows}
    assert profile.probes == [probe_text(by_id[c][1], by_id[c][2])[0] for c in profile.chunk_ids]
    ids = np.array([r[0] for r in rows])
    stored = np.array([np.asarray(r[3].to_numpy(), dtype=np.float64) for r in rows])
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    queries = np.asarray(embedder.embed(profile.probes), dtype=np.float64)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = []
    for chunk_id, q in zip(profile.chunk_ids, queries, strict=True):
        sims = stored @ q
        sims[ids == chunk_id] = -np.inf
        exact.append(float(sims.max()))
    np.testing.assert_allclose(profile.top1, exact, atol=1e-5)
    for p in (10, 50, 90):
        assert abs(profile.percentile(p) - float(np.percentile(exact, p))) < 1e-5
    distances = 1 - np.array(exact)
    for threshold in (0.3, 0.5, 0.7):
        assert profile.kept_at(threshold) == int((distances <= threshold).sum())
    assert profile.kept_at(0) == 8


def test_sources_similarity_on_the_command_line(db_url: str, embedder: Any) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        configure(conn)
        _load(conn, embedder)
    listed = orjson.loads(run(["sources", "--json", "--similarity", "6"], db_url).stdout)
    similarity = listed[0]["similarity"]
    assert similarity["probes"] == 6 and similarity["embedded_chunks"] == len(DOCS)
    assert similarity["p10"] <= similarity["median"] <= similarity["p90"]
    text = run(["sources", "--similarity", "6"], db_url).stdout
    assert f"median {similarity['median']:.3f}" in text and "threshold 0.5 (max distance) keeps" in text
    # Without the option the listing measures nothing, and says how to.
    plain = run(["sources"], db_url)
    assert "median" not in plain.stdout and "agentdb sources --similarity" in plain.stderr
