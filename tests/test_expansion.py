"""Retrieve-then-expand (agentdb.expand, sql/060_expand.sql) against a Python reference of the same rules."""

from __future__ import annotations

import gzip
import json
import random
import re
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from agentdb.agent.expansion import expand
from agentdb.errors import InvalidParamValue, StorageFileNotFound
from agentdb.ingest.chunking import chunk_text
from agentdb.retrieval import Hit, retrieve
from agentdb.sources import FieldSpec, create_document_source
from tests.conftest import scifact_path

# --- the reference -------------------------------------------------------------------------------------


def ref_overlap(a: str, b: str) -> int:
    """Longest suffix of a that is a prefix of b."""
    for k in range(min(len(a), len(b)), 0, -1):
        if a.endswith(b[:k]):
            return k
    return 0


def ref_join(a: str | None, a_pos: int, b: str, b_pos: int, dedup: bool) -> str:
    if a is None:
        return b
    if b_pos != a_pos + 1:
        return a + " … " + b
    if dedup and (k := ref_overlap(a, b)):
        return a + b[k:]
    return a + " " + b


def ref_expand(
    docs: dict[str, dict[int, str]], hits: list[dict[str, Any]], window: int, dedup: bool
) -> list[dict[str, Any]]:
    """The rules of sql/060_expand.sql, written independently: windows, clipping, merging, ordering, text."""
    if window == 1:
        return [{**h, "chunks": [h["chunk"]], "hit_chunks": [h["chunk"]]} for h in hits]
    windows = []
    for order, hit in enumerate(hits, 1):
        c = hit["chunk"]
        lo, hi = max(0, c - (window - 1) // 2), c + window // 2
        windows.append(
            {"id": hit["id"], "lo": lo, "hi": hi, "rank": hit.get("rank", order), "ord": order, "hit": hit}
        )
    groups: list[dict[str, Any]] = []
    for doc in sorted({w["id"] for w in windows}):
        current = None
        for w in sorted((w for w in windows if w["id"] == doc), key=lambda w: (w["lo"], w["ord"])):
            if current is not None and w["lo"] <= current["hi"] + 1:
                current["hi"] = max(current["hi"], w["hi"])
                current["members"].append(w)
            else:
                current = {"id": doc, "lo": w["lo"], "hi": w["hi"], "members": [w]}
                groups.append(current)
    out = []
    for g in groups:
        best = min(g["members"], key=lambda w: (w["rank"], w["ord"]))
        positions = sorted(p for p in docs.get(g["id"], {}) if g["lo"] <= p <= g["hi"])
        merged = dict(best["hit"])
        merged["hit_chunks"] = sorted({w["hit"]["chunk"] for w in g["members"]})
        merged["chunks"] = positions
        if positions:
            text, last = None, -10
            for p in positions:
                text, last = ref_join(text, last, docs[g["id"]][p], p, dedup), p
            merged["text"] = text
        out.append(((best["rank"], best["ord"]), merged))
    return [m for _, m in sorted(out, key=lambda item: item[0])]


# --- fixtures ------------------------------------------------------------------------------------------


def _insert(
    conn: psycopg.Connection[Any], source: str, rows: list[tuple[str, int, str, dict[str, Any]]]
) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL(
                "insert into agentdb_docs.{} (doc_id, chunk, title, text, metadata) values (%s, %s, %s, %s, %s)"
            ).format(sql.Identifier(source)),
            [(doc, chunk, f"title {doc}", text, Jsonb(meta)) for doc, chunk, text, meta in rows],
        )


LETTERS: dict[str, dict[int, str]] = {
    "a": {i: f"[a{i}]" for i in range(10)},
    "b": {i: f"[b{i}]" for i in range(4)},
}


