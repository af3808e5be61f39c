"""Documents over HTTP: the same rules and errors as file ingestion, in one request, transactional per batch."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
import psycopg
from fastapi import APIRouter, Depends, Request
from psycopg import sql
from psycopg.types.json import Jsonb
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from agentdb.api.access import principal, read_principal
from agentdb.api.routing import DatabaseRoute, connection, read_connection
from agentdb.auth import (
    Principal,
    check_fields,
    check_table,
    check_tool,
    principal_scope,
    read_scope,
    writes_under_role,
)
from agentdb.embed import load_embedder
from agentdb.errors import Forbidden, InvalidParamValue, StorageFileNotFound, StorageKindMismatch
from agentdb.filters import ReadScope, compile_filter
from agentdb.ingest.pipeline import Document, IngestReport, ingest
from agentdb.ingest.readers import Located, json_objects
from agentdb.scoped_reader import read
from agentdb.sources import FieldSpec, Source, get_source, write_lexical

router = APIRouter(tags=["documents"], route_class=DatabaseRoute)


class IngestOut(BaseModel):
    documents: int
    chunks: int
    replaced: int
    skipped: list[str]
    new_fields: list[str]


def _write_creating(
    conn: psycopg.Connection[Any], name: str, write: Callable[[], IngestReport], may_create: bool
) -> IngestReport:
    """`write()`, inside one transaction when it may create source `name` (which does not exist yet)."""
    if may_create:
        try:
            get_source(conn, name)
        except StorageFileNotFound:
            with conn.transaction():
                return write()
    return write()


def _records(body: bytes, content_type: str) -> list[Located]:
    """A JSON array of records, or NDJSON (one record a line; line numbers are kept for errors)."""
    if "ndjson" in content_type or "jsonl" in content_type:
        lines = json_objects(body.splitlines(), "a record", lambda n: f"line {n}", lambda n: f"body:{n}")
        return [Located("body", number, record) for number, record in lines]
    try:
        records = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidParamValue(f"invalid JSON: {exc}", path="body") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise InvalidParamValue("expected a JSON array of objects (or NDJSON)", path="body")
    return [Located("body", i, r) for i, r in enumerate(records)]


def _writer(caller: Principal | None, name: str) -> None:
    if caller is not None:
        check_tool(caller, "ingest")
        check_table(caller, name, path="source")


def _row_filter_sql(
    conn: psycopg.Connection[Any], source: Source, caller: Principal
) -> tuple[sql.SQL, Jsonb]:
    """The caller's row filter as a predicate over the alias `c` (doc_id, metadata), with its values."""
    predicate, params = compile_filter(conn, source, caller.row_filter, "%(row_params)s::jsonb", "row_filter")
    return sql.SQL(predicate), Jsonb(params)


def writes_allowed(
    conn: psycopg.Connection[Any], caller: Principal
) -> Callable[[Source, list[Document], list[FieldSpec]], None]:
    """The check a principal's document writes pass before anything is written: no field outside its
    field grant (403 at the record's field), every record inside its row filter (a row it could not read
    it cannot create), and no replaced document outside its row filter or holding fields it may not see
    (it cannot overwrite what it cannot read)."""

    def check(source: Source, documents: list[Document], new_fields: list[FieldSpec]) -> None:
        granted = None if caller.fields is None else set(caller.fields)
        if granted is not None:
            for doc in documents:
                for key in doc.metadata:
                    if key not in granted:
                        raise Forbidden(
                            f"principal {caller.name!r} may not write field {key!r}",
                            path=f"{doc.file}:{doc.line}.{key}",
                        )
        predicate, params = _row_filter_sql(conn, source, caller)
        records = Jsonb(
            [{"i": i, "doc_id": d.doc_id, "metadata": d.metadata} for i, d in enumerate(documents)]
        )
        outside = conn.execute(
            sql.SQL(
                "select c.i from jsonb_to_recordset(%(records)s) as c(i int, doc_id text, metadata jsonb)"
                " where not coalesce(({}), false) order by c.i limit 1"
            ).format(predicate),
            {"records": records, "row_params": params},
        ).fetchone()
        if outside is not None:
            doc = documents[outside[0]]
            raise Forbidden(
                f"principal {caller.name!r} may not write document {doc.doc_id!r}: it is outside its row filter",
                path=f"{doc.file}:{doc.line}",
            )
        hidden = (
            sql.SQL("true")
            if granted is None
            else sql.SQL("exists (select 1 from jsonb_object_keys(c.metadata) k where k <> all(%(granted)s))")
        )
        replaced = conn.execute(
            sql.SQL(
                "select c.doc_id from {} c where c.doc_id = any(%(ids)s)"
                " and (not coalesce(({}), false) or ({} and %(has_grant)s)) limit 1"
            ).format(source.table, predicate, hidden),
            {
                "ids": [d.doc_id for d in documents],
                "row_params": params,
                "granted": sorted(granted or ()),
                "has_grant": granted is not None,
            },
        ).fetchone()
        if replaced is not None:
            doc = next(d for d in documents if d.doc_id == replaced[0])
            raise Forbidden(
                f"principal {caller.name!r} may not replace document {doc.doc_id!r}",
                path=f"{doc.file}:{doc.line}",
            )

    return check


