"""Memory stores over HTTP: write records (one or many, transactional), read and delete them by key, recall
with the explanation of every candidate's terms, and write entities and relations of the store's graph.

Every route needs the `memory` tool (403 before anything is read). A store is the caller's own: a principal
reads and writes its stores under its database role, and another principal's store of the same name is not
found (404), exactly as a store that does not exist. Store names may be templates over request variables:
`/memory/user_{var.user_id}/records?var.user_id=42` (or `"vars": {...}` in a write's body).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from functools import partial
from typing import Any, Literal

import psycopg
from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from agentdb.api.access import BEARER, principal, request_principal
from agentdb.api.guard import parse_json
from agentdb.api.routing import DatabaseRoute, ReadWish, connection, read_wish, request_connection
from agentdb.auth import Principal, check_tool
from agentdb.config import MEMORY_DECAY, MEMORY_HALF_LIFE_HOURS
from agentdb.embed import load_embedder
from agentdb.errors import InvalidParamValue, parse_params
from agentdb.filters import filter_from_text
from agentdb.llm import resolve_model
from agentdb.memory import (
    AssembledMemory,
    EntityOut,
    MemoryRecord,
    RecallResult,
    RelationResult,
    StoreInfo,
    StoreSpec,
    WriteReport,
    assemble,
    delete_record,
    drop_store,
    get_entity,
    get_record,
    list_stores,
    recall,
    write_entities,
    write_records,
    write_relations,
)

router = APIRouter(tags=["memory"], route_class=DatabaseRoute)

_SPEC_KEYS = ("fields", "schema", "single_valued")
_MODEL_KEYS = ("score_importance", "extract_graph", "generator")
_WRITE_KEYS = frozenset({"records", "vars", *_SPEC_KEYS, *_MODEL_KEYS})


def _caller(caller: Principal | None) -> None:
    if caller is not None:
        check_tool(caller, "memory")


def _variables(request: Request, body_vars: Any = None) -> dict[str, Any]:
    """Request variables: query parameters `var.NAME=value`, then a body's `vars` object (which wins)."""
    variables: dict[str, Any] = {
        k[4:]: v for k, v in request.query_params.multi_items() if k.startswith("var.") and len(k) > 4
    }
    if body_vars is not None:
        if not isinstance(body_vars, dict):
            raise InvalidParamValue("vars must be an object of names to values", path="vars")
        variables.update(body_vars)
    return variables


def _write_body(body: Any) -> tuple[Any, StoreSpec | None, Any, dict[str, Any]]:
    """A write's body: a record, a list of records, or {"records": [...], "fields", "schema",
    "single_valued", "vars", "score_importance", "extract_graph", "generator"}; returns the records, the
    store spec (when any of its keys is given), vars, and the extraction keys."""
    if isinstance(body, list):
        return body, None, None, {}
    if not isinstance(body, dict):
        raise InvalidParamValue(
            'the body must be a record, a list of records or {"records": [...]}', path="body"
        )
    if "records" not in body:
        return [body], None, None, {}
    for key in body:
        if key not in _WRITE_KEYS:
            raise InvalidParamValue(f"unknown key {key!r}; known: {', '.join(sorted(_WRITE_KEYS))}", path=key)
    given = {k: body[k] for k in _SPEC_KEYS if k in body}
    spec = parse_params(StoreSpec, given, "") if given else None
    extraction = {k: body[k] for k in _MODEL_KEYS if k in body}
    for key in ("score_importance", "extract_graph"):
        if not isinstance(extraction.get(key, False), bool):
            raise InvalidParamValue(f"{key} must be true or false", path=key)
    return body["records"], spec, body.get("vars"), extraction


WRITE_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "oneOf": [
                    {
                        "type": "object",
                        "description": "one record: {text, importance, metadata, entities, ...}",
                    },
                    {"type": "array", "items": {"type": "object"}},
                    {
                        "type": "object",
                        "properties": {
                            "records": {"type": "array", "items": {"type": "object"}},
                            "fields": {"type": "array", "items": {"type": "object"}},
                            "schema": {"type": "string"},
                            "single_valued": {"type": "array", "items": {"type": "string"}},
                            "vars": {"type": "object"},
                            "score_importance": {"type": "boolean"},
                            "extract_graph": {"type": "boolean"},
                            "generator": {"type": "object"},
                        },
                        "required": ["records"],
                    },
                ]
            }
        }
    },
}


