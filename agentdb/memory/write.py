"""Writes to a memory store: records (one or many, with the entities they mention and the relations they
assert), entities, relations, and deletes by key (reads by key are agentdb.memory.read).

Everything a write sends is validated before anything is written (3007 with the JSON path of the bad value),
then written in one transaction under the caller's role: a write is all or nothing. Records are embedded
before the transaction and are searchable (BM25 postings, HNSW) the moment it commits. No model is needed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ValidationError

from agentdb.auth import Principal, read_scope, writes_under_role
from agentdb.config import DEFAULT_MODEL
from agentdb.db import run_sql
from agentdb.embed import Embedder, check_vector
from agentdb.errors import Conflict, InvalidParamValue, StorageContentError, StorageFileNotFound
from agentdb.llm import Model
from agentdb.memory.extract import extract
from agentdb.memory.models import (
    EntityIn,
    RecordIn,
    RelationIn,
    RelationResult,
    StoreSpec,
    WriteReport,
    fact_text,
)
from agentdb.memory.names import resolve_store_name
from agentdb.memory.store import (
    Store,
    allowed,
    check_fields,
    check_spec,
    create_store,
    entity_keys,
    find_store,
    get_store,
    lock,
)
from agentdb.sources import FieldSpec, coerce_value, write_lexical

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


def _where(path: str, loc: Sequence[Any]) -> str:
    out = path
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def parse_items(model: type[M], items: Sequence[Any], path: str) -> list[M]:
    """Validate each item as `model`; the first bad value is 3007 at its JSON path (`records[2].importance`)."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise InvalidParamValue(f"{path} must be a list", path=path)
    parsed = []
    for i, item in enumerate(items):
        if isinstance(item, model):
            parsed.append(item)
            continue
        try:
            parsed.append(model.model_validate(item))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = _where(f"{path}[{i}]", error["loc"])
            raise InvalidParamValue(f"{where}: {error['msg']}", path=where) from None
    return parsed


def coerce_metadata(fields: list[FieldSpec], metadata: Mapping[str, Any], path: str) -> dict[str, Any]:
    """A record's metadata checked against the store's record schema: every key a declared field of the
    right type (3007 at `path.key` otherwise), null values dropped, defaults of required fields filled."""
    known = {f.name: f for f in fields}
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        spec = known.get(key)
        if spec is None:
            names = ", ".join(known) or "no fields"
            raise InvalidParamValue(
                f"unknown field {key!r}: the store's record schema has {names}",
                path=f"{path}.{key}",
                hint="declare the field in the store's `fields` when the store is created",
            )
        if value is None:
            continue
        try:
            out[key] = coerce_value(spec, value)
        except ValueError as exc:
            raise InvalidParamValue(
                f"field {key!r}: {exc} (the field is {spec.type})", path=f"{path}.{key}"
            ) from None
    for spec in fields:
        if spec.name not in out and not spec.optional:
            out[spec.name] = spec.default
    return out


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _vector_text(values: Sequence[float] | np.ndarray) -> str:
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


def _record_entities(records: list[RecordIn]) -> list[EntityIn]:
    """Every entity the records mention or relate, once per spelling (a full EntityIn wins over a bare name)."""
    found: dict[str, EntityIn] = {}
    for r in records:
        for e in r.entities:
            entity = e if isinstance(e, EntityIn) else EntityIn(name=e)
            if entity.name not in found or found[entity.name].model_fields_set <= {"name"}:
                found[entity.name] = entity
        for rel in r.relations:
            found.setdefault(rel.subject, EntityIn(name=rel.subject))
            found.setdefault(rel.object, EntityIn(name=rel.object))
    return list(found.values())


def _by_key(entities: list[EntityIn], keys: Mapping[str, str]) -> list[EntityIn]:
    """One entity per key (the first spelling), in key order: concurrent writers create entities in the same
    order, so they cannot deadlock on each other's new names."""
    out: dict[str, EntityIn] = {}
    for e in entities:
        out.setdefault(keys[e.name], e)
    return [out[k] for k in sorted(out)]


def _existing_entities(conn: psycopg.Connection[Any], store: Store, keys: list[str]) -> dict[str, int]:
    if not keys:
        return {}
    rows = conn.execute(
        sql.SQL("select key, id from {} where key = any(%s)").format(store.table("entities")), (keys,)
    ).fetchall()
    return {k: int(i) for k, i in rows}


