"""Quality and correctness gates on SciFact (BEIR test split), real Postgres and the real model.

The corpus is ingested once per session (about 5 minutes of CPU embedding the first time; later sessions of
the clone read the chunk vectors from .agentdb/embeddings) with one synthetic metadata
field, `bucket` = a stable hash of the id modulo 20, so that `{"bucket": 7}` passes about 5% of rows.
"""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import psycopg
import pytest
from conftest import EMBED_CACHE, TEMPLATE, scifact_path
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agentdb.db.pool import configure
from agentdb.embed_cache import CachedEmbedder, cache_path
from agentdb.evaluation import evaluate, load_qrels, load_queries
from agentdb.ingest.pipeline import ingest
from agentdb.ingest.readers import Located, read_records
from agentdb.retrieval import retrieve

pytestmark = [pytest.mark.corpus, pytest.mark.scifact_vectors]

SOURCE = "scifact"


def bucket(doc_id: str) -> int:
    return zlib.crc32(doc_id.encode()) % 20


@pytest.fixture(scope="session")
def scifact(server_url: str, template_url: str, embedder: Any) -> Iterator[psycopg.Connection[Any]]:
    root = scifact_path()
    name = "agentdb_test_scifact"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
        admin.execute(
            sql.SQL("create database {} template {}").format(sql.Identifier(name), sql.Identifier(TEMPLATE))
        )
    with psycopg.connect(make_conninfo(server_url, dbname=name), autocommit=True) as conn:
        configure(conn)

        def records() -> Iterator[Located]:
            for located in read_records(root / "corpus.jsonl.gz"):
                record = {**located.record, "bucket": bucket(str(located.record["_id"]))}
                yield Located(located.file, located.line, record)

        # The chunk vectors come from the clone's cache when an earlier run (the other lexical path's, or
        # the bench's) embedded them with this model, backend and code (agentdb/embed_cache.py).
        cached = CachedEmbedder(embedder, cache_path(EMBED_CACHE, embedder, root / "corpus.jsonl.gz"))
        report = ingest(conn, SOURCE, records(), cached, progress=False)
        cached.save()
        print(f"SciFact chunk embeddings: {cached.hits} from {cached.path}, {cached.misses} computed")
        assert report.documents == 5183
        yield conn


@pytest.fixture(scope="session")
def judged(embedder: Any) -> tuple[dict[str, str], dict[str, dict[str, int]], dict[str, np.ndarray]]:
    root = scifact_path()
    queries = load_queries(root / "queries.jsonl")
    qrels = load_qrels(root / "qrels" / "test.tsv")
    texts = list(queries.values())
    vectors = dict(zip(texts, embedder.embed(texts), strict=True))
    return queries, qrels, vectors


def _quality(conn: Any, judged: Any, mode: str) -> tuple[float, float]:
    queries, qrels, vectors = judged

    def search(text: str) -> list[tuple[str, float]]:
        vector = None if mode == "lexical" else vectors[text]
        hits = retrieve(
            conn, SOURCE, text, mode=mode, top_k=100, threshold=0, group_by_doc=True, query_embedding=vector
        )
        return [(h.id, h.score) for h in hits.hits]

    result = evaluate(search, queries, qrels, progress=False)
    return result.ndcg10, result.recall100


@pytest.mark.parametrize(("mode", "floor"), [("lexical", 0.68), ("dense", 0.64), ("hybrid", 0.71)])
def test_ndcg_floor(scifact: Any, judged: Any, mode: str, floor: float) -> None:
    ndcg, recall = _quality(scifact, judged, mode)
    print(f"{mode}: nDCG@10 {ndcg:.4f} Recall@100 {recall:.4f}")
    assert ndcg >= floor
    assert recall >= 0.85


def _tsvector_counts(text: str) -> Counter[str]:
    """Parse a tsvector's text form ('lexeme':1,4 'other':2) into lexeme -> number of positions."""
    counts: Counter[str] = Counter()
    for match in __import__("re").finditer(r"'((?:[^']|'')*)'(?::([0-9A-D,]+))?", text):
        counts[match.group(1).replace("''", "'")] = len(match.group(2).split(",")) if match.group(2) else 1
    return counts


