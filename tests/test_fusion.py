"""Hybrid fusion beyond RRF: the convex combination of min-max normalised leg scores (sql/040_retrieve.sql).

The reference is computed in Python from the legs' own raw scores (cosine distance, BM25), as agentdb.retrieve
returns them in dense and lexical mode with the same candidate depth, filters, threshold and row filter; the
SQL function's convex scores must equal it (to 1e-9) and rank the same top k. Filters and row filters apply
as with RRF, and bad `fusion` / `alpha` values are 3007 with their path in every door.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from agentdb.api import create_app
from agentdb.auth import create_principal, principal_scope
from agentdb.cli import main as cli_main
from agentdb.config import Settings
from agentdb.errors import InvalidParamValue
from agentdb.retrieval import Hit, retrieve
from agentdb.sources import FieldSpec, create_document_source
from tests.filter_oracle import filters, matches, sample_metadata

DIM = 8
FIELDS = [
    FieldSpec(name="year", type="int"),
    FieldSpec(name="status", type="string"),
    FieldSpec(name="tags", type="string_set"),
]
FIELD_DICTS = [f.model_dump() for f in FIELDS]
WORDS = ["wal", "archive", "vacuum", "index", "replica", "backup", "query", "lock", "tuple", "snapshot"]
N_DOCS = 50
DOC_IDS = [f"d{i:02d}" for i in range(N_DOCS)]
Key = tuple[str, int]
_names = itertools.count()
pytestmark = pytest.mark.usefixtures("drop_principals")  # every test: principals outlive its database


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


@pytest.fixture
def corpus(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    """Source `docs`: 50 documents of one to three chunks (about 100 chunks), random words (some chunks share
    their text, so BM25 ties occur), random unit vectors (every seventh chunk has none), random metadata.
    Returns the metadata by document id."""
    create_document_source(conn, "docs", embedding_model="m", embedding_dim=DIM, fields=FIELDS)
    rng = random.Random(7)
    nprng = np.random.default_rng(7)
    meta = {doc_id: sample_metadata(FIELD_DICTS, rng) for doc_id in DOC_IDS}
    rows = []
    n = 0
    for doc_id in DOC_IDS:
        for chunk in range(rng.randint(1, 3)):
            n += 1
            rows.append(
                (
                    doc_id,
                    chunk,
                    f"title {doc_id}",
                    " ".join(rng.choices(WORDS, k=rng.randint(2, 6))),
                    Jsonb(meta[doc_id]),
                    None if n % 7 == 0 else _unit(nprng),
                )
            )
    with conn.cursor() as cur:
        cur.executemany(
            "insert into agentdb_docs.docs (doc_id, chunk, title, text, metadata, agentdb_embedding)"
            " values (%s, %s, %s, %s, %s, %s)",
            rows,
        )
    return meta


def _key(hit: Hit) -> Key:
    return (hit.id, hit.chunk)


def convex_reference(
    dense: dict[Key, float], sparse: dict[Key, float], alpha: float
) -> list[tuple[Key, float]]:
    """The convex fusion of two legs, each given as raw scores of its whole candidate pool (cosine distance,
    BM25): alpha x BM25 + (1 - alpha) x cosine similarity, each min-max normalised over its pool (all equal:
    1), 0 for a leg a chunk is absent from; best first, ties by (document id, chunk)."""

    def normalised(scores: dict[Key, float]) -> dict[Key, float]:
        if not scores:
            return {}
        lo, hi = min(scores.values()), max(scores.values())
        return {k: (v - lo) / (hi - lo) if hi > lo else 1.0 for k, v in scores.items()}

    similarity = normalised({k: 1.0 - d for k, d in dense.items()})
    bm25 = normalised(sparse)
    fused = {
        k: alpha * bm25.get(k, 0.0) + (1 - alpha) * similarity.get(k, 0.0)
        for k in dense.keys() | sparse.keys()
    }
    return sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))


def _legs(
    conn: psycopg.Connection[Any], query: str, vector: np.ndarray, cand: int, **kwargs: Any
) -> tuple[dict[Key, float], dict[Key, float]]:
    """Each leg's candidate pool with its raw scores, from dense and lexical mode at depth `cand`."""
    dense = retrieve(conn, "docs", query, mode="dense", query_embedding=vector, top_k=cand, **kwargs)
    sparse = retrieve(conn, "docs", query, mode="lexical", top_k=cand, **kwargs)
    return (
        {_key(h): h.distance for h in dense.hits if h.distance is not None},
        {_key(h): h.bm25_score for h in sparse.hits if h.bm25_score is not None},
    )