def _check_model(store_model: str, embedder: Embedder | None, store_name: str) -> None:
    if embedder is not None and embedder.model_name != store_model:
        raise StorageContentError(
            f"memory store {store_name!r} embeds with {store_model!r} but the embedder is {embedder.model_name!r}",
            path="embedding_model",
        )


def _embed(embedder: Embedder | None, texts: list[str]) -> list[str | None]:
    if embedder is None or not texts:
        return [None] * len(texts)
    return [_vector_text(v) for v in embedder.embed(texts)]


def _upsert_entities(
    conn: psycopg.Connection[Any],
    store: Store,
    entities: list[EntityIn],
    keys: Mapping[str, str],
    vectors: Mapping[str, str | None],
) -> tuple[dict[str, int], list[str]]:
    """Create the entities that do not exist yet (a concurrent writer's twin is kept); their ids by key and
    the names created. `entities` holds one entity per key, in key order."""
    if not entities:
        return {}, []
    created = conn.execute(
        sql.SQL(
            "insert into {} (name, kind, metadata, embedding)"
            " select n, k, m, e::vector from unnest(%s::text[], %s::text[], %s::jsonb[], %s::text[]) as x(n, k, m, e)"
            " on conflict (key) do nothing returning name"
        ).format(store.table("entities")),
        (
            [e.name for e in entities],
            [e.kind for e in entities],
            [Jsonb(e.metadata) for e in entities],
            [vectors.get(keys[e.name]) for e in entities],
        ),
    ).fetchall()
    ids = _existing_entities(conn, store, [keys[e.name] for e in entities])
    return ids, [r[0] for r in created]


def _entity_vectors(
    conn: psycopg.Connection[Any],
    store: Store | None,
    dim: int,
    entities: list[EntityIn],
    keys: Mapping[str, str],
    embedder: Embedder | None,
    principal: Principal | None,
) -> dict[str, str | None]:
    """Vectors (by key) for the entities that are new: given ones checked, the others embedded by name;
    entities the store has already keep theirs."""
    vectors: dict[str, str | None] = {}
    for i, e in enumerate(entities):
        if e.embedding is not None:
            vectors[keys[e.name]] = _vector_text(check_vector(e.embedding, dim, f"entities[{i}].embedding"))
    known: dict[str, int] = {}
    if store is not None:
        with read_scope(conn, principal):
            known = _existing_entities(conn, store, [keys[e.name] for e in entities])
    missing = [e.name for e in entities if keys[e.name] not in known and keys[e.name] not in vectors]
    for name, vector in zip(missing, _embed(embedder, missing), strict=True):
        vectors[keys[name]] = vector
    return vectors


def _fact(rel: RelationIn) -> str:
    return fact_text(rel.subject, rel.predicate, rel.object)


def _fact_vectors(embedder: Embedder | None, relations: Sequence[RelationIn]) -> dict[str, str | None]:
    """The embedding of each relation as a sentence (recall compares the query with the facts it walks)."""
    texts = sorted({_fact(rel) for rel in relations})
    return dict(zip(texts, _embed(embedder, texts), strict=True))


def _prepared_store(
    conn: psycopg.Connection[Any],
    name: str,
    principal: Principal | None,
    spec: StoreSpec | None,
    create: bool,
) -> tuple[Store | None, list[FieldSpec]]:
    """The existing store (its spec checked against `spec`) and its fields, or None and the fields the write
    will create it with; 3010 when it is missing and the write may not create it."""
    allowed(principal)
    with read_scope(conn, principal):
        store = find_store(conn, name)
    if store is not None:
        check_spec(store, spec)
        return store, store.fields
    if not create:
        raise StorageFileNotFound(f"unknown memory store {name!r}", path="store")
    return None, check_fields(spec.fields if spec else None)


