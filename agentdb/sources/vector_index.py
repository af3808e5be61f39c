"""A source's HNSW index: dropped before a bulk load into a new source, built once afterwards."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from agentdb.sources.catalog import Source


def drop_vector_index(conn: psycopg.Connection[Any], source: Source) -> None:
    """Drop the source's HNSW index before a bulk load into a new source; ensure_vector_index builds it again
    afterwards. One build over all the rows is faster than inserting them one by one into the graph, which
    updates its neighbours at every row. Found in the catalog: PostgreSQL names it (a name made from the
    table's could pass 63 bytes and, cut there, be another index's)."""
    for name in vector_indexes(conn, source):
        conn.execute(
            sql.SQL("drop index {}.{}").format(sql.Identifier(source.table_schema), sql.Identifier(name))
        )


def ensure_vector_index(conn: psycopg.Connection[Any], source: Source) -> None:
    """Build the source's HNSW index if its table has none (after drop_vector_index, or when a process died
    during a load that had dropped it); any HNSW index of the table counts (a memory store's records have
    one of another name). Looked up in the catalog first, without a lock: CREATE INDEX IF NOT EXISTS would
    take one that waits for the table's writers even when the index is there. When it is missing, the table
    is locked against other builders (SHARE ROW EXCLUSIVE conflicts with itself) and the catalog read again,
    so that two ingestions finishing together build it once; a table lock rather than an advisory one, since
    the server reorders the waits of a builder that already writes into the table instead of deadlocking."""
    if vector_indexes(conn, source):
        return
    with conn.transaction():
        conn.execute(sql.SQL("lock table {} in share row exclusive mode").format(source.table))
        if not vector_indexes(conn, source):
            conn.execute(
                sql.SQL("create index on {} using hnsw (agentdb_embedding vector_cosine_ops)").format(
                    source.table
                )
            )


def vector_indexes(conn: psycopg.Connection[Any], source: Source) -> list[str]:
    """The names of the HNSW indexes of the source's table."""
    rows = conn.execute(
        "select c.relname from pg_index i join pg_class c on c.oid = i.indexrelid"
        " join pg_am a on a.oid = c.relam where i.indrelid = to_regclass(%s) and a.amname = 'hnsw'",
        (source.table.as_string(conn),),
    ).fetchall()
    return [row[0] for row in rows]
