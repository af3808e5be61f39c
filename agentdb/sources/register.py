"""Registering an existing table in place as a source: its columns reflected (SQLAlchemy) into typed fields,
agentdb's columns, triggers and indexes added to it."""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql

from agentdb.db.distribute import on_citus
from agentdb.errors import InvalidParamValue, StorageFileNotFound, StorageKindMismatch
from agentdb.sources.catalog import (
    FIELD_NAME,
    FieldSpec,
    FieldType,
    Source,
    check_source_name,
    get_source,
    insert_source,
    source_exists,
)
from agentdb.sources.ddl import (
    CHUNK_OVERLAP,
    CHUNK_SIZE,
    STALE_EMBEDDING_TRIGGER,
    create_indexes,
    install_triggers,
    store_rows_inline,
)

_SA_TYPES: list[tuple[type, FieldType]] = [
    (sa.Boolean, "bool"),
    (sa.Integer, "int"),
    (sa.Float, "float"),
    (sa.Numeric, "float"),
    (sa.DateTime, "timestamp"),
    (sa.Date, "timestamp"),
    (sa.String, "string"),
]


def _field_type(column_type: Any) -> FieldType | None:
    if isinstance(column_type, sa.ARRAY) and isinstance(column_type.item_type, sa.String):
        return "string_set"
    for sa_type, kind in _SA_TYPES:
        if isinstance(column_type, sa_type):
            return kind
    return None


def reflect_columns(url: str, schema: str, table: str) -> list[dict[str, Any]]:
    """The table's columns as SQLAlchemy reflects them (name, type, nullable)."""
    import pgvector.sqlalchemy  # noqa: F401 - teaches the reflection the vector types (no "did not recognize")

    engine = sa.create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(url), poolclass=sa.NullPool
    )
    try:
        inspector = sa.inspect(engine)
        if not inspector.has_table(table, schema=schema):
            raise StorageFileNotFound(f"table {schema}.{table} does not exist", path="table")
        return [dict(c) for c in inspector.get_columns(table, schema=schema)]
    finally:
        engine.dispose()


def register_table(
    conn: psycopg.Connection[Any],
    url: str,
    name: str,
    *,
    table: str,
    id_column: str,
    text_columns: list[str],
    embedding_model: str,
    embedding_dim: int,
    schema: str = "public",
    ts_config: str = "english",
    bm25_k1: float = 1.2,
    bm25_b: float = 0.75,
    title_column: str | None = None,
) -> Source:
    """Register an existing table in place: reflect its columns into typed fields, then add only the
    agentdb columns (chunk key, embedding, generated tsvector), the indexes and the lexical triggers.
    Rows already in the table are indexed for BM25 at once; their embeddings are filled by `embed_missing`.
    `title_column` is the column that gives each hit its title (not a field, like the text columns).
    """
    check_source_name(name)
    if on_citus(conn):
        # Its table is the user's, with their keys: not distributed by agentdb, and a local table's triggers
        # cannot write the distributed postings (agentdb/db/distribute.py).
        raise InvalidParamValue(
            "registering an existing table is not supported on a Citus coordinator yet: ingest its rows into"
            " a document source, which is distributed",
            path="table",
        )
    columns = {c["name"]: c for c in reflect_columns(url, schema, table)}
    if "agentdb_tsv" in columns:
        return _registered_again(conn, name, (schema, table), (id_column, text_columns, title_column))
    fields = _reflected_fields(f"{schema}.{table}", columns, id_column, text_columns, title_column)
    with conn.transaction():
        source = insert_source(
            conn,
            {
                "name": name,
                "kind": "table",
                "table_schema": schema,
                "table_name": table,
                "id_column": id_column,
                "text_columns": text_columns,
                "embedding_model": embedding_model,
                "embedding_dim": embedding_dim,
                "ts_config": ts_config,
                "bm25_k1": bm25_k1,
                "bm25_b": bm25_b,
                "chunk_size": CHUNK_SIZE,
                "chunk_overlap": CHUNK_OVERLAP,
                "title_column": title_column,
            },
            fields,
        )
        _add_agentdb_columns(conn, source)
        install_triggers(conn, source)
        conn.execute("select agentdb.lexical_rebuild(source_name => %s)", (name,))
    return source