def write_records(
    conn: psycopg.Connection[Any],
    store: str,
    records: Sequence[RecordIn | Mapping[str, Any]],
    *,
    principal: Principal | None = None,
    embedder: Embedder | None = None,
    spec: StoreSpec | None = None,
    variables: Mapping[str, Any] | None = None,
    create: bool = True,
    model: Model | None = None,
    score_importance: bool = False,
    extract_graph: bool = False,
) -> WriteReport:
    """Write `records` to the caller's store `store` (a name template over `variables` allowed), creating it
    with `spec` when it does not exist (and `create`). Returns the ids in order. Everything is checked first
    (3007 at `records[i]...`, 1409 for an id in use) and written in one transaction, so a failing write
    leaves nothing behind, not even a store it would have created.

    Only when asked, a `model` scores the importance of records whose writer gave none (`score_importance`)
    and finds the entities and relations of each record (`extract_graph`), before anything is written."""
    allowed(principal)
    name = resolve_store_name(store, variables)
    parsed = parse_items(RecordIn, records, "records")
    if not parsed:
        raise InvalidParamValue("records must not be empty", path="records")
    if score_importance or extract_graph:
        if model is None:
            raise InvalidParamValue(
                "scoring importance or extracting entities needs a model", path="generator"
            )
        parsed = extract(model, parsed, importance=score_importance, graph=extract_graph)
    _check_unique_ids(parsed)
    existing, fields = _prepared_store(conn, name, principal, spec, create)
    metadata = [coerce_metadata(fields, r.metadata, f"records[{i}].metadata") for i, r in enumerate(parsed)]
    embedding_model = (
        existing.source.embedding_model if existing else (embedder.model_name if embedder else DEFAULT_MODEL)
    )
    dim = existing.source.embedding_dim if existing else (embedder.dim if embedder else 384)
    _check_model(embedding_model, embedder, name)
    vectors = _record_vectors(parsed, dim, embedder)
    ids = [r.id or uuid.uuid4().hex for r in parsed]
    created_at, accessed = _record_times(parsed)
    mentioned = _record_entities(parsed)
    keys = entity_keys(conn, (e.name for e in mentioned))
    entities = _by_key(mentioned, keys)
    entity_vectors = _entity_vectors(conn, existing, dim, entities, keys, embedder, principal)
    fact_vectors = _fact_vectors(embedder, [rel for r in parsed for rel in r.relations])

    with conn.transaction():
        target = existing or create_store(
            conn, name, principal=principal, spec=spec, embedding_model=embedding_model, embedding_dim=dim
        )
        if existing is None:
            # A concurrent first write may have made the store meanwhile: its schema is the one that counts.
            check_spec(target, spec)
            metadata = [
                coerce_metadata(target.fields, r.metadata, f"records[{i}].metadata")
                for i, r in enumerate(parsed)
            ]
        with _write_scope(conn, principal, target):
            lock(conn, target)
            _check_ids_free(conn, target, ids)
            _insert_records(conn, target, ids, parsed, metadata, vectors, created_at, accessed)
            entity_ids, created_names = _upsert_entities(conn, target, entities, keys, entity_vectors)
            mentions = [
                (entity_ids[keys[e if isinstance(e, str) else e.name]], ids[i])
                for i, r in enumerate(parsed)
                for e in [*r.entities, *(n for rel in r.relations for n in (rel.subject, rel.object))]
            ]
            _insert_mentions(conn, target, mentions)
            # Relations are asserted in time order (then write order), so a later fact closes an earlier one.
            asserted = sorted(
                (
                    (_utc(rel.valid_from) or created_at[i], i, rel)
                    for i, r in enumerate(parsed)
                    for rel in r.relations
                ),
                key=lambda t: (t[0], t[1]),
            )
            results = [
                _assert(conn, target, entity_ids, keys, rel, ids[i], valid_from, fact_vectors.get(_fact(rel)))
                for valid_from, i, rel in asserted
            ]
        # On a Citus coordinator the records' postings and statistics, as the application (_write_scope);
        # elsewhere the records table's triggers did it.
        write_lexical(conn, target.source, "add", ids)
    log.info(
        "memory write: store=%s records=%d entities_created=%d relations=%d",
        name,
        len(ids),
        len(created_names),
        len(results),
    )
    return WriteReport(
        store=name,
        created_store=existing is None,
        ids=ids,
        entities_created=created_names,
        relations=results,
    )


def _write_scope(
    conn: psycopg.Connection[Any], principal: Principal | None, store: Store
) -> AbstractContextManager[Any]:
    """Where the writes to `store`'s records run: under the principal's role, or as the application where
    they cannot (auth.writes_under_role: on a Citus coordinator). The store is the principal's own either way:
    it was found, or made for it, under its role, and the writes name only its tables."""
    return read_scope(conn, principal if writes_under_role(principal, store.source) else None)


def _check_unique_ids(parsed: Sequence[RecordIn]) -> None:
    """3007 at the second of two records of one write that give the same id."""
    seen: set[str] = set()
    for i, r in enumerate(parsed):
        if r.id is not None:
            if r.id in seen:
                raise InvalidParamValue(
                    f"record id {r.id!r} appears twice in the write", path=f"records[{i}].id"
                )
            seen.add(r.id)


