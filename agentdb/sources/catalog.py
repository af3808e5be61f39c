"""The catalog of searchable sources (agentdb.sources): the Source and FieldSpec models, names, reads, the
new source's row, fields found by ingestion, counts."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentdb.errors import InvalidParamValue, StorageContentError, StorageFileNotFound, StorageKindMismatch

SOURCE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


DOCS_SCHEMA = "agentdb_docs"


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
    # A document source's tenant field (migrations/0024): a string metadata field every document carries; on a
    # Citus coordinator the source is distributed by it (agentdb/db/distribute.py). None: by document id.
    tenant_field: str | None = None
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
    " embedding_backends, lexical_layout, distributed, title_column, tenant_field"
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


def source_exists(conn: psycopg.Connection[Any], name: str) -> bool:
    return conn.execute("select 1 from agentdb.sources where name = %s", (name,)).fetchone() is not None


def insert_source(conn: psycopg.Connection[Any], values: dict[str, Any], fields: list[FieldSpec]) -> Source:
    """Record a new source and its statistics row in the catalog, in the caller's transaction, and return it:
    StorageKindMismatch (3011) when the name is taken, InvalidParamValue for an unknown text search
    configuration."""
    if source_exists(conn, values["name"]):
        raise source_name_taken(values["name"])
    _check_ts_config(conn, values["ts_config"])
    row = conn.execute(
        "insert into agentdb.sources (name, kind, table_schema, table_name, id_column, text_columns, fields,"
        " embedding_model, embedding_dim, ts_config, bm25_k1, bm25_b, chunk_size, chunk_overlap, lexical_layout,"
        " distributed, title_column, tenant_field)"
        " values (%(name)s, %(kind)s, %(table_schema)s, %(table_name)s, %(id_column)s, %(text_columns)s,"
        " %(fields)s, %(embedding_model)s, %(embedding_dim)s, %(ts_config)s::regconfig, %(bm25_k1)s,"
        " %(bm25_b)s, %(chunk_size)s, %(chunk_overlap)s, %(lexical_layout)s, %(distributed)s, %(title_column)s,"
        " %(tenant_field)s) returning id",
        {
            "lexical_layout": "rows",
            "distributed": False,
            "title_column": None,
            "tenant_field": None,
            **values,
            "fields": Jsonb([f.model_dump() for f in fields]),
        },
    ).fetchone()
    assert row is not None
    conn.execute("insert into agentdb.corpus_stats (source_id) values (%s)", (row[0],))
    return get_source(conn, values["name"])


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


def pending_embeddings(conn: psycopg.Connection[Any], source: Source) -> int:
    """How many rows of a source wait for their embedding (registered tables: new or changed rows)."""
    row = conn.execute(
        sql.SQL("select count(*) from {} where agentdb_embedding is null").format(source.table)
    ).fetchone()
    return int(row[0]) if row else 0