UPLOAD_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
        "application/x-ndjson": {"schema": {"type": "string", "description": "one JSON object a line"}},
    },
}


@router.post(
    "/sources/{name}/documents", response_model=IngestOut, openapi_extra={"requestBody": UPLOAD_BODY}
)
async def add_documents(
    name: str,
    request: Request,
    skip_bad: bool = False,
    tenant_field: str | None = None,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> IngestOut:
    """Add or replace documents (validated first; a bad row aborts with nothing written unless skip_bad). A
    source this request creates is created in one transaction with its documents: a server that dies midway
    leaves no empty source behind. `tenant_field` names the tenant field of a source this request creates
    (docs/scale-out.md: a coordinator distributes the source by it); for an existing one it must be its own."""
    _writer(caller, name)
    records = await run_in_threadpool(_records, await request.body(), request.headers.get("content-type", ""))
    # The database enforces the same limits where a principal's batches can be written under its role.
    as_role = caller is not None and writes_under_role(caller, get_source(conn, name))
    write = partial(
        ingest,
        conn,
        name,
        records,
        load_embedder(),
        skip_bad=skip_bad,
        skip_bad_option="the query parameter ?skip_bad=true",
        progress=False,
        create=caller is None,
        check=None if caller is None else writes_allowed(conn, caller),
        write_scope=partial(principal_scope, conn, caller) if as_role and caller is not None else None,
        tenant_field=tenant_field,
    )
    report = await run_in_threadpool(_write_creating, conn, name, write, caller is None)
    return IngestOut(
        documents=report.documents,
        chunks=report.chunks,
        replaced=report.replaced,
        skipped=[str(b) for b in report.skipped],
        new_fields=report.new_fields,
    )


class DocumentOut(BaseModel):
    id: str
    title: str | None
    chunks: list[dict[str, Any]]
    metadata: dict[str, Any]


@router.get("/sources/{name}/documents/{doc_id}", response_model=DocumentOut)
def get_document(
    name: str,
    doc_id: str,
    conn: psycopg.Connection[Any] = Depends(read_connection),  # noqa: B008
    caller: Principal | None = Depends(read_principal),  # noqa: B008
) -> DocumentOut:
    """A document's chunks in order, under the caller's row security and field grant (404 when not visible)."""
    fields = None
    if caller is not None:
        check_tool(caller, "search")
        check_table(caller, name, path="source")
        fields = check_fields(caller, None, path="fields")
    get_source(conn, name)
    with read_scope(conn, caller):
        scope = ReadScope(row_filter=caller.row_filter if caller else None)
        rows = read(conn, name, [doc_id], scope=scope, fields=fields)
    if not rows:
        raise StorageFileNotFound(f"source {name!r} has no document {doc_id!r}", path="id")
    return DocumentOut(
        id=rows[0].doc_id,
        title=rows[0].title,
        chunks=[{"chunk": r.chunk, "text": r.text} for r in rows],
        metadata=rows[0].metadata,
    )


@router.delete("/sources/{name}/documents/{doc_id}", status_code=204)
def delete_document(
    name: str,
    doc_id: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> None:
    """Delete every chunk of a document (postings and statistics follow in the same transaction)."""
    _writer(caller, name)
    source = get_source(conn, name)
    if source.kind != "documents":
        raise StorageKindMismatch(
            f"source {name!r} is a registered table: remove its rows in the table itself", path="source"
        )
    # A principal deletes only the documents inside its row filter; any other answers 404 as if absent. Under
    # its role its delete policy holds it to them; as the application (auth.writes_under_role) the delete
    # carries its row filter.
    as_role = writes_under_role(caller, source)
    inside, params = (
        _row_filter_sql(conn, source, caller)
        if caller is not None and not as_role
        else (sql.SQL("true"), None)
    )
    with conn.transaction(), read_scope(conn, caller if as_role else None):
        write_lexical(conn, source, "remove", [doc_id])
        gone = conn.execute(
            sql.SQL(
                "delete from {} c where c.doc_id = %(id)s and coalesce(({}), false) returning c.doc_id"
            ).format(source.table, inside),
            {"id": doc_id, "row_params": params},
        ).fetchall()
        if not gone:  # the postings of a document outside the filter come back with the rollback
            raise StorageFileNotFound(f"source {name!r} has no document {doc_id!r}", path="id")
