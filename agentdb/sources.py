"""The registry of searchable sources: document tables agentdb creates and existing tables registered in place.

Every source table carries three columns agentdb owns: `agentdb_chunk_id` (a stable chunk key),
`agentdb_embedding` (the dense vector) and `agentdb_tsv` (lexemes, generated from the text columns).
Statement-level triggers keep the BM25 postings and statistics equal to the rows.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentdb.db.distribute import distribute_source, on_citus
from agentdb.errors import InvalidParamValue, StorageContentError, StorageFileNotFound, StorageKindMismatch

SOURCE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
DOCS_SCHEMA = "agentdb_docs"
# Term ranges a merge of posting blocks goes through, a VACUUM after each (optimize_source).
MERGE_SLICES = 8
# Connections that merge those ranges at once (scifact-text 100k after a load: 10.5 and 6.6 s on one, 5.0 and
# 3.6 s on two; the block table 137 -> 143 to 147 MB, the freed space reused a range later).
MERGE_WORKERS = 2
# The session advisory lock (with the source id) that one optimize of a source holds while its ranges merge.
MERGE_LOCK_KEY = 0x6D657267  # "merg"
# Columns of a document table that are not metadata fields.
RESERVED_FIELDS = frozenset({"_id", "id", "doc_id", "chunk", "title", "text", "metadata"})

FieldType = Literal["int", "float", "string", "bool", "string_set", "timestamp"]


class FieldSpec(BaseModel):
    """One typed metadata field: a key of `metadata` (document tables) or a column (registered tables)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    type: FieldType
    optional: bool = True
    default: Any = None
    filterable: bool = True
    column: str | None = None

    @model_validator(mode="after")
    def _check(self) -> FieldSpec:
        if not FIELD_NAME.match(self.name):
            raise ValueError(f"invalid field name {self.name!r}: use letters, digits and _ (max 63)")
        if not self.optional and self.default is None:
            raise ValueError(f"field {self.name!r} needs a default or must be optional")
        if self.default is not None:
            self.default = coerce_value(self, self.default)
        return self


def coerce_value(field: FieldSpec, value: Any) -> Any:
    """Check `value` against the field type and return its JSON form; raise ValueError when it does not fit."""
    kind = field.type
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError(f"expected int, got {type(value).__name__}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected float, got {type(value).__name__}")
        return float(value)
    if kind == "string":
        if not isinstance(value, str):
            raise ValueError(f"expected string, got {type(value).__name__}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected bool, got {type(value).__name__}")
        return value
    if kind == "string_set":
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValueError("expected a list of strings")
        return sorted(set(value))
    if isinstance(value, datetime):
        return value.isoformat()
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO 8601 timestamp, got {type(value).__name__}")
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"expected an ISO 8601 timestamp, got {value!r}") from exc
    return value


class Source(BaseModel):
    """A registered source as stored in agentdb.sources."""

    id: int
    name: str
    kind: Literal["documents", "table"]
    table_schema: str
    table_name: str
    id_column: str
    text_columns: list[str]
    fields: list[FieldSpec] = Field(default_factory=list)
    embedding_model: str
    embedding_dim: int
    ts_config: str
    bm25_k1: float
    bm25_b: float
    chunk_size: int
    chunk_overlap: int
    # The embedding backends that computed its stored vectors (agentdb.embed); empty when not known.
    embedding_backends: list[str] = Field(default_factory=list)
    # How the BM25 postings are stored (migrations/0013_block_postings.sql): a row per term and chunk, or
    # blocks of up to 128 chunks per term (compact, faster to load and search; principals read a block
    # source through a function that keeps the postings of their chunks, sql/020_lexical.sql).
    lexical_layout: Literal["rows", "blocks"] = "rows"
    # Distributed by Citus (agentdb/db/distribute.py): its table has no triggers, and its writers maintain its
    # lexical index and statistics (write_lexical).
    distributed: bool = False
    # A registered table's column whose value is its hits' title (migrations/0021); None: no title.
    title_column: str | None = None

    def field(self, name: str) -> FieldSpec | None:
        return next((f for f in self.fields if f.name == name), None)

    @property
    def table(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.table_schema), sql.Identifier(self.table_name))


