"""A source's table and what agentdb adds to it: the document table, its indexes, the lexical triggers (and,
for a distributed source, the writers' lexical work), and what dropping a source removes.

Every source table carries three columns agentdb owns: `agentdb_chunk_id` (a stable chunk key),
`agentdb_embedding` (the dense vector) and `agentdb_tsv` (lexemes, generated from the text columns).
Statement-level triggers keep the BM25 postings and statistics equal to the rows.

A document table on PostgreSQL 18 or newer computes `agentdb_tsv` when read (a virtual generated column): the
postings hold what the lexical leg reads, so the lexemes need no copy on disk (at a million chunks the stored
column was 1.14 times the text), a distributed one too (Citus computes it on the shards). A table on an older
server keeps it stored."""

from __future__ import annotations

from typing import Any, Literal

import psycopg
from psycopg import sql

from agentdb.db.distribute import TENANT_COLUMN, distribute_source, on_citus, routed_by_tenant
from agentdb.errors import InvalidParamValue
from agentdb.sources.catalog import (
    DOCS_SCHEMA,
    FIELD_NAME,
    RESERVED_FIELDS,
    FieldSpec,
    Source,
    check_source_name,
    get_source,
    insert_source,
)
from agentdb.sources.vector_index import ensure_vector_index

# The statement-level triggers that keep a local source's BM25 postings and statistics equal to its rows.
LEXICAL_TRIGGERS = {
    "agentdb_lex_insert": "create trigger {name} after insert on {table} referencing new table as new_rows"
    " for each statement execute function agentdb.lexical_after_insert({src})",
    "agentdb_lex_delete": "create trigger {name} after delete on {table} referencing old table as old_rows"
    " for each statement execute function agentdb.lexical_after_delete({src})",
    "agentdb_lex_update": "create trigger {name} after update on {table}"
    " referencing old table as old_rows new table as new_rows"
    " for each statement execute function agentdb.lexical_after_update({src})",
    "agentdb_lex_truncate": "create trigger {name} after truncate on {table}"
    " for each statement execute function agentdb.lexical_truncate({src})",
}
# A registered table's row trigger that clears an embedding when its text changes (register.py).
STALE_EMBEDDING_TRIGGER = "agentdb_stale_embedding"
# A new source's chunks: CHUNK_SIZE embedder tokens, each sharing CHUNK_OVERLAP tokens with the one before.
CHUNK_SIZE = 256
CHUNK_OVERLAP = 32


def install_triggers(conn: psycopg.Connection[Any], source: Source) -> None:
    for name, statement in LEXICAL_TRIGGERS.items():
        conn.execute(
            sql.SQL(statement).format(
                name=sql.Identifier(name), table=source.table, src=sql.Literal(str(source.id))
            )
        )


def create_document_source(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    embedding_model: str,
    embedding_dim: int,
    fields: list[FieldSpec] | None = None,
    ts_config: str = "english",
    bm25_k1: float = 1.2,
    bm25_b: float = 0.75,
    chunk_size: int = CHUNK_SIZE,
    chunk_overlap: int = CHUNK_OVERLAP,
    lexical_layout: Literal["rows", "blocks"] | None = None,
    tenant_field: str | None = None,
) -> Source:
    """Create a document table (`agentdb_docs.<name>`) with its indexes and lexical triggers; its BM25
    postings are kept in `lexical_layout` ('rows' or 'blocks': see Source.lexical_layout), by default blocks
    (the accelerator's cursor reads them; on the SQL path they answer as fast as rows) but on a Citus
    coordinator, whose distributed sources keep rows unless asked (agentdb/db/distribute.py). With
    `tenant_field` (a string metadata field every document must carry) a coordinator distributes it by that
    field (Source.tenant_field); one node records it."""
    check_source_name(name)
    check_tenant_field(tenant_field, fields or [])
    if chunk_overlap >= chunk_size:
        raise InvalidParamValue("chunk_overlap must be smaller than chunk_size", path="chunk_overlap")
    fields = fields or []
    for f in fields:
        if f.name in RESERVED_FIELDS:
            raise InvalidParamValue(f"field name {f.name!r} is reserved", path=f"fields.{f.name}")
    distributed = on_citus(conn)
    with conn.transaction():
        source = insert_source(
            conn,
            {
                "name": name,
                "kind": "documents",
                "table_schema": DOCS_SCHEMA,
                "table_name": name,
                "id_column": "doc_id",
                "text_columns": ["title", "text"],
                "embedding_model": embedding_model,
                "embedding_dim": embedding_dim,
                "ts_config": ts_config,
                "bm25_k1": bm25_k1,
                "bm25_b": bm25_b,
                "chunk_size": chunk_size,
                "chunk_overlap": chunk_overlap,
                "lexical_layout": lexical_layout or ("rows" if distributed else "blocks"),
                "distributed": distributed,
                "tenant_field": tenant_field,
            },
            fields,
        )
        tenant = (
            sql.SQL(" {} text not null,").format(sql.Identifier(TENANT_COLUMN))
            if routed_by_tenant(source)
            else sql.SQL("")
        )
        computed_on_read = conn.info.server_version >= 180000
        conn.execute(
            sql.SQL(
                "create table {table} ("
                " agentdb_chunk_id bigint generated always as identity primary key,"
                " doc_id text not null, chunk int not null check (chunk >= 0),"
                " title text not null default '', text text not null,"
                " metadata jsonb not null default '{{}}',{tenant}"
                " agentdb_embedding vector({dim}),"
                " agentdb_tsv tsvector generated always as"
                "  (to_tsvector({cfg}::regconfig, title || ' ' || text)) {kind},"
                " unique (doc_id, chunk))"
            ).format(
                table=source.table,
                dim=sql.Literal(embedding_dim),
                cfg=sql.Literal(ts_config),
                tenant=tenant,
                kind=sql.SQL("virtual" if computed_on_read else "stored"),
            )
        )
        store_rows_inline(conn, source)
        create_indexes(conn, source, metadata=True)
        if source.distributed:
            distribute_source(conn, source)
        else:
            install_triggers(conn, source)
    return source