@pytest.fixture
def letters(conn: psycopg.Connection[Any]) -> dict[str, dict[int, str]]:
    """Source `letters`: document a with chunks 0..9 and b with 0..3, texts that never overlap; chunk 7 of
    a is marked hidden."""
    create_document_source(
        conn,
        "letters",
        embedding_model="m",
        embedding_dim=3,
        chunk_size=8,
        chunk_overlap=2,
        fields=[FieldSpec(name="hidden", type="bool", optional=False, default=False)],
    )
    _insert(
        conn,
        "letters",
        [
            (doc, i, text, {"hidden": doc == "a" and i == 7})
            for doc, chunks in LETTERS.items()
            for i, text in chunks.items()
        ],
    )
    return LETTERS


def h(doc: str, chunk: int, rank: int | None = None, **extra: Any) -> dict[str, Any]:
    hit: dict[str, Any] = {"id": doc, "chunk": chunk, "score": 1.0, "text": "hit text", **extra}
    if rank is not None:
        hit["rank"] = rank
    return hit


def sql_expand(
    conn: psycopg.Connection[Any], source: str, hits: list[dict[str, Any]], window: int, **kw: Any
) -> list[dict[str, Any]]:
    row = conn.execute(
        "select agentdb.expand(source => %s, hits => %s, expand_window => %s, scope => %s, fields => %s)",
        (
            source,
            Jsonb(hits),
            window,
            Jsonb({"filter": kw.get("filter"), "row_filter": kw.get("row_filter")}),
            kw.get("fields"),
        ),
    ).fetchone()
    assert row is not None
    return list(row[0])


def spans(result: list[dict[str, Any]]) -> list[tuple[str, list[int]]]:
    return [(r["id"], r["chunks"]) for r in result]


# --- cases ---------------------------------------------------------------------------------------------


def test_odd_and_even_windows(conn: psycopg.Connection[Any], letters: Any) -> None:
    assert spans(sql_expand(conn, "letters", [h("a", 5)], 3)) == [("a", [4, 5, 6])]
    assert spans(sql_expand(conn, "letters", [h("a", 5)], 5)) == [("a", [3, 4, 5, 6, 7])]
    assert spans(sql_expand(conn, "letters", [h("a", 5)], 2)) == [("a", [5, 6])]
    assert spans(sql_expand(conn, "letters", [h("a", 5)], 4)) == [("a", [4, 5, 6, 7])]
    [one] = sql_expand(conn, "letters", [h("a", 5, rank=1, distance=0.25)], 3)
    assert one["text"] == "[a4] [a5] [a6]"  # no overlap between these texts: joined with a space
    assert one["chunk"] == 5 and one["rank"] == 1 and one["distance"] == 0.25 and one["hit_chunks"] == [5]


def test_windows_clip_at_document_edges_without_shifting(conn: psycopg.Connection[Any], letters: Any) -> None:
    assert spans(sql_expand(conn, "letters", [h("a", 0)], 3)) == [("a", [0, 1])]
    assert spans(sql_expand(conn, "letters", [h("a", 1)], 5)) == [("a", [0, 1, 2, 3])]
    assert spans(sql_expand(conn, "letters", [h("a", 9)], 4)) == [("a", [8, 9])]
    assert spans(sql_expand(conn, "letters", [h("b", 2)], 7)) == [("b", [0, 1, 2, 3])]