def test_bm25_equals_an_independent_reference(scifact: Any, judged: Any) -> None:
    """Scores from the postings equal Okapi BM25 computed in Python from the raw tsvectors, to 1e-6; a query
    term's weight is multiplied by how often the query says it (its positions in the query's tsvector)."""
    rows = scifact.execute("select doc_id, chunk, agentdb_tsv::text from agentdb_docs.scifact").fetchall()
    docs = {(d, c): _tsvector_counts(t) for d, c, t in rows}
    n = len(docs)
    avgdl = sum(sum(c.values()) for c in docs.values()) / n
    df: Counter[str] = Counter()
    for counts in docs.values():
        df.update(counts.keys())
    k1, b = 1.2, 0.75
    rng = random.Random(7)
    queries = rng.sample(list(judged[0].values()), 25) + [
        'p53 !!! (tumour) "suppressor": & | <-> \' ;--',
        "ß ü 中文 cell",
    ]
    for text in queries:
        row = scifact.execute("select to_tsvector('english', %s)::text", (text,)).fetchone()
        assert row is not None
        qtf = _tsvector_counts(row[0])
        expected = {}
        for key, counts in docs.items():
            score = 0.0
            dl = sum(counts.values())
            for term in qtf.keys() & counts.keys():
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                tf = counts[term]
                score += qtf[term] * idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
            if score > 0:
                expected[key] = score
        hits = retrieve(scifact, SOURCE, text, mode="lexical", top_k=50).hits
        assert len(hits) == min(50, len(expected))
        for hit in hits:
            assert hit.bm25_score == pytest.approx(expected[(hit.id, hit.chunk)], abs=1e-6)
        best = sorted(expected.values(), reverse=True)[: len(hits)]
        assert [h.bm25_score for h in hits] == pytest.approx(best, abs=1e-6)


@pytest.mark.parametrize("seed_postings", [1, 300, 3000])
def test_pruned_lexical_leg_equals_the_full_sum(scifact: Any, judged: Any, seed_postings: int) -> None:
    """MaxScore pruning (forced on this small corpus by a small seed budget) returns exactly what summing every
    posting returns: the same chunks, scores and order, with and without filters, in each mode that has a
    lexical leg, for the top_k and for the larger candidate pool that hybrid and group_by_doc fetch."""
    queries = list(judged[0].values())[:40]
    filters: list[dict[str, Any] | None] = [None, {"bucket": {"$in": [1, 2, 3, 4]}}, {"bucket": 7}]

    def run(budget: int) -> list[list[tuple[str, int, float | None, int | None]]]:
        scifact.execute(f"set agentdb.lexical_seed_postings = {budget}")
        try:
            out = []
            for text in queries:
                for flt in filters:
                    for mode, group in (("lexical", False), ("lexical", True), ("hybrid", False)):
                        hits = retrieve(
                            scifact,
                            SOURCE,
                            text,
                            mode=mode,
                            top_k=10,
                            threshold=0,
                            filter=flt,
                            group_by_doc=group,
                            query_embedding=judged[2][text] if mode == "hybrid" else None,
                        ).hits
                        out.append([(h.id, h.chunk, h.bm25_score, h.rank_sparse) for h in hits])
            return out
        finally:
            scifact.execute("reset agentdb.lexical_seed_postings")

    full, pruned = run(10**12), run(seed_postings)
    assert len(full) == len(pruned) == 40 * 3 * 3
    for expected, got in zip(full, pruned, strict=True):
        assert [h[:2] + h[3:] for h in got] == [h[:2] + h[3:] for h in expected]
        assert [h[2] for h in got] == pytest.approx([h[2] for h in expected], abs=1e-9)


