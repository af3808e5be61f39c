"""Reads from a memory store by key: a record (with the entities it mentions and the relations it asserted)
and an entity (with the relations around it and the records that mention it), under the caller's role."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from agentdb.auth import Principal, read_scope
from agentdb.errors import StorageFileNotFound
from agentdb.memory.models import EntityOut, Fact, MemoryRecord
from agentdb.memory.names import resolve_store_name
from agentdb.memory.store import Store, allowed, entity_keys, get_store, lock

_FACTS = """
select r.id, s.name as subject, r.predicate, o.name as object, r.valid_from, r.invalid_from,
       r.invalid_from is null as current, r.record_id
from {rel} r join {ent} s on s.id = r.subject join {ent} o on o.id = r.object
where {where} and (r.invalid_from is null or %(history)s)
order by r.valid_from desc, r.id
limit 1000
"""


def _facts(conn: psycopg.Connection[Any], store: Store, where: str, params: dict[str, Any]) -> list[Fact]:
    query = sql.SQL(_FACTS).format(
        rel=store.table("relations"), ent=store.table("entities"), where=sql.SQL(where)
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return [Fact.model_validate(row) for row in cur.execute(query, params).fetchall()]


def get_record(
    conn: psycopg.Connection[Any],
    store: str,
    record_id: str,
    *,
    principal: Principal | None = None,
    variables: Mapping[str, Any] | None = None,
    touch: bool = True,
) -> MemoryRecord:
    """Record `record_id` of the caller's store, read through the one scoped reader (agentdb.read) under the
    caller's role, with the entities it mentions and the relations it asserted (history too); reading it
    updates its last-accessed time. 3010 when there is no such record (or store)."""
    from agentdb.scoped_reader import read

    allowed(principal)
    name = resolve_store_name(store, variables)
    target = get_store(conn, name, principal=principal)
    with conn.transaction(), read_scope(conn, principal):
        if touch:
            lock(conn, target)
        rows = read(conn, target.source.name, [record_id])
        if not rows:
            raise StorageFileNotFound(f"memory store {name!r} has no record {record_id!r}", path="id")
        touched = sql.SQL(
            "update {} set last_accessed_at = greatest(last_accessed_at, now()) where doc_id = %s"
            " returning importance, created_at, last_accessed_at, superseded_at"
            if touch
            else "select importance, created_at, last_accessed_at, superseded_at from {} where doc_id = %s"
        ).format(target.table("records"))
        with conn.cursor(row_factory=dict_row) as cur:
            extra = cur.execute(touched, (record_id,)).fetchone()
        if extra is None:
            raise StorageFileNotFound(f"memory store {name!r} has no record {record_id!r}", path="id")
        entities = [
            r[0]
            for r in conn.execute(
                sql.SQL(
                    "select e.name from {} m join {} e on e.id = m.entity_id where m.record_id = %s order by e.name"
                ).format(target.table("mentions"), target.table("entities")),
                (record_id,),
            ).fetchall()
        ]
        facts = _facts(conn, target, "r.record_id = %(id)s", {"id": record_id, "history": True})
    return MemoryRecord(
        id=rows[0].doc_id,
        text=rows[0].text or "",
        metadata=rows[0].metadata,
        importance=extra["importance"],
        created_at=extra["created_at"],
        last_accessed_at=extra["last_accessed_at"],
        current=extra["superseded_at"] is None,
        superseded_at=extra["superseded_at"],
        entities=entities,
        relations=facts,
    )


def get_entity(
    conn: psycopg.Connection[Any],
    store: str,
    entity: str,
    *,
    principal: Principal | None = None,
    variables: Mapping[str, Any] | None = None,
    include_history: bool = False,
) -> EntityOut:
    """Entity `entity` (its name, matched exactly up to case) with the relations around it in both directions
    and the records that mention it; 3010 when there is none."""
    allowed(principal)
    name = resolve_store_name(store, variables)
    target = get_store(conn, name, principal=principal)
    key = entity_keys(conn, [entity])[entity]
    with read_scope(conn, principal), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            sql.SQL("select id, name, kind, metadata from {} where key = %s").format(
                target.table("entities")
            ),
            (key,),
        ).fetchone()
        if row is None:
            raise StorageFileNotFound(f"memory store {name!r} has no entity {entity!r}", path="entity")
        facts = _facts(
            conn,
            target,
            "(r.subject = %(id)s or r.object = %(id)s)",
            {"id": row["id"], "history": include_history},
        )
        records = [
            r["record_id"]
            for r in cur.execute(
                sql.SQL("select record_id from {} where entity_id = %s order by record_id limit 1000").format(
                    target.table("mentions")
                ),
                (row["id"],),
            ).fetchall()
        ]
    return EntityOut(
        id=row["id"],
        name=row["name"],
        kind=row["kind"],
        metadata=row["metadata"] or {},
        relations=facts,
        records=records,
    )


__all__ = ["get_entity", "get_record"]