def _check_against_reference(
    conn: psycopg.Connection[Any],
    query: str,
    vector: np.ndarray,
    *,
    alpha: float,
    top_k: int,
    candidates: int | None = None,
    **kwargs: Any,
) -> list[Hit]:
    """Hybrid convex from SQL against the Python reference over the single-leg pools; returns the hits."""
    cand = candidates or max(100, 4 * top_k)
    dense, sparse = _legs(conn, query, vector, cand, **kwargs)
    expected = convex_reference(dense, sparse, alpha)
    expected_score = dict(expected)
    got = retrieve(
        conn,
        "docs",
        query,
        mode="hybrid",
        fusion="convex",
        alpha=alpha,
        query_embedding=vector,
        top_k=top_k,
        candidates=candidates,
        **kwargs,
    )
    assert len(got.hits) == min(top_k, len(expected))
    for hit, (_, score) in zip(got.hits, expected, strict=False):
        # Same score at each rank, and each hit's own score is its reference score (ties may swap only
        # between equal scores, which the common tie order (document, chunk) settles the same way).
        assert hit.score == pytest.approx(score, abs=1e-9)
        assert hit.score == pytest.approx(expected_score[_key(hit)], abs=1e-9)
        # The raw leg scores reported beside the fused one are the legs' own.
        assert hit.distance == (
            None if _key(hit) not in dense else pytest.approx(dense[_key(hit)], abs=1e-12)
        )
        assert hit.bm25_score == (
            None if _key(hit) not in sparse else pytest.approx(sparse[_key(hit)], abs=1e-12)
        )
    head = expected[: len(got.hits) + 1]
    if len({round(s, 9) for _, s in head}) == len(head):  # no near-ties: the order is exactly the reference's
        assert [_key(h) for h in got.hits] == [k for k, _ in expected[: len(got.hits)]]
    return got.hits


@pytest.mark.parametrize(
    ("alpha", "threshold", "candidates"),
    [(0.5, 0.0, None), (0.3, 0.0, 20), (0.5, 0.9, None), (1.0, 0.0, 30), (0.0, 0.7, 25), (0.8, 1.1, 10)],
)
def test_convex_scores_equal_the_reference(
    conn: psycopg.Connection[Any],
    corpus: dict[str, dict[str, Any]],
    alpha: float,
    threshold: float,
    candidates: int | None,
) -> None:
    rng = random.Random(int(alpha * 10) + int(threshold * 100))
    nprng = np.random.default_rng(rng.randint(0, 2**16))
    for _ in range(6):
        query = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
        vector = _unit(nprng)
        _check_against_reference(
            conn, query, vector, alpha=alpha, top_k=10, candidates=candidates, threshold=threshold
        )


def test_the_threshold_gates_the_dense_pool_before_normalising(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]
) -> None:
    """A dense candidate beyond the threshold neither scores nor sets the range; lexical hits pass ungated."""
    vector = _unit(np.random.default_rng(3))
    hits = _check_against_reference(conn, "wal vacuum", vector, alpha=0.5, top_k=200, threshold=0.8)
    assert all(h.distance is None or h.distance <= 0.8 for h in hits)
    assert any(h.distance is None for h in hits)  # lexical-only hits (gated or vector-less) are still there
    assert max(h.score for h in hits) <= 1.0 + 1e-12


def test_rrf_stays_the_default_and_diagnostics_name_the_fusion(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]
) -> None:
    vector = _unit(np.random.default_rng(5))
    default = retrieve(conn, "docs", "wal lock", query_embedding=vector, threshold=0)
    rrf = retrieve(conn, "docs", "wal lock", query_embedding=vector, threshold=0, fusion="rrf")
    convex = retrieve(
        conn, "docs", "wal lock", query_embedding=vector, threshold=0, fusion="convex", alpha=0.4
    )
    assert [(h.id, h.chunk, h.score) for h in default.hits] == [(h.id, h.chunk, h.score) for h in rrf.hits]
    assert default.diagnostics["parameters"]["fusion"] == "rrf"
    assert "alpha" not in default.diagnostics["parameters"]
    params = convex.diagnostics["parameters"]
    assert params["fusion"] == "convex" and params["alpha"] == 0.4
    assert params["fused_candidate_count"] == rrf.diagnostics["parameters"]["fused_candidate_count"]
    # Outside hybrid mode fusion is inert: the single leg's own score.
    for mode in ("lexical", "dense"):
        a = retrieve(conn, "docs", "wal lock", mode=mode, query_embedding=vector, threshold=0)  # type: ignore[arg-type]
        b = retrieve(
            conn,
            "docs",
            "wal lock",
            mode=mode,  # type: ignore[arg-type]
            query_embedding=vector,
            threshold=0,
            fusion="convex",
            alpha=0.9,
        )
        assert [(h.id, h.chunk, h.score) for h in a.hits] == [(h.id, h.chunk, h.score) for h in b.hits]


