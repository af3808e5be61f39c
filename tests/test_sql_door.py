"""The SQL door: agentdb.search without a vector runs lexical and says so, instead of
failing on the hybrid default; agentdb.retrieve returns one json document; the scope is one value."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from agentdb.retrieval import retrieve
from agentdb.sources import FieldSpec, create_document_source


def test_search_without_a_vector_is_lexical_and_says_so(conn: Any) -> None:
    create_document_source(conn, "t", embedding_model="all-MiniLM-L6-v2", embedding_dim=384)
    conn.execute(
        "insert into agentdb_docs.t (doc_id, chunk, title, text) values"
        " ('a', 0, 'WAL', 'archive the write-ahead log'), ('b', 0, 'Vacuum', 'reclaim dead tuples')"
    )
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    rows = conn.execute("select id, bm25_score, distance from agentdb.search('t', 'archive log')").fetchall()
    assert [r[0] for r in rows] == ["a"] and rows[0][1] > 0 and rows[0][2] is None
    assert any("mode => 'lexical'" in n for n in notices)
    with pytest.raises(psycopg.DatabaseError, match="needs query_embedding"):
        conn.execute("select * from agentdb.search('t', 'archive', mode => 'hybrid')")


def test_retrieve_returns_one_json_document_with_the_hits_keys_in_order(conn: Any) -> None:
    """agentdb.retrieve returns json written once (not jsonb): a hit's keys come in agentdb.search's column
    order, a cast gives jsonb's operators, and output.results is each hit without rank, score, title and
    metadata. The Python API reads the same document."""
    create_document_source(conn, "door", embedding_model="all-MiniLM-L6-v2", embedding_dim=384)
    conn.execute(
        "insert into agentdb_docs.door (doc_id, chunk, title, text, metadata) values"
        " ('a', 0, 'WAL', 'archive the write-ahead log', '{\"team\": \"ops\"}'),"
        " ('b', 0, 'Vacuum', 'reclaim dead tuples and archive nothing', '{}')"
    )
    call = "agentdb.retrieve('door', 'archive log', mode => 'lexical')"
    kind, text = conn.execute(f"select pg_typeof({call})::text, {call}::text").fetchone()
    assert kind == "json"
    payload = json.loads(text)
    assert list(payload) == ["route", "hits", "diagnostics"] and payload["route"] == "found"
    assert [h["id"] for h in payload["hits"]] == ["a", "b"]
    keys = "id chunk rank score distance bm25_score rank_dense rank_sparse title text metadata".split()
    assert [list(h) for h in payload["hits"]] == [keys] * 2
    assert payload["hits"][0]["metadata"] == {"team": "ops"} and payload["hits"][0]["score"] > 0
    dropped = {"rank", "score", "title", "metadata"}
    assert payload["diagnostics"]["output"]["results"] == [
        {k: v for k, v in h.items() if k not in dropped} for h in payload["hits"]
    ]
    assert payload["diagnostics"]["parameters"]["result_count"] == 2
    first = conn.execute(f"select ({call})::jsonb #>> '{{hits,0,text}}'").fetchone()[0]
    assert first == "archive the write-ahead log"
    api = retrieve(conn, "door", "archive log", mode="lexical", output_results=True)
    assert [(h.id, h.chunk, h.score) for h in api.hits] == [
        (h["id"], h["chunk"], h["score"]) for h in payload["hits"]
    ]
    assert api.diagnostics == payload["diagnostics"]


def test_the_scope_is_one_value_holding_the_filters_by_name(conn: Any) -> None:
    """agentdb.retrieve and agentdb.read take the query filters and the row filter as one jsonb `scope`, each
    key filtering as its own parameter did, and agentdb.search's `filter` is its `filter` (a bad scope's
    errors: tests/test_auth.py, the scoped reader's)."""
    create_document_source(
        conn, "sc", embedding_model="m", embedding_dim=3, fields=[FieldSpec(name="team", type="string")]
    )
    conn.execute(
        "insert into agentdb_docs.sc (doc_id, chunk, title, text, metadata) values"
        " ('a', 0, '', 'archive the log', '{\"team\": \"ops\"}'),"
        " ('b', 0, '', 'archive the log twice', '{\"team\": \"dev\"}'),"
        " ('c', 0, '', 'archive everything', '{\"team\": \"ops\"}')"
    )

    def ids(scope: str | None) -> list[str]:
        call = "select agentdb.retrieve('sc', 'archive log', mode => 'lexical', scope => %s::jsonb)::jsonb -> 'hits'"
        return [h["id"] for h in conn.execute(call, (scope,)).fetchone()[0]]

    assert ids(None) == ids("{}") == ["a", "b", "c"]
    assert ids('{"filter": {"team": "ops"}}') == ["a", "c"]
    assert ids('{"row_filter": {"team": "dev"}}') == ["b"]
    assert ids('{"filter_query": {"term": "ops", "field": "team"}, "exclusion_query": {"ids": ["c"]}}') == [
        "a"
    ]
    searched = conn.execute(
        "select id from agentdb.search('sc', 'archive log', filter => '{\"team\": \"ops\"}') order by rank"
    ).fetchall()
    assert [r[0] for r in searched] == ["a", "c"]
    read = conn.execute(
        "select doc_id from agentdb.read('sc', array['a', 'b', 'c'], scope => '{\"filter\": {\"team\": \"dev\"}}')"
    ).fetchall()
    assert read == [("b",)]


def test_the_sql_defaults_of_fusion_and_memory_decay_are_the_python_ones(conn: Any) -> None:
    """rrf_k's default is written once in SQL (agentdb_internal.default_rrf_k, the default of every function that
    takes rrf_k) and the memory decay once (agentdb.memory_recall); both equal agentdb.config's."""
    from agentdb.config import MEMORY_DECAY, RRF_K

    assert conn.execute("select agentdb_internal.default_rrf_k()").fetchone() == (RRF_K,)
    rows = conn.execute(
        "select p.oid::regprocedure::text, pg_get_function_arguments(p.oid) from pg_proc p"
        " join pg_namespace n on n.oid = p.pronamespace"
        " where n.nspname in ('agentdb', 'agentdb_internal') and 'rrf_k' = any(p.proargnames)"
    ).fetchall()
    with_default = [(name, arguments) for name, arguments in rows if "rrf_k integer DEFAULT" in arguments]
    assert len(with_default) >= 3  # retrieve, search, tree_walk
    for name, arguments in with_default:
        assert "rrf_k integer DEFAULT agentdb_internal.default_rrf_k()" in arguments, name
    (recall,) = conn.execute("select pg_get_function_arguments('agentdb.memory_recall'::regproc)").fetchone()
    assert f"decay double precision DEFAULT {MEMORY_DECAY}" in recall
