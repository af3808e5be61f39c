"""What a caller may read, as GET /sources lists it: its granted sources with their counts and the fields of
its grant. The HTTP routes and the MCP `list_sources` tool answer from here."""

from __future__ import annotations

from typing import Any

import psycopg
from pydantic import BaseModel

from agentdb.auth import Principal, read_scope, visible_source
from agentdb.sources import FieldSpec, Source, list_sources, pending_embeddings, source_counts


class SourceOut(BaseModel):
    name: str
    kind: str
    table: str
    text_columns: list[str]
    fields: list[FieldSpec]
    embedding_model: str
    embedding_dim: int
    ts_config: str
    documents: int
    chunks: int
    # Registered tables: rows waiting for the background embedder (not shown to principals).
    pending_embeddings: int | None = None


def source_out(conn: psycopg.Connection[Any], s: Source, pending: int | None = None) -> SourceOut:
    return SourceOut(
        pending_embeddings=pending,
        name=s.name,
        kind=s.kind,
        table=f"{s.table_schema}.{s.table_name}",
        text_columns=s.text_columns,
        fields=s.fields,
        embedding_model=s.embedding_model,
        embedding_dim=s.embedding_dim,
        ts_config=s.ts_config,
        **source_counts(conn, s),
    )


def visible_sources(conn: psycopg.Connection[Any], caller: Principal | None) -> list[SourceOut]:
    """The sources `caller` may read (every one in local development), each with the fields of its grant and
    the counts of the rows it can read (under its row security)."""
    visible = [s for s in list_sources(conn) if caller is None or s.name in caller.tables]
    pending = {s.name: pending_embeddings(conn, s) for s in visible if caller is None and s.kind == "table"}
    with read_scope(conn, caller):
        return [source_out(conn, visible_source(caller, s), pending.get(s.name)) for s in visible]


__all__ = ["SourceOut", "source_out", "visible_sources"]