def _record_vectors(parsed: Sequence[RecordIn], dim: int, embedder: Embedder | None) -> list[str | None]:
    """Each record's vector as pgvector text: the writer's own (checked against the store's dimension), else
    the embedder's, computed for all the records that need one in one batch."""
    vectors: list[str | None] = [
        None
        if r.embedding is None
        else _vector_text(check_vector(r.embedding, dim, f"records[{i}].embedding"))
        for i, r in enumerate(parsed)
    ]
    todo = [i for i, v in enumerate(vectors) if v is None]
    for i, v in zip(todo, _embed(embedder, [parsed[i].text for i in todo]), strict=True):
        vectors[i] = v
    return vectors


def _record_times(parsed: Sequence[RecordIn]) -> tuple[list[datetime], list[datetime]]:
    """Each record's created and last-accessed times in UTC (now, and its creation, when not given); 3007
    when it was accessed before it was created."""
    now = datetime.now(UTC)
    created_at = [_utc(r.created_at) or now for r in parsed]
    accessed = [_utc(r.last_accessed_at) or c for r, c in zip(parsed, created_at, strict=True)]
    for i, (c, a) in enumerate(zip(created_at, accessed, strict=True)):
        if a < c:
            raise InvalidParamValue(
                "last_accessed_at is before created_at", path=f"records[{i}].last_accessed_at"
            )
    return created_at, accessed


def _check_ids_free(conn: psycopg.Connection[Any], store: Store, ids: list[str]) -> None:
    """1409 when the store already has a record under one of `ids` (run under the store's lock)."""
    taken = conn.execute(
        sql.SQL("select doc_id from {} where doc_id = any(%s)").format(store.table("records")), (ids,)
    ).fetchone()
    if taken is not None:
        raise Conflict(
            f"memory store {store.name!r} already has a record {taken[0]!r}",
            path=f"records[{ids.index(taken[0])}].id",
            hint="delete it first, or write under another id",
        )


def _insert_records(
    conn: psycopg.Connection[Any],
    store: Store,
    ids: list[str],
    records: list[RecordIn],
    metadata: list[dict[str, Any]],
    vectors: list[str | None],
    created_at: list[datetime],
    accessed: list[datetime],
) -> None:
    conn.execute(
        sql.SQL(
            "insert into {} (doc_id, text, metadata, agentdb_embedding, importance, created_at, last_accessed_at)"
            " select d, t, m, e::vector, i, c, a from unnest(%s::text[], %s::text[], %s::jsonb[], %s::text[],"
            " %s::int[], %s::timestamptz[], %s::timestamptz[]) as x(d, t, m, e, i, c, a)"
        ).format(store.table("records")),
        (
            ids,
            [r.text for r in records],
            [Jsonb(m) for m in metadata],
            vectors,
            [r.importance for r in records],
            created_at,
            accessed,
        ),
    )


def _insert_mentions(conn: psycopg.Connection[Any], store: Store, mentions: list[tuple[int, str]]) -> None:
    if not mentions:
        return
    conn.execute(
        sql.SQL(
            "insert into {} (entity_id, record_id) select distinct e, r from unnest(%s::bigint[], %s::text[]) x(e, r)"
            " on conflict do nothing"
        ).format(store.table("mentions")),
        ([m[0] for m in mentions], [m[1] for m in mentions]),
    )


def _assert(
    conn: psycopg.Connection[Any],
    store: Store,
    entity_ids: Mapping[str, int],
    keys: Mapping[str, str],
    rel: RelationIn,
    record_id: str | None,
    valid_from: datetime,
    embedding: str | None = None,
) -> RelationResult:
    single = rel.single_valued if rel.single_valued is not None else rel.predicate in store.single_valued
    row = run_sql(
        conn,
        "select agentdb_internal.memory_assert(store_id => %(store)s, subject => %(s)s, predicate => %(p)s,"
        " object => %(o)s, record_id => %(rec)s, valid_from => %(from)s, single => %(single)s,"
        " embedding => %(embedding)s::vector)",
        {
            "store": store.id,
            "s": entity_ids[keys[rel.subject]],
            "p": rel.predicate,
            "o": entity_ids[keys[rel.object]],
            "rec": record_id,
            "from": valid_from,
            "single": single,
            "embedding": embedding,
        },
    )[0][0]
    return RelationResult(
        id=int(row["id"]),
        subject=rel.subject,
        predicate=rel.predicate,
        object=rel.object,
        status=row["status"],
        closed=[int(c) for c in row["closed"]],
    )