def test_hnsw_recall_against_exact_search(scifact: Any, judged: Any) -> None:
    rows = scifact.execute("select doc_id, chunk, agentdb_embedding from agentdb_docs.scifact").fetchall()
    keys = [(d, c) for d, c, _ in rows]
    matrix = np.stack([v.to_numpy() for _, _, v in rows]).astype(np.float32)
    vectors = list(judged[2].values())[:100]
    found = 0
    for vector in vectors:
        exact = np.argsort(-(matrix @ vector))[:10]
        hits = retrieve(
            scifact, SOURCE, "q", mode="dense", top_k=10, threshold=0, query_embedding=vector
        ).hits
        found += len({keys[i] for i in exact} & {(h.id, h.chunk) for h in hits})
    recall = found / (10 * len(vectors))
    print(f"HNSW recall@10 vs exact: {recall:.4f}")
    assert recall >= 0.98


def test_deep_pages_keep_hnsw_recall(scifact: Any, judged: Any) -> None:
    """Top 400 from the index (the iterative scan past ef_search, the index forced over an exact scan) against
    exact search: deep result pages lose nothing that matters."""
    rows = scifact.execute("select doc_id, chunk, agentdb_embedding from agentdb_docs.scifact").fetchall()
    keys = [(d, c) for d, c, _ in rows]
    matrix = np.stack([v.to_numpy() for _, _, v in rows]).astype(np.float32)
    found = total = 0
    for vector in list(judged[2].values())[:30]:
        exact = {keys[i] for i in np.argsort(-(matrix @ vector))[:400]}
        hits = retrieve(
            scifact, SOURCE, "q", mode="dense", top_k=400, threshold=0, query_embedding=vector
        ).hits
        assert len(hits) == 400
        found += len(exact & {(h.id, h.chunk) for h in hits})
        total += 400
    print(f"HNSW recall@400 vs exact: {found / total:.4f}")
    assert found / total >= 0.97


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_selective_filter_still_returns_top_k(scifact: Any, judged: Any, mode: str) -> None:
    """About 5% of rows pass; every leg must still fill top_k (iterative scan, filter before the limit)."""
    passing = scifact.execute(
        "select count(*) from agentdb_docs.scifact where (metadata->>'bucket')::int = 7"
    ).fetchone()[0]
    assert 0.03 * 8993 < passing < 0.08 * 9100
    for text in list(judged[0].values())[:20]:
        result = retrieve(
            scifact,
            SOURCE,
            text + " cell",
            mode=mode,
            top_k=20,
            threshold=0,
            filter={"bucket": 7},
            query_embedding=None if mode == "lexical" else judged[2][text],
        )
        assert len(result.hits) == 20
        assert all(h.metadata["bucket"] == 7 for h in result.hits)


def test_threshold_semantics_per_mode(scifact: Any, judged: Any) -> None:
    text = next(iter(judged[0].values()))
    vector = judged[2][text]
    dense = retrieve(scifact, SOURCE, text, mode="dense", top_k=50, threshold=0.45, query_embedding=vector)
    assert all(h.distance is not None and h.distance <= 0.45 for h in dense.hits)
    p = dense.diagnostics["parameters"]
    assert (
        p["raw_result_count"] == 50 and p["filtered_count"] == 50 - len(dense.hits) and p["threshold"] == 0.45
    )
    lexical = retrieve(scifact, SOURCE, text, mode="lexical", top_k=10, threshold=0.01)
    assert len(lexical.hits) == 10 and all(h.distance is None for h in lexical.hits)
    assert lexical.diagnostics["parameters"]["filtered_count"] == 0
    hybrid = retrieve(scifact, SOURCE, text, mode="hybrid", top_k=30, threshold=0.3, query_embedding=vector)
    hp = hybrid.diagnostics["parameters"]
    assert hp["dense_filtered_count"] > 0
    assert any(
        h.distance is None and h.rank_sparse is not None for h in hybrid.hits
    )  # BM25-only pass ungated
    assert all(h.distance is None or h.distance <= 0.3 for h in hybrid.hits)
    unlimited = retrieve(scifact, SOURCE, text, mode="dense", top_k=5, threshold=0, query_embedding=vector)
    assert unlimited.diagnostics["parameters"]["threshold"] == "inf"