def test_overlapping_and_adjacent_windows_merge(conn: psycopg.Connection[Any], letters: Any) -> None:
    # 2 -> [1..3] and 4 -> [3..5] overlap; the best (lowest rank) hit's fields are kept.
    [merged] = sql_expand(conn, "letters", [h("a", 2, rank=2, score=0.5), h("a", 4, rank=1, score=0.9)], 3)
    assert merged["chunks"] == [1, 2, 3, 4, 5] and merged["hit_chunks"] == [2, 4]
    assert merged["chunk"] == 4 and merged["rank"] == 1 and merged["score"] == 0.9
    assert merged["text"] == "[a1] [a2] [a3] [a4] [a5]"
    # 2 -> [1..3] and 5 -> [4..6] touch: one hit; 2 and 6 -> [5..7] leave position 4 out: two hits.
    assert spans(sql_expand(conn, "letters", [h("a", 2), h("a", 5)], 3)) == [("a", [1, 2, 3, 4, 5, 6])]
    assert spans(sql_expand(conn, "letters", [h("a", 2), h("a", 6)], 3)) == [
        ("a", [1, 2, 3]),
        ("a", [5, 6, 7]),
    ]
    # Other documents never merge; output follows the best rank of each merged hit.
    result = sql_expand(
        conn, "letters", [h("b", 1, rank=3), h("a", 8, rank=2), h("b", 2, rank=1), h("a", 2, rank=4)], 3
    )
    assert spans(result) == [("b", [0, 1, 2, 3]), ("a", [7, 8, 9]), ("a", [1, 2, 3])]
    assert result[0]["chunk"] == 2 and result[0]["hit_chunks"] == [1, 2]
    # The same hit twice is one window.
    assert spans(sql_expand(conn, "letters", [h("a", 3), h("a", 3)], 3)) == [("a", [2, 3, 4])]


def test_window_one_is_identity(conn: psycopg.Connection[Any], letters: Any) -> None:
    hits = [h("a", 2, rank=1), h("a", 3, rank=2), h("a", 3, rank=3), h("b", 0, rank=4)]
    result = sql_expand(conn, "letters", hits, 1)
    assert [{k: v for k, v in r.items() if k not in ("chunks", "hit_chunks")} for r in result] == hits
    assert [r["chunks"] for r in result] == [[2], [3], [3], [0]]


def test_filters_and_missing_chunks_leave_gaps(conn: psycopg.Connection[Any], letters: Any) -> None:
    not_hidden = {"op": "eq", "lhs": {"knowledge": "hidden"}, "rhs": {"value": False}}
    for key in ("filter", "row_filter"):
        [one] = sql_expand(conn, "letters", [h("a", 6), h("a", 8)], 3, **{key: not_hidden})
        assert one["chunks"] == [5, 6, 8, 9] and one["text"] == "[a5] [a6] … [a8] [a9]"
    conn.execute("delete from agentdb_docs.letters where doc_id = 'b' and chunk = 1")
    [one] = sql_expand(conn, "letters", [h("b", 2)], 3)
    assert one["chunks"] == [2, 3] and one["text"] == "[b2] [b3]"
    [gone] = sql_expand(conn, "letters", [h("zz", 4, rank=1)], 3)
    assert gone == {**h("zz", 4, rank=1), "chunks": [], "hit_chunks": [4]}


def test_projection_without_text_adds_no_text(conn: psycopg.Connection[Any], letters: Any) -> None:
    [one] = sql_expand(conn, "letters", [h("a", 4, text=None)], 3, fields=["title"])
    assert one["text"] is None and one["chunks"] == [3, 4, 5]


def test_overlap_is_written_once(conn: psycopg.Connection[Any]) -> None:
    create_document_source(conn, "prose", embedding_model="m", embedding_dim=3, chunk_size=4, chunk_overlap=2)
    text = "one two three four five six seven eight nine ten eleven"
    chunks = chunk_text(text, whitespace_spans, 4, 2)
    assert chunks[:2] == ["one two three four", "three four five six"]
    _insert(conn, "prose", [("p", i, c, {}) for i, c in enumerate(chunks)])
    [whole] = sql_expand(conn, "prose", [h("p", 2)], 101)
    assert whole["text"] == text and whole["chunks"] == list(range(len(chunks)))
    [mid] = sql_expand(conn, "prose", [h("p", 1)], 2)
    assert mid["text"] == "three four five six seven eight"
    assert conn.execute(
        "select agentdb.chunk_overlap('abcab', 'cabxy'), agentdb.chunk_overlap('ab', 'cd'),"
        " agentdb.chunk_overlap('aaa', 'aaaa'), agentdb.chunk_overlap('', 'x')"
    ).fetchone() == (3, 0, 3, 0)


