"""The SQL door without a vector (issue 10, item 7): agentdb.search with no mode and no query_embedding runs
lexical and says so, instead of failing on the hybrid default."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from agentdb.sources import create_document_source


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
