"""Memory stores: the catalog (agentdb.memory_stores) and the tables of each store (sql/080_memory.sql).

A store is found by name for the active role: under a principal's role (`read_scope`) its own store of that
name, otherwise the application's. The lookup is a SECURITY DEFINER function that reads the owner from the
role, so the database, not the request handling, decides whose store a name means. Creating and dropping a
store is DDL, done by the application for the owner it names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentdb.auth import Principal, check_tool, read_scope
from agentdb.db import run_sql
from agentdb.errors import InvalidParamValue, StorageFileNotFound, StorageKindMismatch
from agentdb.memory.models import StoreInfo, StoreSpec, normalise_predicate
from agentdb.memory.names import resolve_store_name
from agentdb.sources import RESERVED_FIELDS, FieldSpec, Source, get_source

SCHEMA = "agentdb_memory"
# Record columns that are not metadata fields: a field of the record schema may not take these names either.
RECORD_COLUMNS = frozenset({"importance", "created_at", "last_accessed_at", "superseded_at", "entities"})


@dataclass(frozen=True)
class Store:
    """A memory store as its owner sees it: its catalog row and the source of its records table."""

    id: int
    name: str
    owner: int | None
    source: Source
    schema_name: str | None
    single_valued: tuple[str, ...]
    created_at: datetime

    @property
    def fields(self) -> list[FieldSpec]:
        return self.source.fields

    def table(self, what: str) -> sql.Composed:
        """One of the store's tables: records, entities, relations or mentions."""
        return sql.SQL("{}.{}").format(sql.Identifier(SCHEMA), sql.Identifier(f"s{self.id}_{what}"))


def _store(conn: psycopg.Connection[Any], row: dict[str, Any]) -> Store:
    source_row = conn.execute(
        "select name from agentdb.sources where id = %s", (row["source_id"],)
    ).fetchone()
    if source_row is None:  # the source is being dropped with the store
        raise StorageFileNotFound(f"unknown memory store {row['name']!r}", path="store")
    return Store(
        id=int(row["id"]),
        name=row["name"],
        owner=row["owner"],
        source=get_source(conn, source_row[0]),
        schema_name=row["schema_name"],
        single_valued=tuple(row["single_valued"] or ()),
        created_at=row["created_at"],
    )


def find_store(conn: psycopg.Connection[Any], name: str) -> Store | None:
    """The active role's store called `name`, or None. Run it inside `read_scope` for a principal."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("select * from agentdb_internal.memory_store(store => %s)", (name,)).fetchone()
    return None if row is None else _store(conn, row)


def get_store(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    principal: Principal | None = None,
    variables: dict[str, Any] | None = None,
) -> Store:
    """The caller's store `name` (a template over `variables` allowed), or 3010 at `store`: a store of another
    owner is not found either, exactly as one that does not exist."""
    resolved = resolve_store_name(name, variables)
    with read_scope(conn, principal):
        store = find_store(conn, resolved)
    if store is None:
        raise StorageFileNotFound(
            f"unknown memory store {resolved!r}", path="store", hint="a store is created by its first write"
        )
    return store


def allowed(principal: Principal | None) -> None:
    """Forbidden (1403) unless the principal (if any) may use the `memory` tool."""
    if principal is not None:
        check_tool(principal, "memory")


def check_fields(fields: list[FieldSpec] | None) -> list[FieldSpec]:
    """A record schema: field names unique and not those of a record's own columns (3007 at fields[i])."""
    seen: set[str] = set()
    for i, field in enumerate(fields or ()):
        if field.name in RESERVED_FIELDS or field.name in RECORD_COLUMNS:
            raise InvalidParamValue(f"field name {field.name!r} is reserved", path=f"fields[{i}].name")
        if field.name in seen:
            raise InvalidParamValue(f"field {field.name!r} is declared twice", path=f"fields[{i}].name")
        seen.add(field.name)
    return list(fields or ())


def check_spec(store: Store, spec: StoreSpec | None) -> None:
    """3011 StorageKindMismatch when a write (or a saved agent's Retrieve step) expects another schema than
    the store's: another schema name, or other fields."""
    if spec is None:
        return
    if spec.schema_name is not None and spec.schema_name != store.schema_name:
        raise StorageKindMismatch(
            f"memory store {store.name!r} has schema {store.schema_name!r}, not {spec.schema_name!r}",
            path="schema",
        )
    if spec.fields is not None:
        mine = sorted((f.model_dump() for f in store.fields), key=lambda f: f["name"])
        theirs = sorted((f.model_dump() for f in spec.fields), key=lambda f: f["name"])
        if mine != theirs:
            raise StorageKindMismatch(
                f"memory store {store.name!r} has other record fields: "
                + ", ".join(f"{f.name}:{f.type}" for f in store.fields),
                path="fields",
            )
    if spec.single_valued is not None:
        wanted = sorted({normalise_predicate(p) for p in spec.single_valued})
        if wanted != sorted(store.single_valued):
            raise StorageKindMismatch(
                f"memory store {store.name!r} has single-valued predicates {sorted(store.single_valued)}",
                path="single_valued",
            )


