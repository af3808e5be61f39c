"""Hierarchy and graph indexes over HTTP: list, create, drop, explicit edges, check, and a node's neighbours.

Creating and dropping an index is an administrator's act, as it changes what every reader of the source
navigates: the keyless local server, or `agentdb index create|drop` on the database; a principal gets 403.
Listing and checking need the tool `search`, posting explicit edges the tool `ingest`, neighbours
`tree_search` or `graph_search` by the index's kind; all need the source in the caller's tables, and an index
field outside a caller's field grant answers like an unknown one (403). A principal's lists, counts and
checks are computed over the rows it can read (sql/070_indexes.sql). Explicit edges posted by a principal
with a row filter must join documents it can read.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
import psycopg
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from agentdb.api.access import principal, read_principal
from agentdb.api.routing import DatabaseRoute, connection, read_connection
from agentdb.auth import Principal, check_table, check_tool, read_scope
from agentdb.errors import Forbidden, InvalidParamValue
from agentdb.filters import ReadScope
from agentdb.indexes import (
    IndexInfo,
    add_edges,
    check_index_name,
    check_indexes,
    create_index,
    drop_index,
    get_index,
    list_indexes,
    neighbors,
)

router = APIRouter(tags=["indexes"], route_class=DatabaseRoute)


class IndexIn(BaseModel):
    """A new index: a tree from a parent-key `field`, a graph from a key or key-list `field`, or (no field)
    an index of explicit edges posted to /sources/{name}/indexes/{index}/edges."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="lowercase letters, digits and _, starting with a letter (max 63)")
    kind: Literal["tree", "graph"]
    field: str | None = Field(default=None, description="the metadata field whose values name the keys")
    edge_type: str | None = Field(
        default=None, description="default: child (tree), the field's name (graph), edge (explicit)"
    )


class EdgesOut(BaseModel):
    index: str
    written: int
    edges: int


class CheckOut(BaseModel):
    index: str
    missing: int
    extra: int
    dangling: int
    ok: bool


class NeighborOut(BaseModel):
    key: str
    edge_type: str
    weight: float


EDGES_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["from", "to"],
                    "additionalProperties": False,
                    "properties": {
                        "from": {"type": "string"},
                        "to": {"type": "string"},
                        "type": {"type": "string"},
                        "weight": {"type": "number"},
                        "metadata": {"type": "object"},
                    },
                },
            }
        }
    },
}


def _reader(caller: Principal | None, name: str) -> None:
    if caller is not None:
        check_tool(caller, "search")
        check_table(caller, name, path="source")


def _writer(caller: Principal | None, name: str) -> None:
    if caller is not None:
        check_tool(caller, "ingest")
        check_table(caller, name, path="source")


def _administrator(caller: Principal | None) -> None:
    """Forbidden for a principal: an index over a source serves every reader of it."""
    if caller is not None:
        raise Forbidden(
            f"principal {caller.name!r} may not create or drop indexes: an index serves every reader of the source",
            path="source",
            hint="an administrator creates and drops indexes: `agentdb index create|drop` on the database host",
        )


def _granted_field(caller: Principal | None, field: str | None) -> None:
    """Forbidden when the index field is outside the caller's field grant (whether or not it exists, so that
    no answer names a hidden field)."""
    if caller is not None and caller.fields is not None and field is not None and field not in caller.fields:
        raise Forbidden(f"principal {caller.name!r} may not use field {field!r}", path="field")