@router.get("/memory", response_model=list[StoreInfo], response_model_by_alias=True)
def stores(
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> list[StoreInfo]:
    """The caller's memory stores with their counts (another principal's never appear)."""
    _caller(caller)
    return list_stores(conn, principal=caller)


OBJECTS_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"type": "array", "items": {"type": "object"}}}},
}


async def _upload(request: Request) -> Any:
    """The JSON body of a bulk write, parsed off the event loop: it may be megabytes."""
    return await run_in_threadpool(parse_json, await request.body())


async def _objects(request: Request, what: str) -> list[dict[str, Any]]:
    body = await _upload(request)
    if not isinstance(body, list):
        raise InvalidParamValue(f"expected a JSON array of {what} objects", path="body")
    for i, item in enumerate(body):
        if not isinstance(item, dict):
            raise InvalidParamValue(f"each {what} must be a JSON object", path=f"body[{i}]")
    return body


@router.post(
    "/memory/{store}/records",
    response_model=WriteReport,
    status_code=201,
    openapi_extra={"requestBody": WRITE_BODY},
)
async def add_records(
    store: str,
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> WriteReport:
    """Write records (one or many) in one transaction, creating the store on its first write; a record that
    breaks the store's schema is 3007 at its path and nothing is written. Only when asked (`score_importance`,
    `extract_graph`) does the `generator` model score importance or extract entities and relations."""
    _caller(caller)
    body = await run_in_threadpool(
        parse_json, await request.body()
    )  # a bulk upload: parsed off the event loop
    return await run_in_threadpool(_add_records, store, request, body, conn, caller)


def _add_records(
    store: str, request: Request, body: Any, conn: psycopg.Connection[Any], caller: Principal | None
) -> WriteReport:
    records, spec, body_vars, extraction = _write_body(body)
    wanted = extraction.get("score_importance", False) or extraction.get("extract_graph", False)
    model = (
        resolve_model(extraction.get("generator"), request.app.state.settings, path="generator")
        if wanted
        else None
    )
    return write_records(
        conn,
        store,
        records,
        principal=caller,
        embedder=load_embedder(),
        spec=spec,
        variables=_variables(request, body_vars),
        model=model,
        score_importance=extraction.get("score_importance", False),
        extract_graph=extraction.get("extract_graph", False),
    )


@router.get("/memory/{store}/records/{record_id}", response_model=MemoryRecord)
def read_record(
    store: str,
    record_id: str,
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> MemoryRecord:
    """A record by id with its entities and relations; reading it updates its last-accessed time."""
    _caller(caller)
    return get_record(conn, store, record_id, principal=caller, variables=_variables(request))


@router.delete("/memory/{store}/records/{record_id}", status_code=204)
def remove_record(
    store: str,
    record_id: str,
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> None:
    """Delete a record with its mentions and the relations it asserted."""
    _caller(caller)
    delete_record(conn, store, record_id, principal=caller, variables=_variables(request))


@router.delete("/memory/{store}", status_code=204)
def remove_store(
    store: str,
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> None:
    """Drop the caller's store with everything in it."""
    _caller(caller)
    drop_store(conn, store, principal=caller, variables=_variables(request))


class RecallOut(RecallResult):
    """A recall, and the memory block assembled from it when `max_tokens` was given."""

    memory: AssembledMemory | None = None


def recall_connection(
    request: Request,
    touch: bool = True,
    wish: ReadWish = Depends(read_wish),  # noqa: B008
) -> Iterator[psycopg.Connection[Any]]:
    """A recall that touches its records (the default) writes their last-access times, on the primary; one
    that does not (`touch=false`) only reads, and a replica may serve it."""
    with request_connection(request, None if touch else wish) as conn:
        yield conn


def recall_principal(
    request: Request,
    conn: psycopg.Connection[Any] = Depends(recall_connection),  # noqa: B008
    _declared: HTTPAuthorizationCredentials | None = Security(BEARER),  # noqa: B008
) -> Principal | None:
    """`request_principal` on the recall's connection, as a dependency."""
    return request_principal(request, conn)


@router.get("/memory/{store}", response_model=RecallOut)
def recall_memory(
    store: str,
    request: Request,
    query: str = Query("", max_length=10_000),
    top_k: int = 5,
    ranking: Literal["calibrated", "generative_agents"] = "calibrated",
    half_life_hours: float = MEMORY_HALF_LIFE_HOURS,
    decay: float = MEMORY_DECAY,
    w_recency: float | None = None,
    w_importance: float | None = None,
    w_relevance: float | None = None,
    candidates: int = 20,
    entity_candidates: int = 3,
    hops: int = 1,
    per_entity: int = 20,
    prior: int = 10,
    include_history: bool = False,
    touch: bool = True,
    as_of: datetime | None = None,
    filter: str | None = Query(None, max_length=1_000_000, description="a metadata filter as JSON"),
    max_tokens: int | None = Query(None, ge=50, le=100_000),
    conn: psycopg.Connection[Any] = Depends(recall_connection),  # noqa: B008
    caller: Principal | None = Depends(recall_principal),  # noqa: B008
) -> RecallOut:
    """Recall: entry nodes (entity names in the query, nearest entities), traversal, and the top memories
    ranked by recency + importance + relevance with each candidate's three terms; `ranked_by` says which
    terms decided the order. With `max_tokens`, also the `<memory>` block for a prompt."""
    _caller(caller)
    options = {
        "top_k": top_k,
        "ranking": ranking,
        "half_life_hours": half_life_hours,
        "decay": decay,
        "weights": {"recency": w_recency, "importance": w_importance, "relevance": w_relevance},
        "candidates": candidates,
        "entity_candidates": entity_candidates,
        "hops": hops,
        "per_entity": per_entity,
        "prior": prior,
        "include_history": include_history,
        "touch": touch,
        "as_of": as_of,
        "filter": filter_from_text(filter, "filter"),
    }
    result = recall(
        conn,
        store,
        query,
        principal=caller,
        embedder=load_embedder(),
        options=options,
        variables=_variables(request),
    )
    block = None if max_tokens is None else assemble(result, max_tokens=max_tokens)
    return RecallOut(**result.model_dump(), memory=block)


class EntitiesOut(BaseModel):
    created: list[str]


@router.post(
    "/memory/{store}/entities",
    response_model=EntitiesOut,
    status_code=201,
    openapi_extra={"requestBody": OBJECTS_BODY},
)
async def add_entities(
    store: str,
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> EntitiesOut:
    """Add entities ({name, kind, metadata, embedding}) to an existing store; existing names are kept."""
    _caller(caller)
    body = await _objects(request, "entity")
    created = await run_in_threadpool(
        partial(write_entities, conn, store, body, principal=caller, embedder=load_embedder()),
        variables=_variables(request),
    )
    return EntitiesOut(created=created)


@router.post(
    "/memory/{store}/relations",
    response_model=list[RelationResult],
    status_code=201,
    openapi_extra={"requestBody": OBJECTS_BODY},
)
async def add_relations(
    store: str,
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> list[RelationResult]:
    """Assert relations ({subject, predicate, object, single_valued, valid_from, record_id}); one that
    contradicts a current single-valued relation closes it (kept in history, never deleted)."""
    _caller(caller)
    body = await _objects(request, "relation")
    return await run_in_threadpool(
        partial(write_relations, conn, store, body, principal=caller, embedder=load_embedder()),
        variables=_variables(request),
    )


@router.get("/memory/{store}/entities/{name}", response_model=EntityOut)
def read_entity(
    store: str,
    name: str,
    request: Request,
    include_history: bool = False,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> EntityOut:
    """An entity with its relations in both directions (closed ones too with include_history) and the
    records that mention it."""
    _caller(caller)
    return get_entity(
        conn, store, name, principal=caller, variables=_variables(request), include_history=include_history
    )