def create_store(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    principal: Principal | None = None,
    spec: StoreSpec | None = None,
    embedding_model: str,
    embedding_dim: int,
    ts_config: str = "english",
) -> Store:
    """Create the caller's store `name` (owned by `principal`, or the application) unless it exists, and
    return it. Runs as the application (it is DDL); the owner's role is granted the store's tables."""
    allowed(principal)
    spec = spec or StoreSpec()
    fields = check_fields(spec.fields)
    predicates = [normalise_predicate(p) for p in spec.single_valued or ()]
    run_sql(
        conn,
        "select agentdb.memory_create_store(owner => %(owner)s, name => %(name)s, fields => %(fields)s,"
        " embedding_model => %(model)s, embedding_dim => %(dim)s, ts_config => %(cfg)s::regconfig,"
        " single_valued => %(single)s, schema_name => %(schema)s)",
        {
            "owner": None if principal is None else principal.id,
            "name": name,
            "fields": Jsonb([f.model_dump() for f in fields]),
            "model": embedding_model,
            "dim": embedding_dim,
            "cfg": ts_config,
            "single": predicates,
            "schema": spec.schema_name,
        },
    )
    with read_scope(conn, principal):
        store = find_store(conn, name)
    assert store is not None
    return store


def list_stores(conn: psycopg.Connection[Any], *, principal: Principal | None = None) -> list[StoreInfo]:
    """The caller's stores with their counts; another owner's never appear (the database lists them)."""
    allowed(principal)
    out = []
    with read_scope(conn, principal):
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute("select * from agentdb_internal.memory_list()").fetchall()
        for row in rows:
            out.append(store_info(conn, _store(conn, row)))
    return out


def store_info(conn: psycopg.Connection[Any], store: Store) -> StoreInfo:
    """A store's description and counts, counted under the connection's current role."""
    row = conn.execute(
        sql.SQL(
            "select (select count(*) from {}), (select count(*) from {}), (select count(*) from {})"
        ).format(store.table("records"), store.table("entities"), store.table("relations"))
    ).fetchone()
    assert row is not None
    return StoreInfo(
        name=store.name,
        schema_name=store.schema_name,
        fields=store.fields,
        single_valued=list(store.single_valued),
        embedding_model=store.source.embedding_model,
        embedding_dim=store.source.embedding_dim,
        records=int(row[0]),
        entities=int(row[1]),
        relations=int(row[2]),
        created_at=store.created_at,
    )


def drop_store(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    principal: Principal | None = None,
    variables: dict[str, Any] | None = None,
) -> None:
    """Drop the caller's store `name` with its records, entities and relations (3010 when there is none)."""
    allowed(principal)
    resolved = resolve_store_name(name, variables)
    rows = run_sql(
        conn,
        "select agentdb.memory_drop_store(owner => %(owner)s, name => %(name)s)",
        {"owner": None if principal is None else principal.id, "name": resolved},
    )
    if not rows or not rows[0][0]:
        raise StorageFileNotFound(f"unknown memory store {resolved!r}", path="store")


__all__ = [
    "Store",
    "allowed",
    "check_fields",
    "check_spec",
    "create_store",
    "drop_store",
    "find_store",
    "get_store",
    "list_stores",
    "store_info",
]


def entity_keys(conn: psycopg.Connection[Any], names: Iterable[str]) -> dict[str, str]:
    """The key each name is matched by (agentdb_internal.memory_key: lower case, punctuation around words
    dropped), computed by the database so that it is exactly the key stored and searched."""
    unique = list(dict.fromkeys(names))
    if not unique:
        return {}
    rows = conn.execute(
        "select n, agentdb_internal.memory_key(name => n) from unnest(%s::text[]) n", (unique,)
    ).fetchall()
    return {n: k for n, k in rows}


def lock(conn: psycopg.Connection[Any], store: Store) -> None:
    """Take the store's write lock for the rest of the transaction (agentdb_internal.memory_lock): writers of
    one store queue here before anything else, so they cannot deadlock."""
    conn.execute("select agentdb_internal.memory_lock(store_id => %s)", (store.id,))