@router.get("/sources/{name}/indexes", response_model=list[IndexInfo])
def list_source_indexes(
    name: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> list[IndexInfo]:
    """The indexes of a source with their edge counts, as the caller sees them: indexes over fields outside
    its grant are left out, and it counts the edges of the rows it can read."""
    _reader(caller, name)
    with read_scope(conn, caller):
        return list_indexes(conn, name)


@router.post("/sources/{name}/indexes", response_model=IndexInfo, status_code=201)
def create_source_index(
    name: str,
    body: IndexIn,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> IndexInfo:
    """Declare an index and build its edges from the current documents (one transaction). 409 when the name is
    taken; 3007 at `field` for a field the source does not have. Not for principals (403)."""
    _administrator(caller)
    return create_index(conn, name, body.name, kind=body.kind, field=body.field, edge_type=body.edge_type)


@router.delete("/sources/{name}/indexes/{index}", status_code=204)
def drop_source_index(
    name: str,
    index: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> None:
    """Remove an index with its edges. Not for principals (403)."""
    _administrator(caller)
    drop_index(conn, name, index)


@router.post(
    "/sources/{name}/indexes/{index}/edges",
    response_model=EdgesOut,
    openapi_extra={"requestBody": EDGES_BODY},
)
async def post_edges(
    name: str,
    index: str,
    request: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> EdgesOut:
    """Add explicit edges (a JSON array of {"from", "to", "type", "weight", "metadata"}) to an index without a
    field, all or nothing: the first bad edge is 3007 at `edges[i]...` and nothing is written."""
    _writer(caller, name)
    edges = await run_in_threadpool(_edges, await request.body())  # a bulk upload: parsed off the event loop
    return await run_in_threadpool(_write_edges, conn, caller, name, index, edges)


def _edges(body: bytes) -> list[Any]:
    try:
        edges = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidParamValue(f"invalid JSON: {exc}", path="edges") from None
    if not isinstance(edges, list):
        raise InvalidParamValue(
            'expected a JSON array of edges {"from", "to", "type", "weight", "metadata"}', path="edges"
        )
    return edges


def _write_edges(
    conn: psycopg.Connection[Any], caller: Principal | None, name: str, index: str, edges: list[Any]
) -> EdgesOut:
    with conn.transaction():
        written = add_edges(conn, name, index, edges)
        if caller is not None and caller.row_filter is not None:
            _check_edge_keys(conn, caller, name, edges)
        with read_scope(conn, caller):  # the count the caller may see
            total = get_index(conn, name, index).edges
    return EdgesOut(index=index, written=written, edges=total)


def _check_edge_keys(conn: psycopg.Connection[Any], caller: Principal, name: str, edges: list[Any]) -> None:
    """Forbidden (at `edges[i].from` / `.to`) unless every key of the edges is a document the caller can read
    under its row filter: a principal limited to some rows links only those. A missing key and a hidden one
    answer alike. Runs after the edges were validated, inside their transaction (which the error undoes)."""
    keys = sorted({str(e[end]) for e in edges for end in ("from", "to")})
    with read_scope(conn, caller):
        rows = conn.execute(
            "select distinct r.ord from agentdb.read(source => %s, keys => %s, chunk_from => %s,"
            " chunk_to => %s, scope => %s) r",
            (name, keys, [0] * len(keys), [0] * len(keys), ReadScope(row_filter=caller.row_filter).value()),
        ).fetchall()
    visible = {keys[r[0] - 1] for r in rows}
    for i, edge in enumerate(edges):
        for end in ("from", "to"):
            if edge[end] not in visible:
                raise Forbidden(
                    f"principal {caller.name!r} may not link {edge[end]!r}: not a document it can read",
                    path=f"edges[{i}].{end}",
                )


@router.get("/sources/{name}/indexes/{index}/check", response_model=CheckOut)
def check_source_index(
    name: str,
    index: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> CheckOut:
    """Compare the index's edges with what the documents imply: missing and extra field-derived edges
    (mismatches; 0 after any sequence of writes) and dangling edges (to keys with no document, kept); for a
    principal over the rows it can read, where a key it cannot read dangles as a missing one does."""
    _reader(caller, name)
    check_index_name(index, path="index")
    _granted_field(caller, get_index(conn, name, index).field)
    with read_scope(conn, caller):
        result = check_indexes(conn, name, index)[0]
    return CheckOut(
        index=result.index,
        missing=result.missing,
        extra=result.extra,
        dangling=result.dangling,
        ok=result.ok,
    )


@router.get("/sources/{name}/indexes/{index}/neighbors", response_model=list[NeighborOut])
def node_neighbors(
    name: str,
    index: str,
    key: str,
    direction: Literal["out", "in", "both"] = "out",
    edge_type: list[str] | None = Query(default=None, description="repeatable; default any"),  # noqa: B008
    max: int = Query(default=8, ge=1, le=256),  # noqa: A002
    conn: psycopg.Connection[Any] = Depends(read_connection),  # noqa: B008
    caller: Principal | None = Depends(read_principal),  # noqa: B008
) -> list[NeighborOut]:
    """The neighbours of document `key` the caller may read (agentdb.neighbors): `out` gives a tree node's
    children, `in` its parent. Needs the tool tree_search (tree) or graph_search (graph)."""
    if caller is not None:
        check_table(caller, name, path="source")
    info = get_index(conn, name, index)
    if caller is not None:
        check_tool(caller, "tree_search" if info.kind == "tree" else "graph_search")
        _granted_field(caller, info.field)
    with read_scope(conn, caller):
        found = neighbors(
            conn,
            name,
            index,
            key,
            direction=direction,
            edge_types=edge_type,
            max=max,
            scope=ReadScope(row_filter=None if caller is None else caller.row_filter),
        )
    return [NeighborOut(key=n.key, edge_type=n.edge_type, weight=n.weight) for n in found]