def check_source_name(name: str) -> None:
    if not SOURCE_NAME.match(name):
        raise InvalidParamValue(
            f"invalid source name {name!r}: use lowercase letters, digits and _, starting with a letter (max 63)",
            path="source",
        )


def _row_to_source(row: dict[str, Any]) -> Source:
    return Source.model_validate({**row, "ts_config": str(row["ts_config"])})


_SELECT = (
    "select id, name, kind, table_schema, table_name, id_column, text_columns, fields, embedding_model,"
    " embedding_dim, ts_config::text as ts_config, bm25_k1, bm25_b, chunk_size, chunk_overlap,"
    " embedding_backends, lexical_layout, distributed, title_column"
    " from agentdb.sources"
)


def unknown_source(name: str) -> StorageFileNotFound:
    """3010 for a source that does not exist. Its code and name are the reference's, and "FileNotFound" says
    nothing of sources: the message says plainly that no source has that name and where the names are listed
    (agentdb.raise_unknown_source, sql/010_errors.sql, says the same from SQL)."""
    return StorageFileNotFound(
        f"no source named {name!r}; `agentdb sources` or GET /sources lists them", path="source"
    )


def source_name_taken(name: str) -> StorageKindMismatch:
    """3011 for a new source whose name is in use; the name "KindMismatch" is the reference's, so the message
    says what happened and what to do."""
    return StorageKindMismatch(
        f"a source named {name!r} already exists; choose another name (`agentdb sources` lists the taken ones)",
        path="source",
    )


def get_source(conn: psycopg.Connection[Any], name: str) -> Source:
    """The source called `name`, or StorageFileNotFound (3010) saying how to list the known ones."""
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute(_SELECT + " where name = %s", (name,)).fetchone()  # noqa: S608 - constant text
    if row is None:
        raise unknown_source(name)
    return _row_to_source(row)


def list_sources(conn: psycopg.Connection[Any]) -> list[Source]:
    """The sources, by name; not the records tables of memory stores (schema agentdb_memory), which are
    listed, each by its owner only, as memory stores (agentdb.memory.list_stores)."""
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(  # noqa: S608 - constant text
            _SELECT + " where table_schema <> 'agentdb_memory' order by name"
        ).fetchall()
    return [_row_to_source(r) for r in rows]


def _check_ts_config(conn: psycopg.Connection[Any], ts_config: str) -> None:
    row = conn.execute(
        "select to_regclass('pg_catalog.pg_ts_config') is not null,"
        " exists(select 1 from pg_ts_config where cfgname = %s)",
        (ts_config,),
    ).fetchone()
    if not row or not row[1]:
        raise InvalidParamValue(f"unknown text search configuration {ts_config!r}", path="ts_config")


def _install_triggers(conn: psycopg.Connection[Any], source: Source) -> None:
    table = source.table
    src = sql.Literal(str(source.id))
    for statement in (
        "create trigger agentdb_lex_insert after insert on {table} referencing new table as new_rows"
        " for each statement execute function agentdb.lexical_after_insert({src})",
        "create trigger agentdb_lex_delete after delete on {table} referencing old table as old_rows"
        " for each statement execute function agentdb.lexical_after_delete({src})",
        "create trigger agentdb_lex_update after update on {table}"
        " referencing old table as old_rows new table as new_rows"
        " for each statement execute function agentdb.lexical_after_update({src})",
        "create trigger agentdb_lex_truncate after truncate on {table}"
        " for each statement execute function agentdb.lexical_truncate({src})",
    ):
        conn.execute(sql.SQL(statement).format(table=table, src=src))