def check_tenant_field(tenant_field: str | None, fields: list[FieldSpec]) -> None:
    """3007 at `tenant_field` unless it is None or can name a string metadata field: a valid field name, not
    one agentdb reserves, and not a known field of another type."""
    if tenant_field is None:
        return
    if not FIELD_NAME.match(tenant_field) or tenant_field in RESERVED_FIELDS:
        raise InvalidParamValue(
            f"invalid tenant field {tenant_field!r}: name a metadata field (letters, digits and _, max 63;"
            f" not one of {', '.join(sorted(RESERVED_FIELDS))})",
            path="tenant_field",
        )
    known = next((f for f in fields if f.name == tenant_field), None)
    if known is not None and known.type != "string":
        raise InvalidParamValue(
            f"the tenant field {tenant_field!r} has type {known.type}; a tenant field holds strings",
            path="tenant_field",
        )


def write_lexical(
    conn: psycopg.Connection[Any], source: Source, op: Literal["add", "remove"], doc_ids: list[str]
) -> None:
    """The lexical triggers' work for a distributed source (nothing for any other, whose triggers do it): its
    postings and statistics for documents `doc_ids`, 'add' after their chunks are written, 'remove' before
    they are deleted, in the caller's transaction (agentdb_internal.lexical_write)."""
    if source.distributed and doc_ids:
        conn.execute(
            "select agentdb_internal.lexical_write(source_id => %s, op => %s, doc_ids => %s)",
            (source.id, op, doc_ids),
        )


def store_rows_inline(conn: psycopg.Connection[Any], source: Source) -> None:
    """Keep the vector and an ordinary chunk's text in the row, where the read path reads them
    (agentdb_internal.store_rows_inline says why and how)."""
    conn.execute("select agentdb_internal.store_rows_inline(source_id => %s)", (source.id,))


def create_indexes(conn: psycopg.Connection[Any], source: Source, *, metadata: bool) -> None:
    ensure_vector_index(conn, source)
    if metadata:
        conn.execute(sql.SQL("create index on {} using gin (metadata jsonb_path_ops)").format(source.table))


def drop_source(conn: psycopg.Connection[Any], name: str) -> None:
    """Remove a source. A document table is dropped; a registered table keeps its rows but loses agentdb's
    columns and triggers."""
    source = get_source(conn, name)
    with conn.transaction():
        if source.distributed:
            # Citus refuses to write the reference catalog after the parallel shard drops of one transaction
            # ("cannot modify table sources because there was a parallel operation on a distributed table").
            conn.execute("set local citus.multi_shard_modify_mode = 'sequential'")
        if source.kind == "documents":
            conn.execute(sql.SQL("drop table {}").format(source.table))
            if source.distributed:  # its postings do not reference the catalog (agentdb/db/distribute.py)
                conn.execute("delete from agentdb.postings where source_id = %s", (source.id,))
                conn.execute("delete from agentdb.posting_blocks where source_id = %s", (source.id,))
        else:
            for trigger in (*LEXICAL_TRIGGERS, STALE_EMBEDDING_TRIGGER):
                conn.execute(
                    sql.SQL("drop trigger if exists {} on {}").format(sql.Identifier(trigger), source.table)
                )
            conn.execute(
                sql.SQL(
                    "alter table {} drop column agentdb_tsv, drop column agentdb_embedding,"
                    " drop column agentdb_chunk_id"
                ).format(source.table)
            )
        conn.execute("delete from agentdb.sources where id = %s", (source.id,))
