"""Documents over HTTP: the same rules and errors as file ingestion, in one request, transactional per batch."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
from fastapi import APIRouter, Depends, Request
from psycopg import sql
from psycopg.types.json import Jsonb
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from agentdb.agent import read_scope
from agentdb.api.deps import connection, principal
from agentdb.auth import Principal, check_fields, check_table, check_tool
from agentdb.embed import load_embedder
from agentdb.errors import InvalidParamValue, StorageFileNotFound, StorageKindMismatch
from agentdb.filters import compile_filter
from agentdb.ingest.pipeline import ingest
from agentdb.ingest.readers import Located
from agentdb.sources import get_source

router = APIRouter(tags=["documents"])


class IngestOut(BaseModel):
    documents: int
    chunks: int
    replaced: int
    skipped: list[str]
    new_fields: list[str]


def _records(body: bytes, content_type: str) -> list[Located]:
    """A JSON array of records, or NDJSON (one record a line; line numbers are kept for errors)."""
    if "ndjson" in content_type or "jsonl" in content_type:
        located = []
        for number, line in enumerate(body.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise InvalidParamValue(
                    f"line {number}: invalid JSON: {exc}", path=f"body:{number}"
                ) from None
            if not isinstance(record, dict):
                raise InvalidParamValue(
                    f"line {number}: a record must be a JSON object", path=f"body:{number}"
                )
            located.append(Located("body", number, record))
        return located
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


@router.post("/sources/{name}/documents", response_model=IngestOut)
async def add_documents(
    name: str,
    request: Request,
    skip_bad: bool = False,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> IngestOut:
    """Add or replace documents (validated first; a bad row aborts with nothing written unless skip_bad)."""
    _writer(caller, name)
    records = _records(await request.body(), request.headers.get("content-type", ""))
    report = await run_in_threadpool(
        ingest, conn, name, records, load_embedder(), skip_bad=skip_bad, progress=False
    )
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
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> DocumentOut:
    """A document's chunks in order, under the caller's row security and field grant (404 when not visible)."""
    fields = None
    if caller is not None:
        check_tool(caller, "search")
        check_table(caller, name, path="source")
        fields = check_fields(caller, None, path="fields")
    source = get_source(conn, name)
    # The row expressions (document id, chunk, title, text, metadata) of this kind of source, built by
    # agentdb.source_row_sql from the catalog with quoted identifiers.
    shape = conn.execute(
        "select r.* from agentdb.sources s, agentdb.source_row_sql(s) r where s.name = %s", (name,)
    ).fetchone()
    assert shape is not None
    doc_id_sql, chunk_sql, title_sql, body_sql, metadata_sql = (sql.SQL(part) for part in shape)
    row_filter = caller.row_filter if caller else None
    predicate, params = compile_filter(conn, source, row_filter, "%(row_params)s::jsonb", "row_filter")
    query = sql.SQL(
        "select {doc}, {chunk}, {title}, {body}, {meta} from {table} c"
        " where {doc} = %(doc_id)s and ({predicate}) order by {chunk}"
    ).format(
        doc=doc_id_sql,
        chunk=chunk_sql,
        title=title_sql,
        body=body_sql,
        meta=metadata_sql,
        table=source.table,
        predicate=sql.SQL(predicate),
    )
    with read_scope(conn, caller):
        rows = conn.execute(query, {"doc_id": doc_id, "row_params": Jsonb(params)}).fetchall()
    if not rows:
        raise StorageFileNotFound(f"source {name!r} has no document {doc_id!r}", path="id")
    metadata = rows[0][4] or {}
    if fields is not None:
        metadata = {k: v for k, v in metadata.items() if k in fields}
    show_text = fields is None or "text" in fields
    return DocumentOut(
        id=rows[0][0],
        title=rows[0][2] if fields is None or "title" in fields else None,
        chunks=[{"chunk": r[1], "text": r[3] if show_text else None} for r in rows],
        metadata=metadata,
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
    gone = conn.execute(
        sql.SQL("delete from {} where doc_id = %s returning doc_id").format(source.table), (doc_id,)
    ).fetchall()
    if not gone:
        raise StorageFileNotFound(f"source {name!r} has no document {doc_id!r}", path="id")