def write_entities(
    conn: psycopg.Connection[Any],
    store: str,
    entities: Sequence[EntityIn | Mapping[str, Any]],
    *,
    principal: Principal | None = None,
    embedder: Embedder | None = None,
    variables: Mapping[str, Any] | None = None,
) -> list[str]:
    """Add entities to the caller's existing store (names already there are kept as they are); returns the
    names created."""
    allowed(principal)
    name = resolve_store_name(store, variables)
    parsed = parse_items(EntityIn, entities, "entities")
    target = get_store(conn, name, principal=principal)
    _check_model(target.source.embedding_model, embedder, name)
    keys = entity_keys(conn, (e.name for e in parsed))
    unique = _by_key(parsed, keys)
    vectors = _entity_vectors(conn, target, target.source.embedding_dim, unique, keys, embedder, principal)
    with conn.transaction(), read_scope(conn, principal):
        lock(conn, target)
        _, created = _upsert_entities(conn, target, unique, keys, vectors)
    return created


def write_relations(
    conn: psycopg.Connection[Any],
    store: str,
    relations: Sequence[RelationIn | Mapping[str, Any]],
    *,
    principal: Principal | None = None,
    embedder: Embedder | None = None,
    variables: Mapping[str, Any] | None = None,
) -> list[RelationResult]:
    """Assert relations in the caller's existing store, creating their entities; each may name the record
    that asserted it (3007 at `relations[i].record_id` when the store has no such record). A relation that
    contradicts a current one of a single-valued predicate closes it (see agentdb_internal.memory_assert)."""
    allowed(principal)
    name = resolve_store_name(store, variables)
    parsed = parse_items(RelationIn, relations, "relations")
    target = get_store(conn, name, principal=principal)
    _check_model(target.source.embedding_model, embedder, name)
    named = [EntityIn(name=n) for rel in parsed for n in (rel.subject, rel.object)]
    keys = entity_keys(conn, (e.name for e in named))
    entities = _by_key(named, keys)
    vectors = _entity_vectors(conn, target, target.source.embedding_dim, entities, keys, embedder, principal)
    fact_vectors = _fact_vectors(embedder, parsed)
    now = datetime.now(UTC)
    with conn.transaction(), read_scope(conn, principal):
        lock(conn, target)
        wanted = sorted({r.record_id for r in parsed if r.record_id is not None})
        found = {
            row[0]
            for row in conn.execute(
                sql.SQL("select doc_id from {} where doc_id = any(%s)").format(target.table("records")),
                (wanted,),
            ).fetchall()
        }
        for i, rel in enumerate(parsed):
            if rel.record_id is not None and rel.record_id not in found:
                raise InvalidParamValue(
                    f"memory store {name!r} has no record {rel.record_id!r}", path=f"relations[{i}].record_id"
                )
        entity_ids, _ = _upsert_entities(conn, target, entities, keys, vectors)
        order = sorted(range(len(parsed)), key=lambda i: (_utc(parsed[i].valid_from) or now, i))
        results: dict[int, RelationResult] = {}
        for i in order:
            rel = parsed[i]
            if rel.record_id is not None:
                _insert_mentions(
                    conn,
                    target,
                    [
                        (entity_ids[keys[rel.subject]], rel.record_id),
                        (entity_ids[keys[rel.object]], rel.record_id),
                    ],
                )
            results[i] = _assert(
                conn,
                target,
                entity_ids,
                keys,
                rel,
                rel.record_id,
                _utc(rel.valid_from) or now,
                fact_vectors.get(_fact(rel)),
            )
    return [results[i] for i in range(len(parsed))]


def delete_record(
    conn: psycopg.Connection[Any],
    store: str,
    record_id: str,
    *,
    principal: Principal | None = None,
    variables: Mapping[str, Any] | None = None,
) -> None:
    """Delete record `record_id` with its mentions and the relations it asserted (relations it had closed stay
    in history); its postings go in the same transaction. 3010 when there is no such record."""
    allowed(principal)
    name = resolve_store_name(store, variables)
    target = get_store(conn, name, principal=principal)
    with conn.transaction():
        lock(conn, target)
        write_lexical(conn, target.source, "remove", [record_id])  # on a Citus coordinator (write_records)
        with _write_scope(conn, principal, target):
            gone = conn.execute(
                sql.SQL("delete from {} where doc_id = %s returning doc_id").format(target.table("records")),
                (record_id,),
            ).fetchall()
    if not gone:
        raise StorageFileNotFound(f"memory store {name!r} has no record {record_id!r}", path="id")


__all__ = [
    "coerce_metadata",
    "delete_record",
    "parse_items",
    "write_entities",
    "write_records",
    "write_relations",
]