def test_rrf_scores_and_deterministic_order(scifact: Any, judged: Any) -> None:
    text = list(judged[0].values())[3]
    vector = judged[2][text]
    first = retrieve(
        scifact, SOURCE, text, mode="hybrid", top_k=40, threshold=0, rrf_k=10, query_embedding=vector
    )
    again = retrieve(
        scifact, SOURCE, text, mode="hybrid", top_k=40, threshold=0, rrf_k=10, query_embedding=vector
    )
    assert first.hits == again.hits
    for hit in first.hits:
        expected = sum(1 / (10 + r) for r in (hit.rank_dense, hit.rank_sparse) if r is not None)
        assert hit.score == pytest.approx(expected, abs=1e-12)
    order = [(-h.score, h.id, h.chunk) for h in first.hits]
    assert order == sorted(order)
    assert [h.rank for h in first.hits] == list(range(1, 41))


def test_rrf_scores_are_exact_and_equal_sums_tie(scifact: Any, judged: Any) -> None:
    """Each RRF score is the correctly rounded value of the exact sum, so mathematically equal sums are equal
    floats and tie by document and chunk (at k 60, ranks 57 and 330 sum to exactly 1/90, the score of rank 30
    alone; adding the two separately rounded terms tells them apart)."""
    exact_ties = 0
    for text in judged[0].values():
        result = retrieve(
            scifact,
            SOURCE,
            text,
            mode="hybrid",
            top_k=100,
            threshold=0,
            group_by_doc=True,
            query_embedding=judged[2][text],
        )
        exact = [
            sum(Fraction(1, 60 + r) for r in (hit.rank_dense, hit.rank_sparse) if r is not None)
            for hit in result.hits
        ]
        assert [hit.score for hit in result.hits] == [float(x) for x in exact]
        order = [(-x, hit.id, hit.chunk) for x, hit in zip(exact, result.hits, strict=True)]
        assert order == sorted(order)
        exact_ties += sum(
            1
            for a, b, x, y in zip(result.hits, result.hits[1:], exact, exact[1:], strict=False)
            if x == y and {a.rank_dense, a.rank_sparse, None} != {b.rank_dense, b.rank_sparse, None}
        )
    # The property is exercised: some pages hold equal sums from different pairs of ranks. Every judged query is
    # asked: the dense ranks come from an HNSW graph whose build is not repeatable (pgvector draws each node's
    # level at random): in one run of 2026-12-05 the first 60 queries held no such tie; all 300 held 25 and 28 in
    # the next two.
    assert exact_ties > 0


def test_sql_functions_equal_the_python_api(scifact: Any, judged: Any) -> None:
    text = list(judged[0].values())[5]
    vector = judged[2][text]
    for mode in ("dense", "lexical", "hybrid"):
        api = retrieve(
            scifact,
            SOURCE,
            text,
            mode=mode,
            top_k=15,
            filter={"bucket": {"$lt": 10}},
            query_embedding=None if mode == "lexical" else vector,
        )
        rows = scifact.execute(
            "select id, chunk, rank, score, distance, bm25_score, rank_dense, rank_sparse, text, metadata"
            " from agentdb.search(%s, %s, %s, %s, 15, 60, 0.5, %s)",
            (
                SOURCE,
                text,
                None if mode == "lexical" else vector,
                mode,
                psycopg.types.json.Jsonb({"bucket": {"$lt": 10}}),
            ),
        ).fetchall()
        assert rows == [
            (
                h.id,
                h.chunk,
                h.rank,
                h.score,
                h.distance,
                h.bm25_score,
                h.rank_dense,
                h.rank_sparse,
                h.text,
                h.metadata,
            )
            for h in api.hits
        ]
    doc = api.hits[0].id
    similar = scifact.execute("select id, distance from agentdb.similar(%s, %s, 5)", (SOURCE, doc)).fetchall()
    assert len(similar) == 5 and doc not in {r[0] for r in similar}
    assert [r[1] for r in similar] == sorted(r[1] for r in similar)