def _insert_source(conn: psycopg.Connection[Any], values: dict[str, Any]) -> int:
    row = conn.execute(
        "insert into agentdb.sources (name, kind, table_schema, table_name, id_column, text_columns, fields,"
        " embedding_model, embedding_dim, ts_config, bm25_k1, bm25_b, chunk_size, chunk_overlap, lexical_layout,"
        " distributed, title_column)"
        " values (%(name)s, %(kind)s, %(table_schema)s, %(table_name)s, %(id_column)s, %(text_columns)s,"
        " %(fields)s, %(embedding_model)s, %(embedding_dim)s, %(ts_config)s::regconfig, %(bm25_k1)s,"
        " %(bm25_b)s, %(chunk_size)s, %(chunk_overlap)s, %(lexical_layout)s, %(distributed)s, %(title_column)s)"
        " returning id",
        {"lexical_layout": "rows", "distributed": False, "title_column": None, **values},
    ).fetchone()
    assert row is not None
    conn.execute("insert into agentdb.corpus_stats (source_id) values (%s)", (row[0],))
    return int(row[0])


def _source_exists(conn: psycopg.Connection[Any], name: str) -> bool:
    return conn.execute("select 1 from agentdb.sources where name = %s", (name,)).fetchone() is not None


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
    chunk_size: int = 256,
    chunk_overlap: int = 32,
    lexical_layout: Literal["rows", "blocks"] = "rows",
) -> Source:
    """Create a document table (`agentdb_docs.<name>`) with its indexes and lexical triggers; its BM25
    postings are kept in `lexical_layout` ('rows', or 'blocks': see Source.lexical_layout)."""
    check_source_name(name)
    if chunk_overlap >= chunk_size:
        raise InvalidParamValue("chunk_overlap must be smaller than chunk_size", path="chunk_overlap")
    fields = fields or []
    for f in fields:
        if f.name in RESERVED_FIELDS:
            raise InvalidParamValue(f"field name {f.name!r} is reserved", path=f"fields.{f.name}")
    with conn.transaction():
        if _source_exists(conn, name):
            raise source_name_taken(name)
        _check_ts_config(conn, ts_config)
        source_id = _insert_source(
            conn,
            {
                "name": name,
                "kind": "documents",
                "table_schema": DOCS_SCHEMA,
                "table_name": name,
                "id_column": "doc_id",
                "text_columns": ["title", "text"],
                "fields": Jsonb([f.model_dump() for f in fields]),
                "embedding_model": embedding_model,
                "embedding_dim": embedding_dim,
                "ts_config": ts_config,
                "bm25_k1": bm25_k1,
                "bm25_b": bm25_b,
                "chunk_size": chunk_size,
                "chunk_overlap": chunk_overlap,
                "lexical_layout": lexical_layout,
                "distributed": on_citus(conn),
            },
        )
        source = get_source(conn, name)
        conn.execute(
            sql.SQL(
                "create table {table} ("
                " agentdb_chunk_id bigint generated always as identity primary key,"
                " doc_id text not null, chunk int not null check (chunk >= 0),"
                " title text not null default '', text text not null,"
                " metadata jsonb not null default '{{}}',"
                " agentdb_embedding vector({dim}),"
                " agentdb_tsv tsvector generated always as"
                "  (to_tsvector({cfg}::regconfig, title || ' ' || text)) stored,"
                " unique (doc_id, chunk))"
            ).format(table=source.table, dim=sql.Literal(embedding_dim), cfg=sql.Literal(ts_config))
        )
        _store_rows_inline(conn, source)
        _create_indexes(conn, source, metadata=True)
        if source.distributed:
            distribute_source(conn, source)
        else:
            _install_triggers(conn, source)
        assert source.id == source_id
    return source


def write_lexical(
    conn: psycopg.Connection[Any], source: Source, op: Literal["add", "remove"], doc_ids: list[str]
) -> None:
    """The lexical triggers' work for a distributed source (nothing for any other, whose triggers do it): its
    postings and statistics for documents `doc_ids`, 'add' after their chunks are written, 'remove' before
    they are deleted, in the caller's transaction (agentdb_internal.lexical_write)."""
    if source.distributed and doc_ids:
        conn.execute("select agentdb_internal.lexical_write(%s, %s, %s)", (source.id, op, doc_ids))