def test_errors(conn: psycopg.Connection[Any], letters: Any) -> None:
    with pytest.raises(StorageFileNotFound):
        expand(conn, "nope", [h("a", 1)], 3)
    with pytest.raises(InvalidParamValue) as bad_window:
        expand(conn, "letters", [h("a", 1)], 0)
    assert bad_window.value.path == "expand_window"
    for bad in (
        {"id": "a"},
        {"id": "a", "chunk": 1.5},
        {"id": "a", "chunk": -1},
        {"chunk": 1},
        {"id": "a", "chunk": 1, "rank": "x"},
    ):
        with pytest.raises(InvalidParamValue) as exc:
            expand(conn, "letters", [bad], 3)
        assert exc.value.path == "hits"
    assert expand(conn, "letters", [], 3) == []
    assert sql_expand(conn, "letters", [], 3) == []


def test_python_wrapper_takes_and_returns_hits(conn: psycopg.Connection[Any], letters: Any) -> None:
    conn.execute(
        "update agentdb_docs.letters set text = text || ' wal archive' where doc_id = 'a' and chunk = 4"
    )
    result = retrieve(conn, "letters", "wal archive", mode="lexical", top_k=3)
    assert [(x.id, x.chunk) for x in result.hits] == [("a", 4)]
    assert result.hits[0].table == "letters" and result.hits[0].chunks is None
    [wide] = expand(conn, "letters", result.hits, 3)
    assert isinstance(wide, Hit) and wide.table == "letters"
    assert wide.chunks == [3, 4, 5] and wide.hit_chunks == [4] and wide.rank == 1
    assert wide.bm25_score == result.hits[0].bm25_score and wide.title == "title a"
    assert wide.text == "[a3] [a4] wal archive [a5]"


# --- equality with the reference on SciFact chunks -----------------------------------------------------


def whitespace_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\S+", text)]


@pytest.mark.corpus
def test_equals_python_reference_on_scifact_chunks(conn: psycopg.Connection[Any]) -> None:
    path = scifact_path() / "corpus.jsonl.gz"
    size, overlap = 24, 6
    create_document_source(
        conn, "scifact", embedding_model="m", embedding_dim=3, chunk_size=size, chunk_overlap=overlap
    )
    docs: dict[str, dict[int, str]] = {}
    originals: dict[str, str] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            record = json.loads(line)
            chunks = chunk_text(record["text"], whitespace_spans, size, overlap)
            docs[record["_id"]] = dict(enumerate(chunks))
            originals[record["_id"]] = record["text"]
            if len(docs) == 300:
                break
    _insert(conn, "scifact", [(doc, i, t, {}) for doc, chunks in docs.items() for i, t in chunks.items()])
    rng = random.Random(7)
    ids = sorted(docs)
    merged_groups = contiguous = 0
    for trial in range(200):
        focus = rng.sample(ids, rng.randint(1, 3))  # few documents, so windows meet often
        n = rng.randint(1, 10)
        hits = []
        for rank in rng.sample(range(1, n + 1), n):
            doc = rng.choice(focus)
            hit = {"id": doc, "chunk": rng.randrange(len(docs[doc])), "score": rng.random(), "text": "x"}
            if trial % 5:
                hit["rank"] = rank
            hits.append(hit)
        window = rng.randint(1, 7)
        got = sql_expand(conn, "scifact", hits, window)
        assert got == ref_expand(docs, hits, window, dedup=True), (hits, window)
        for g in got:
            merged_groups += len(g["hit_chunks"]) > 1
            if window > 1 and g["chunks"] == list(range(g["chunks"][0], g["chunks"][-1] + 1)):
                # De-duplicating the overlap rebuilds the document text exactly.
                first, last = docs[g["id"]][g["chunks"][0]], docs[g["id"]][g["chunks"][-1]]
                start = originals[g["id"]].index(first)
                end = originals[g["id"]].index(last, start) + len(last)
                assert g["text"] == originals[g["id"]][start:end]
                contiguous += 1
    assert merged_groups > 50 and contiguous > 200
