"""Fill the embeddings that are missing: rows of a registered table written by other programs (or whose
text changed) have no vector until agentdb computes one with the source's model."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from tqdm import tqdm

from agentdb.embed import Embedder, check_model
from agentdb.sources import Source, record_embedding_backends


def embed_missing(
    conn: psycopg.Connection[Any],
    source: Source,
    embedder: Embedder,
    *,
    batch_size: int = 64,
    progress: bool = True,
) -> int:
    """Embed every row whose `agentdb_embedding` is null; returns how many rows were filled."""
    check_model(source.embedding_model, embedder.model_name, source.name)
    text: sql.Composable
    if source.kind == "documents":
        text = sql.SQL("concat_ws(E'\\n', nullif(title, ''), text)")
    else:
        text = sql.SQL("concat_ws(E'\\n', {})").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in source.text_columns)
        )
    count_row = conn.execute(
        sql.SQL("select count(*) from {} where agentdb_embedding is null").format(source.table)
    ).fetchone()
    total = int(count_row[0]) if count_row else 0
    # Rows another process is embedding right now are locked: skip them rather than embed them twice.
    select = sql.SQL(
        "select agentdb_chunk_id, {} from {} where agentdb_embedding is null order by agentdb_chunk_id"
        " limit %s for update skip locked"
    ).format(text, source.table)
    update = sql.SQL(
        "update {} set agentdb_embedding = %s where agentdb_chunk_id = %s and agentdb_embedding is null"
    ).format(source.table)
    filled = 0
    with tqdm(total=total, unit="row", disable=not progress, desc=f"embed {source.name}") as bar:
        while True:
            with conn.transaction(), conn.cursor() as cur:
                rows = cur.execute(select, (batch_size,)).fetchall()
                if not rows:
                    break
                vectors = embedder.embed([r[1] or "" for r in rows])
                cur.executemany(update, [(v, r[0]) for r, v in zip(rows, vectors, strict=True)])
            filled += len(rows)
            bar.update(len(rows))
    if filled:
        record_embedding_backends(conn, source, [embedder.backend])
    return filled