def _store_rows_inline(conn: psycopg.Connection[Any], source: Source) -> None:
    """Keep the vector and an ordinary chunk's text in the row, where the read path reads them
    (agentdb_internal.store_rows_inline says why and how)."""
    conn.execute("select agentdb_internal.store_rows_inline(%s)", (source.id,))


def _vector_index_name(source: Source) -> str:
    return f"{source.table_name}_agentdb_hnsw"


def drop_vector_index(conn: psycopg.Connection[Any], source: Source) -> None:
    """Drop the source's HNSW index before a bulk load into a new source; ensure_vector_index builds it again
    afterwards. One build over all the rows is faster than inserting them one by one into the graph: the
    demo pack imports in a third less time, and its 3,932 pages with their vectors are written in 4.1 to 4.2 s
    plus 0.8 to 1.0 s of build against 7.0 to 7.8 s into the index."""
    conn.execute(
        sql.SQL("drop index if exists {}.{}").format(
            sql.Identifier(source.table_schema), sql.Identifier(_vector_index_name(source))
        )
    )


def ensure_vector_index(conn: psycopg.Connection[Any], source: Source) -> None:
    """Build the source's HNSW index if its table has none (after drop_vector_index, or when a process died
    during a load that had dropped it); any HNSW index of the table counts (a memory store's records have
    one of another name). Looked up in the catalog first, without a lock: CREATE INDEX IF NOT EXISTS would
    take one that waits for the table's writers even when the index is there. When it is missing, the table
    is locked against other builders (SHARE ROW EXCLUSIVE conflicts with itself) and the catalog read again,
    so that two ingestions finishing together build it once; a table lock rather than an advisory one, since
    the server reorders the waits of a builder that already writes into the table instead of deadlocking."""
    if _has_vector_index(conn, source):
        return
    with conn.transaction():
        conn.execute(sql.SQL("lock table {} in share row exclusive mode").format(source.table))
        if not _has_vector_index(conn, source):
            conn.execute(
                sql.SQL(
                    "create index {name} on {table} using hnsw (agentdb_embedding vector_cosine_ops)"
                ).format(name=sql.Identifier(_vector_index_name(source)), table=source.table)
            )


def _has_vector_index(conn: psycopg.Connection[Any], source: Source) -> bool:
    found = conn.execute(
        "select exists (select 1 from pg_index i join pg_class c on c.oid = i.indexrelid"
        " join pg_am a on a.oid = c.relam where i.indrelid = to_regclass(%s) and a.amname = 'hnsw')",
        (source.table.as_string(conn),),
    ).fetchone()
    return found is not None and bool(found[0])