def test_group_by_doc_keeps_each_documents_best_convex_chunk(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]
) -> None:
    vector = _unit(np.random.default_rng(9))
    dense, sparse = _legs(conn, "backup replica query", vector, 100, threshold=0)
    best: dict[str, float] = {}
    for (doc_id, _), score in convex_reference(dense, sparse, 0.6):
        best.setdefault(doc_id, score)
    expected = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    got = retrieve(
        conn,
        "docs",
        "backup replica query",
        query_embedding=vector,
        threshold=0,
        fusion="convex",
        alpha=0.6,
        group_by_doc=True,
    )
    assert [h.id for h in got.hits] == [d for d, _ in expected]
    assert [h.score for h in got.hits] == pytest.approx([s for _, s in expected], abs=1e-9)


def test_group_by_doc_keeps_each_documents_first_rrf_hit_and_results_repeat_the_hits(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]
) -> None:
    """One RRF hit per document: the first of each document in the ungrouped ranking over the same pools
    (candidates of the dense leg carry their document, the lexical leg's others are looked up: both are in
    play here); diagnostics.output.results repeat each hit's id, chunk, distance, BM25, ranks and text."""
    vector = _unit(np.random.default_rng(5))
    query = "wal lock replica backup"
    dense, sparse = _legs(conn, query, vector, 100, threshold=0)
    assert dense.keys() - sparse.keys() and sparse.keys() - dense.keys()
    # top 25 and grouped top 10 both take 100 candidates a leg
    flat = retrieve(conn, "docs", query, query_embedding=vector, threshold=0, top_k=25, output_results=True)
    first: dict[str, Hit] = {}
    for hit in flat.hits:
        first.setdefault(hit.id, hit)
    assert len(first) >= 10
    grouped = retrieve(
        conn, "docs", query, query_embedding=vector, threshold=0, group_by_doc=True, output_results=True
    )
    assert [(h.id, h.chunk, h.score) for h in grouped.hits] == [
        (h.id, h.chunk, h.score) for h in list(first.values())[:10]
    ]
    for result in (flat, grouped):
        assert result.diagnostics["output"]["results"] == [
            {
                "id": h.id,
                "chunk": h.chunk,
                "distance": h.distance,
                "bm25_score": h.bm25_score,
                "rank_dense": h.rank_dense,
                "rank_sparse": h.rank_sparse,
                "text": h.text,
            }
            for h in result.hits
        ]
    # Unasked (the Python and HTTP default), the same call leaves the repeated hits out and keeps the funnel.
    plain = retrieve(conn, "docs", query, query_embedding=vector, threshold=0, top_k=25)
    assert "output" not in plain.diagnostics and plain.hits == flat.hits
    assert plain.diagnostics["parameters"] == flat.diagnostics["parameters"]


LONG_QUERY = "wal vacuum replica"


def _long_documents(conn: psycopg.Connection[Any]) -> np.ndarray:
    """Source `long`: 14 documents of eight chunks with a `team` field (L01 alone in team "b"). The chunks of
    L00 and L01 share the query's words and nearly one vector, so they crowd the best candidates; chunks
    repeat their text, so lexical scores tie. Returns the query vector."""
    create_document_source(
        conn, "long", embedding_model="m", embedding_dim=DIM, fields=[FieldSpec(name="team", type="string")]
    )
    rng = random.Random(11)
    nprng = np.random.default_rng(11)
    bases = {f"L{d:02d}": _unit(nprng) for d in range(14)}
    bases["L01"] = bases["L00"]
    rows = []
    for doc_id, base in bases.items():
        for chunk in range(8):
            noisy = base + 0.05 * nprng.normal(size=DIM).astype(np.float32)
            words = [LONG_QUERY] if doc_id in ("L00", "L01") else rng.choices(WORDS, k=3)
            text = " ".join(words + WORDS[chunk % 2 : chunk % 2 + 1])
            rows.append(
                (
                    doc_id,
                    chunk,
                    f"title {doc_id}",
                    text,
                    Jsonb({"team": "b" if doc_id == "L01" else "a"}),
                    (noisy / np.linalg.norm(noisy)).astype(np.float32),
                )
            )
    with conn.cursor() as cur:
        cur.executemany(
            "insert into agentdb_docs.long (doc_id, chunk, title, text, metadata, agentdb_embedding)"
            " values (%s, %s, %s, %s, %s, %s)",
            rows,
        )
    return bases["L00"]