def _registered_again(
    conn: psycopg.Connection[Any],
    name: str,
    where: tuple[str, str],
    columns: tuple[str, list[str], str | None],
) -> Source:
    """A table that has agentdb's columns already: registering it again under the same name with the same
    columns is a no-op that returns its source; anything else is a conflict."""
    schema, table = where
    existing = get_source(conn, name) if source_exists(conn, name) else None
    if (
        existing is not None
        and (existing.kind, existing.table_schema, existing.table_name) == ("table", schema, table)
        and (existing.id_column, existing.text_columns, existing.title_column) == columns
    ):
        return existing
    raise StorageKindMismatch(
        f"table {schema}.{table} is already registered (it has agentdb's columns)"
        + (f" as source {existing.name!r} with other columns" if existing is not None else ""),
        path="table",
        hint="register it again with the same name and columns, or drop the source that registered it",
    )


def _reflected_fields(
    table: str,
    columns: dict[str, dict[str, Any]],
    id_column: str,
    text_columns: list[str],
    title_column: str | None,
) -> list[FieldSpec]:
    """Check the named columns against the reflected ones and return the other columns of a known type as
    optional fields (not agentdb's own)."""
    named = [("id_column", id_column)] + [(f"text_columns[{i}]", c) for i, c in enumerate(text_columns)]
    for path, column in named + ([("title_column", title_column)] if title_column else []):
        if column not in columns:
            raise InvalidParamValue(f"table {table} has no column {column!r}", path=path)
    for i, column in enumerate(text_columns):
        if not isinstance(columns[column]["type"], sa.String):
            raise InvalidParamValue(f"text column {column!r} is not a text type", path=f"text_columns[{i}]")
    if not text_columns:
        raise InvalidParamValue("at least one text column is needed", path="text_columns")
    fields = []
    for column_name, reflected in columns.items():
        if column_name in (id_column, title_column, *text_columns) or column_name.startswith("agentdb_"):
            continue
        kind = _field_type(reflected["type"])
        if kind is None or not FIELD_NAME.match(column_name):
            continue
        fields.append(FieldSpec(name=column_name, type=kind, optional=True, column=column_name))
    return fields


def _add_agentdb_columns(conn: psycopg.Connection[Any], source: Source) -> None:
    """agentdb's columns, the trigger that clears a stale embedding, and the indexes, on a registered table."""
    document = sql.SQL(" || ' ' || ").join(
        sql.SQL("coalesce({}, '')").format(sql.Identifier(c)) for c in source.text_columns
    )
    conn.execute(
        sql.SQL(
            "alter table {table}"
            " add column agentdb_chunk_id bigint generated always as identity unique,"
            " add column agentdb_embedding vector({dim}),"
            " add column agentdb_tsv tsvector generated always as (to_tsvector({cfg}::regconfig, {doc})) stored"
        ).format(
            table=source.table,
            dim=sql.Literal(source.embedding_dim),
            cfg=sql.Literal(source.ts_config),
            doc=document,
        )
    )
    # A changed text makes the stored embedding stale: clear it so `embed_missing` recomputes it.
    conn.execute(
        sql.SQL(
            "create trigger {name} before update of {cols} on {table}"
            " for each row execute function agentdb.clear_stale_embedding()"
        ).format(
            name=sql.Identifier(STALE_EMBEDDING_TRIGGER),
            cols=sql.SQL(", ").join(sql.Identifier(c) for c in source.text_columns),
            table=source.table,
        )
    )
    store_rows_inline(conn, source)
    create_indexes(conn, source, metadata=False)
    # The embedding queue: rows without a vector (new, or whose text changed), found by this index.
    conn.execute(
        sql.SQL("create index {} on {} (agentdb_chunk_id) where agentdb_embedding is null").format(
            sql.Identifier(f"agentdb_pending_{source.id}"), source.table
        )
    )