def _create_indexes(conn: psycopg.Connection[Any], source: Source, *, metadata: bool) -> None:
    ensure_vector_index(conn, source)
    if metadata:
        conn.execute(
            sql.SQL("create index {name} on {table} using gin (metadata jsonb_path_ops)").format(
                name=sql.Identifier(f"{source.table_name}_agentdb_meta"), table=source.table
            )
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
        # Registering the same table under the same name again is a no-op; anything else is a conflict.
        existing = get_source(conn, name) if _source_exists(conn, name) else None
        if (
            existing is not None
            and (existing.kind, existing.table_schema, existing.table_name) == ("table", schema, table)
            and (existing.id_column, existing.text_columns, existing.title_column)
            == (id_column, text_columns, title_column)
        ):
            return existing
        raise StorageKindMismatch(
            f"table {schema}.{table} is already registered (it has agentdb's columns)"
            + (f" as source {existing.name!r} with other columns" if existing is not None else ""),
            path="table",
            hint="register it again with the same name and columns, or drop the source that registered it",
        )
    named = [("id_column", id_column)] + [(f"text_columns[{i}]", c) for i, c in enumerate(text_columns)]
    for path, column in named + ([("title_column", title_column)] if title_column else []):
        if column not in columns:
            raise InvalidParamValue(f"table {schema}.{table} has no column {column!r}", path=path)
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
    with conn.transaction():
        if _source_exists(conn, name):
            raise source_name_taken(name)
        _check_ts_config(conn, ts_config)
        _insert_source(
            conn,
            {
                "name": name,
                "kind": "table",
                "table_schema": schema,
                "table_name": table,
                "id_column": id_column,
                "text_columns": text_columns,
                "fields": Jsonb([f.model_dump() for f in fields]),
                "embedding_model": embedding_model,
                "embedding_dim": embedding_dim,
                "ts_config": ts_config,
                "bm25_k1": bm25_k1,
                "bm25_b": bm25_b,
                "chunk_size": 256,
                "chunk_overlap": 32,
                "title_column": title_column,
            },
        )
        source = get_source(conn, name)
        document = sql.SQL(" || ' ' || ").join(
            sql.SQL("coalesce({}, '')").format(sql.Identifier(c)) for c in text_columns
        )
        conn.execute(
            sql.SQL(
                "alter table {table}"
                " add column agentdb_chunk_id bigint generated always as identity unique,"
                " add column agentdb_embedding vector({dim}),"
                " add column agentdb_tsv tsvector generated always as (to_tsvector({cfg}::regconfig, {doc})) stored"
            ).format(
                table=source.table, dim=sql.Literal(embedding_dim), cfg=sql.Literal(ts_config), doc=document
            )
        )
        # A changed text makes the stored embedding stale: clear it so `embed_missing` recomputes it.
        conn.execute(
            sql.SQL(
                "create trigger agentdb_stale_embedding before update of {cols} on {table}"
                " for each row execute function agentdb.clear_stale_embedding()"
            ).format(cols=sql.SQL(", ").join(sql.Identifier(c) for c in text_columns), table=source.table)
        )
        _store_rows_inline(conn, source)
        _create_indexes(conn, source, metadata=False)
        # The embedding queue: rows without a vector (new, or whose text changed), found by this index.
        conn.execute(
            sql.SQL("create index {} on {} (agentdb_chunk_id) where agentdb_embedding is null").format(
                sql.Identifier(f"agentdb_pending_{source.id}"), source.table
            )
        )
        _install_triggers(conn, source)
        conn.execute("select agentdb.lexical_rebuild(%s)", (name,))
    return source


def pending_embeddings(conn: psycopg.Connection[Any], source: Source) -> int:
    """How many rows of a source wait for their embedding (registered tables: new or changed rows)."""
    row = conn.execute(
        sql.SQL("select count(*) from {} where agentdb_embedding is null").format(source.table)
    ).fetchone()
    return int(row[0]) if row else 0


def add_fields(conn: psycopg.Connection[Any], source: Source, new_fields: list[FieldSpec]) -> Source:
    """Add metadata fields discovered during ingestion (document sources only)."""
    if not new_fields:
        return source
    if source.kind != "documents":
        raise StorageContentError(f"source {source.name!r} is a registered table; its fields are its columns")
    with conn.transaction():
        # Merge with the fields as stored now, under a row lock: a concurrent ingestion may have added some
        # since `source` was read, and a plain overwrite would lose them.
        row = conn.execute(
            "select fields from agentdb.sources where id = %s for no key update", (source.id,)
        ).fetchone()
        current = [FieldSpec.model_validate(f) for f in (row[0] if row else [])]
        known = {f.name: f for f in current}
        for f in new_fields:
            if f.name in known and known[f.name].type != f.type:
                raise StorageContentError(
                    f"field {f.name!r} of source {source.name!r} is {known[f.name].type}, not {f.type}",
                    path=f"fields.{f.name}",
                )
        merged = [*current, *(f for f in new_fields if f.name not in known)]
        conn.execute(
            "update agentdb.sources set fields = %s where id = %s",
            (Jsonb([f.model_dump() for f in merged]), source.id),
        )
    return source.model_copy(update={"fields": merged})


def drop_source(conn: psycopg.Connection[Any], name: str) -> None:
    """Remove a source. A document table is dropped; a registered table keeps its rows but loses agentdb's
    columns and triggers."""
    source = get_source(conn, name)
    with conn.transaction():
        if source.kind == "documents":
            conn.execute(sql.SQL("drop table {}").format(source.table))
            if source.distributed:  # its postings do not reference the catalog (agentdb/db/distribute.py)
                conn.execute("delete from agentdb.postings where source_id = %s", (source.id,))
        else:
            for trigger in (
                "agentdb_lex_insert",
                "agentdb_lex_delete",
                "agentdb_lex_update",
                "agentdb_lex_truncate",
                "agentdb_stale_embedding",
            ):
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


def record_embedding_backends(conn: psycopg.Connection[Any], source: Source, backends: list[str]) -> None:
    """Note that `backends` computed some of `source`'s stored vectors (run as the application: principals
    do not write the catalog)."""
    conn.execute(
        "update agentdb.sources set embedding_backends ="
        " array(select distinct b from unnest(embedding_backends || %s::text[]) b order by b)"
        " where id = %s and not embedding_backends @> %s::text[]",
        (backends, source.id, backends),
    )


def source_counts(conn: psycopg.Connection[Any], source: Source) -> dict[str, int]:
    """How many documents and chunks a source holds (as the connection's role may see them)."""
    column = "doc_id" if source.kind == "documents" else source.id_column
    row = conn.execute(
        sql.SQL("select count(distinct {}), count(*) from {}").format(sql.Identifier(column), source.table)
    ).fetchone()
    return {"documents": int(row[0]), "chunks": int(row[1])} if row else {"documents": 0, "chunks": 0}


def rebuild_lexical(conn: psycopg.Connection[Any], name: str) -> None:
    """Recompute source `name`'s lexical index from its rows (agentdb.lexical_rebuild, in a transaction of its
    own; `agentdb check --repair`), then leave it as a bulk load leaves it (ingest.pipeline.analyze_source):
    partly filled blocks merged, the index tables vacuumed (the old postings' space free again, the visibility
    map set for index-only scans) and analyzed (the planner's statistics are of the index before)."""
    from agentdb.db import run_sql
    from agentdb.ingest.pipeline import analyze_source

    with conn.transaction():
        run_sql(conn, "select agentdb.lexical_rebuild(%(s)s)", {"s": name})
    analyze_source(conn, get_source(conn, name))


def optimize_source(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    layout: Literal["rows", "blocks"] | None = None,
    slices: int = MERGE_SLICES,
    workers: int = MERGE_WORKERS,
) -> tuple[int, int]:
    """Move a source's lexical index to `layout` when given (rebuilt from its rows), then merge its partly
    filled posting blocks. Returns the number of blocks before and after the merge (0, 0 for 'rows').

    The merge goes through the vocabulary in up to `slices` term ranges of about equal postings, each in a
    transaction of its own, with a plain VACUUM of the block table after each range that changed: the next
    range's new blocks then reuse the space of the versions it freed, and the table's file ends near the size
    of its live data instead of growing by the whole rewritten index. Every range is a complete merge of its
    terms, so the index equals the documents at every commit. The ranges are disjoint, so `workers`
    connections (this one and new ones to the same server) merge them at once; writers wait for each range as
    before, and a second optimize of the same source waits for this one. On a connection inside a transaction
    (where VACUUM cannot run) the merge is one statement, as with `slices=1`."""
    from agentdb.db import can_vacuum, run_sql

    rebuilt = layout is not None and get_source(conn, name).lexical_layout != layout
    if layout is not None:
        with conn.transaction():
            run_sql(conn, "select agentdb.lexical_set_layout(%(s)s, %(l)s)", {"s": name, "l": layout})
    # The merge joins a source's blocks to its terms: with the statistics of before a bulk load (the source's
    # blocks then few or none) the planner picked a nested loop that ran for minutes instead of seconds. A source
    # in rows has nothing to merge (and an unknown one is refused by lexical_optimize below).
    row = conn.execute(
        "select id from agentdb.sources where name = %s and lexical_layout = 'blocks'", (name,)
    ).fetchone()
    blocks_source = row[0] if row else None
    if blocks_source is not None:
        conn.execute("analyze agentdb.posting_blocks")
    vacuum = can_vacuum(conn)
    bounds: list[str] = []
    if vacuum and slices > 1 and blocks_source is not None:
        (bounds,) = conn.execute(
            "select agentdb_internal.lexical_slice_bounds(%s, %s)", (blocks_source, slices)
        ).fetchone() or ([],)
    edges: list[str | None] = [None, *bounds, None]
    ranges = list(zip(edges[:-1], edges[1:], strict=True))

    def merge(own: psycopg.Connection[Any], lo: str | None, hi: str | None) -> tuple[int, int]:
        with own.transaction():
            ((b, a),) = run_sql(
                own,
                "select * from agentdb.lexical_optimize(%(s)s, %(lo)s, %(hi)s)",
                {"s": name, "lo": lo, "hi": hi},
            )
        if vacuum and b != a:
            # A plain VACUUM blocks neither readers nor writers; without truncating the file's empty tail, which
            # would take an exclusive lock (replayed on standbys); term_stats too, whose rows each range updated.
            own.execute("vacuum (truncate false) agentdb.posting_blocks, agentdb.term_stats")
        return int(b), int(a)

    if len(ranges) == 1 or workers <= 1:
        counts = [merge(conn, lo, hi) for lo, hi in ranges]
    else:
        counts = _merge_in_parallel(conn, blocks_source, ranges, min(workers, len(ranges)), merge)
    if rebuilt:
        # The old layout's postings are dead versions now, and the planner's statistics are of before.
        tables = "agentdb.postings, agentdb.posting_blocks, agentdb.term_stats"
        conn.execute(f"vacuum (analyze, truncate false) {tables}" if vacuum else f"analyze {tables}")
    return sum(b for b, _ in counts), sum(a for _, a in counts)


def _merge_in_parallel(
    conn: psycopg.Connection[Any],
    source_id: int | None,
    ranges: list[tuple[str | None, str | None]],
    workers: int,
    merge: Callable[[psycopg.Connection[Any], str | None, str | None], tuple[int, int]],
) -> list[tuple[int, int]]:
    """Merge term `ranges` on `conn` and `workers - 1` new connections to its server, each taking the next
    range; under a session advisory lock on the source, so that two optimizes of one source never merge the
    same range at once (agentdb.lexical_optimize lets disjoint ranges run together). The first error is
    raised once every worker has stopped; the ranges merged until then stay merged (each is complete)."""
    from agentdb.db.pool import configure

    todo = list(reversed(ranges))
    counts: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(own: psycopg.Connection[Any]) -> None:
        while True:
            with lock:
                if errors or not todo:
                    return
                lo, hi = todo.pop()
            try:
                result = merge(own, lo, hi)
            except BaseException as exc:  # re-raised by the caller's thread below
                with lock:
                    errors.append(exc)
                return
            with lock:
                counts.append(result)

    # A connection the server refuses (max_connections reached, say) leaves its share to the others.
    extra: list[psycopg.Connection[Any]] = []
    for _ in range(workers - 1):
        try:
            extra.append(
                psycopg.connect(make_conninfo(conn.info.dsn, password=conn.info.password), autocommit=True)
            )
        except psycopg.OperationalError:
            break
    conn.execute("select pg_advisory_lock(%s, %s)", (MERGE_LOCK_KEY, source_id))
    try:
        for own in extra:
            configure(own)
        threads = [threading.Thread(target=work, args=(own,)) for own in extra]
        for thread in threads:
            thread.start()
        work(conn)
        for thread in threads:
            thread.join()
    finally:
        conn.execute("select pg_advisory_unlock(%s, %s)", (MERGE_LOCK_KEY, source_id))
        for own in extra:
            own.close()
    if errors:
        raise errors[0]
    return counts