def _check_long_pages(
    conn: psycopg.Connection[Any], mode: str, vector: np.ndarray, **kwargs: Any
) -> list[Hit]:
    """Grouped pages of top_k 1, 5 and 14 must be the first hit of each document in the ungrouped ranking of
    the same candidates (top_k 100 of 100 a leg), and an ungrouped page its first top_k hits; the best
    2 x top_k candidates hold fewer than top_k documents, so the grouped fallback is needed. Returns that
    ranking."""

    def page(top_k: int, **more: Any) -> list[Hit]:
        found = retrieve(
            conn,
            "long",
            LONG_QUERY,
            mode=mode,
            query_embedding=vector,
            threshold=0,
            top_k=top_k,
            candidates=100,
            **kwargs,
            **more,
        )
        return found.hits

    flat = page(100)
    assert len({h.id for h in flat[:10]}) < 5
    first: dict[str, Hit] = {}
    for hit in flat:
        first.setdefault(hit.id, hit)
    for top_k in (1, 5, 14):
        assert [(h.id, h.chunk, h.score, h.rank) for h in page(top_k, group_by_doc=True)] == [
            (h.id, h.chunk, h.score, n) for n, h in enumerate(list(first.values())[:top_k], start=1)
        ]
        assert page(top_k) == flat[:top_k]  # ungrouped: the candidates scoring at least the top_k-th one
    return flat


@pytest.mark.parametrize("mode", ["hybrid", "lexical", "dense"])
def test_group_by_doc_over_long_documents_is_the_first_hit_of_each_document_in_the_full_ranking(
    conn: psycopg.Connection[Any], mode: str
) -> None:
    """A grouped page looks up the documents of the candidates scoring at least the (2 x top_k)-th one and the
    rest only when those hold fewer than top_k documents (sql/040_retrieve.sql, `near`); an ungrouped page
    those scoring at least the top_k-th. Documents of eight chunks crowd the best candidates, so the fallback
    is needed, and lexical scores tie at the edge."""
    hits = _check_long_pages(conn, mode, _long_documents(conn))
    if mode == "lexical":
        assert len(hits) > len({h.score for h in hits})  # ties


@pytest.mark.parametrize("mode", ["hybrid", "lexical"])
def test_a_principals_long_document_pages_keep_its_rows_and_fields(
    conn: psycopg.Connection[Any], mode: str
) -> None:
    """The same pages under a principal's role whose row filter hides L01 (one of the two crowding documents)
    and whose field grant leaves only `team`, with its row filter passed or not: the grouped fallback looks up
    only rows the role can read, and no hit shows a hidden row or field."""
    vector = _long_documents(conn)
    alice, _ = create_principal(conn, "alice", tables=["long"], row_filter={"team": "a"}, fields=["team"])
    for row_filter in (None, alice.row_filter):
        with principal_scope(conn, alice) as scoped:
            hits = _check_long_pages(scoped, mode, vector, row_filter=row_filter, fields=["team"])
        assert hits and "L01" not in {h.id for h in hits}
        assert all(h.title is None and h.text is None and h.metadata == {"team": "a"} for h in hits)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_filters_apply_to_both_legs_before_fusion(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]], data: st.DataObject
) -> None:
    """With a random filter, every hit matches it and the scores are the reference's over the filtered legs
    (normalised over the filtered pools, as RRF ranks them)."""
    query_filter = data.draw(filters(FIELD_DICTS, DOC_IDS), label="filter")
    words = data.draw(st.lists(st.sampled_from([*WORDS, "zebra"]), min_size=1, max_size=3), label="query")
    alpha = data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]), label="alpha")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    hits = _check_against_reference(
        conn,
        " ".join(words),
        _unit(np.random.default_rng(seed)),
        alpha=alpha,
        top_k=data.draw(st.integers(1, 40), label="top_k"),
        threshold=0,
        filter=query_filter,
    )
    assert all(matches(FIELD_DICTS, query_filter, h.id, corpus[h.id]) for h in hits)


def test_a_principals_row_filter_is_honoured(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]
) -> None:
    """Under the principal's role (row security) and with its row filter passed or not, the convex hits are
    exactly the allowed chunks of both legs, scored as the reference scores the legs the role can see."""
    row_filter = {"$or": [{"year": {"$lt": 4}}, {"tags": "red"}]}
    alice, _ = create_principal(
        conn, "alice", tables=["docs"], row_filter=row_filter, fields=["text", "year"]
    )
    allowed = {d for d, m in corpus.items() if matches(FIELD_DICTS, row_filter, d, m)}
    assert 0 < len(allowed) < N_DOCS
    vector = _unit(np.random.default_rng(11))
    everything = retrieve(
        conn, "docs", "wal archive vacuum", query_embedding=vector, threshold=0, top_k=200, fusion="convex"
    )
    assert {h.id for h in everything.hits} - allowed  # the query does reach rows alice may not see
    for pass_row_filter, seed_postings in itertools.product([False, True], ["20000", "1"]):
        with principal_scope(conn, alice) as scoped:
            scoped.execute("select set_config('agentdb.lexical_seed_postings', %s, false)", (seed_postings,))
            hits = _check_against_reference(
                scoped,
                "wal archive vacuum",
                vector,
                alpha=0.5,
                top_k=200,
                threshold=0,
                row_filter=alice.row_filter if pass_row_filter else None,
                fields=["text", "year"],
            )
        assert hits and {h.id for h in hits} <= allowed
        assert {h.id for h in hits} == {h.id for h in everything.hits} & allowed
        assert all(h.title is None and set(h.metadata) <= {"year"} for h in hits)


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({"fusion": "linear"}, "fusion"),
        ({"fusion": None}, "fusion"),
        ({"fusion": "convex", "alpha": -0.1}, "alpha"),
        ({"fusion": "convex", "alpha": 1.5}, "alpha"),
        ({"fusion": "rrf", "alpha": math.nan}, "alpha"),
        ({"alpha": None}, "alpha"),
    ],
)
def test_bad_fusion_or_alpha_is_3007_at_its_path(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]], kwargs: dict[str, Any], path: str
) -> None:
    with pytest.raises(InvalidParamValue) as err:
        retrieve(conn, "docs", "wal", mode="lexical", **kwargs)
    assert err.value.code == 3007 and err.value.path == path


def test_the_sql_function_search_takes_fusion_by_name(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]
) -> None:
    vector = _unit(np.random.default_rng(13))
    rows = conn.execute(
        "select id, chunk, score from agentdb.search('docs', 'wal backup', query_embedding => %s, threshold => 0,"
        " fusion => 'convex', alpha => 0.7)",
        (vector,),
    ).fetchall()
    got = retrieve(
        conn, "docs", "wal backup", query_embedding=vector, threshold=0, fusion="convex", alpha=0.7
    )
    assert [tuple(r) for r in rows] == [(h.id, h.chunk, h.score) for h in got.hits]
    # The older call shape (no fusion) still works and is RRF.
    rows = conn.execute(
        "select id, score from agentdb.search('docs', 'wal backup', query_embedding => %s, threshold => 0)",
        (vector,),
    ).fetchall()
    rrf = retrieve(conn, "docs", "wal backup", query_embedding=vector, threshold=0)
    assert [tuple(r) for r in rows] == [(h.id, h.score) for h in rrf.hits]
    with pytest.raises(psycopg.Error) as err:
        conn.execute("select * from agentdb.search('docs', 'wal', alpha => 2)")
    assert "alpha must be between 0 and 1" in str(err.value)


def test_the_cli_passes_fusion_and_alpha(
    db_url: str, corpus: dict[str, dict[str, Any]], monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert cli_main(
        ["search", "docs", "wal", "--mode", "lexical", "--fusion", "convex", "--alpha", "0.2", "--json"]
    ) in (
        0,
        None,
    )
    params = json.loads(capsys.readouterr().out)["diagnostics"]["parameters"]
    assert params["fusion"] == "convex" and params["alpha"] == 0.2
    assert cli_main(["search", "docs", "wal", "--mode", "lexical", "--alpha", "3"]) == 2
    assert "3007 InvalidParamValue" in capsys.readouterr().err


def test_the_agent_endpoint_validates_and_passes_fusion(
    db_url: str, corpus: dict[str, dict[str, Any]]
) -> None:
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        for spec, path in (
            ({"fusion": "linear"}, "queries[1].fusion"),
            ({"alpha": 1.01}, "queries[1].alpha"),
        ):
            response = client.post(
                "/agents/retrieval",
                json={"query": "wal", "queries": [{"table": "docs"}, {"table": "docs", **spec}]},
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == 3007 and error["path"] == path
        response = client.post(
            "/agents/retrieval",
            json={
                "query": "wal archive",
                "queries": [
                    {
                        "table": "docs",
                        "retrieval_mode": "lexical",
                        "fusion": "convex",
                        "alpha": 0.25,
                        "limit": 5,
                    }
                ],
                "diagnostics": True,
            },
        )
        assert response.status_code == 200, response.text
        params = response.json()["debug_info"]["queries"][0]["parameters"]
        assert params["fusion"] == "convex" and params["alpha"] == 0.25
