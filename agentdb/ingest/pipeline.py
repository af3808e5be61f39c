"""Ingestion: validate every record first, then chunk, embed in batches and write each batch with COPY in
one transaction, so a bad row or a crash never leaves a half-written document."""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from tqdm import tqdm

from agentdb.db import can_vacuum
from agentdb.db.distribute import TENANT_COLUMN, routed_by_tenant, tenant_of
from agentdb.embed import Embedder, check_model, check_vector
from agentdb.errors import (
    AgentDBError,
    InvalidParamValue,
    StorageContentError,
    StorageKindMismatch,
)
from agentdb.ingest.chunking import chunk_text
from agentdb.ingest.readers import Located
from agentdb.sources import (
    FIELD_NAME,
    RESERVED_FIELDS,
    FieldSpec,
    FieldType,
    Source,
    add_fields,
    check_source_name,
    check_tenant_field,
    coerce_value,
    create_document_source,
    drop_vector_index,
    ensure_vector_index,
    get_source,
    merge_written_terms,
    optimize_source,
    record_embedding_backends,
    unknown_source,
    write_lexical,
)
from agentdb.sources.ddl import CHUNK_OVERLAP, CHUNK_SIZE

ANALYZE_AFTER_CHUNKS = 1000


@dataclass(frozen=True)
class FieldMap:
    """Which keys of a record hold the id, title, text and a precomputed embedding; every other key is
    metadata (limited to `include` when given, never the keys in `exclude`)."""

    id_field: str | None = None  # None: "_id", else "id" (BEIR style)
    title_field: str = "title"
    text_field: str = "text"
    embedding_field: str = "embedding"
    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()


@dataclass
class Document:
    doc_id: str
    title: str
    text: str
    metadata: dict[str, Any]
    embedding: np.ndarray | None  # float32, checked (agentdb.embed.check_vector)
    file: str
    line: int


@dataclass(frozen=True)
class BadRow:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        field = f" field {self.field!r}:" if self.field else ""
        return f"{self.file}:{self.line}:{field} {self.message}"

    @property
    def path(self) -> str:
        return f"{self.file}:{self.line}.{self.field}" if self.field else f"{self.file}:{self.line}"


@dataclass
class IngestReport:
    documents: int = 0
    chunks: int = 0
    replaced: int = 0
    skipped: list[BadRow] = field(default_factory=list)
    new_fields: list[str] = field(default_factory=list)
    seconds: float = 0.0
    embed_seconds: float = 0.0

    def summary(self) -> str:
        rate = self.documents / self.seconds if self.seconds else 0.0
        chunk_rate = self.chunks / self.seconds if self.seconds else 0.0
        return (
            f"{self.documents} documents, {self.chunks} chunks in {self.seconds:.1f}s "
            f"({rate:.0f} docs/s, {chunk_rate:.0f} chunks/s; embedding {self.embed_seconds:.1f}s); "
            f"{self.replaced} replaced, {len(self.skipped)} skipped"
        )


class RowError(Exception):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name
        self.message = message


def _infer_type(value: Any) -> FieldType | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dt.datetime):
        return "timestamp"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "string_set"
    return None


class _Schema:
    """The source's fields plus those inferred from this input (first type seen wins; int widens to float
    while the field is new)."""

    def __init__(self, source_fields: list[FieldSpec]) -> None:
        self.fields = {f.name: f for f in source_fields}
        self.new: dict[str, FieldSpec] = {}

    def coerce(self, name: str, value: Any) -> Any:
        spec = self.fields.get(name)
        if spec is None:
            if not FIELD_NAME.match(name):
                raise RowError(
                    name,
                    "not a valid field name: a field name is a letter or _, then letters, digits and _ (at most"
                    " 63); rename the key or exclude it with --exclude-field",
                )
            kind = _infer_type(value)
            if kind is None:
                raise RowError(
                    name,
                    f"unsupported metadata value of type {type(value).__name__}; "
                    "exclude the key with --exclude-field or flatten it",
                )
            spec = FieldSpec(name=name, type=kind, optional=True)
            self.fields[name] = self.new[name] = spec
        elif spec.type == "int" and isinstance(value, float) and not value.is_integer() and name in self.new:
            spec = self.fields[name] = self.new[name] = spec.model_copy(update={"type": "float"})
        try:
            return coerce_value(spec, value)
        except ValueError as exc:
            raise RowError(name, f"{exc} (the field is {spec.type})") from exc


def _parse(located: Located, mapping: FieldMap, schema: _Schema, dim: int) -> Document:
    if located.error is not None:
        raise RowError(located.error_field, located.error)
    record = located.record
    id_key = mapping.id_field or ("_id" if "_id" in record else "id")
    raw_id = record.get(id_key)
    if raw_id is None or raw_id == "":
        raise RowError(id_key, "missing document id")
    if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
        raise RowError(id_key, "the document id must be a string or an integer")
    text = record.get(mapping.text_field)
    if not isinstance(text, str):
        raise RowError(mapping.text_field, "missing text" if text is None else "the text must be a string")
    title = record.get(mapping.title_field, "")
    if not isinstance(title, str):
        raise RowError(mapping.title_field, "the title must be a string")
    embedding = None
    if record.get(mapping.embedding_field) is not None:
        try:
            embedding = check_vector(record[mapping.embedding_field], dim, mapping.embedding_field)
        except AgentDBError as exc:
            raise RowError(mapping.embedding_field, exc.message) from exc
    metadata: dict[str, Any] = {}
    structural = {id_key, mapping.text_field, mapping.title_field, mapping.embedding_field}
    for key, value in record.items():
        if key in structural or key in mapping.exclude or value is None:
            continue
        if mapping.include is not None and key not in mapping.include:
            continue
        if key in RESERVED_FIELDS:
            raise RowError(key, "this key name is reserved; rename it or exclude it with --exclude-field")
        metadata[key] = schema.coerce(key, value)
    for spec in schema.fields.values():
        if spec.name not in metadata and not spec.optional:
            metadata[spec.name] = spec.default
    return Document(str(raw_id), title, text, metadata, embedding, located.file, located.line)


def prepare(
    records: Iterable[Located],
    mapping: FieldMap,
    source_fields: list[FieldSpec],
    dim: int,
    *,
    skip_bad: bool,
    skip_bad_option: str = "--skip-bad",
) -> tuple[list[Document], list[FieldSpec], list[BadRow]]:
    """Validate every record before anything is written: the documents (the last one wins for a repeated
    id), the metadata fields new to the source, and the bad rows (raised at once unless `skip_bad`)."""
    schema = _Schema(source_fields)
    documents: dict[str, Document] = {}
    bad: list[BadRow] = []
    for located in records:
        # A skipped row must not leave the fields it introduced (or widened) behind.
        known, new = dict(schema.fields), dict(schema.new)
        try:
            doc = _parse(located, mapping, schema, dim)
        except RowError as exc:
            schema.fields, schema.new = known, new
            row = BadRow(located.file, located.line, exc.field, exc.message)
            if not skip_bad:
                raise StorageContentError(
                    f"bad row at {row}; nothing was written",
                    path=row.path,
                    hint=f"fix the row, or pass {skip_bad_option} to report and skip bad rows",
                ) from exc
            bad.append(row)
            continue
        documents.pop(doc.doc_id, None)
        documents[doc.doc_id] = doc
    return list(documents.values()), list(schema.new.values()), bad


def _embedding_input(title: str, chunk: str) -> str:
    return f"{title}\n{chunk}" if title else chunk


def embedding_chunks(
    title: str, text: str, embedder: Embedder, chunk_size: int, chunk_overlap: int
) -> list[tuple[str, str]]:
    """A document's chunks, each with the text the model embeds for it (the title, a line break, the chunk)."""
    return [
        (piece, _embedding_input(title, piece))
        for piece in chunk_text(text, embedder.token_spans, chunk_size, chunk_overlap)
    ]


# A write batch (one transaction, one COPY) holds up to WRITE_BATCH documents, or fewer once EMBED_BATCH of them
# need their chunks embedded: the model then sets the pace, and the progress bar moves each time it has embedded
# a batch. Documents that carry their vectors go in the large batches, where each statement's fixed costs (the
# lexical triggers' statements, the commit) are shared by more rows: SciFact-text records with their vectors,
# 20,000 of them, loaded at 600 chunks/s in batches of 64 against 908 in batches of 512 (HNSW build included).
WRITE_BATCH = 512
EMBED_BATCH = 64


def _batches(documents: list[Document]) -> Iterator[list[Document]]:
    batch: list[Document] = []
    to_embed = 0
    for doc in documents:
        batch.append(doc)
        to_embed += doc.embedding is None
        if len(batch) == WRITE_BATCH or to_embed == EMBED_BATCH:
            yield batch
            batch, to_embed = [], 0
    if batch:
        yield batch


def _check_embedder(source: Source, documents: list[Document], embedder: Embedder | None) -> None:
    if any(d.embedding is None for d in documents):
        if embedder is None:
            raise StorageContentError("documents without an `embedding` need an embedder", path="embedding")
        check_model(source.embedding_model, embedder.model_name, source.name)


_CHUNK_COLUMNS = (
    ("doc_id", "text"),
    ("chunk", "int4"),
    ("title", "text"),
    ("text", "text"),
    ("metadata", "jsonb"),
)


def _chunk_columns(source: Source) -> list[tuple[str, str]]:
    """The columns a chunk row is written into, with their types: a source distributed by its tenant field
    has its tenant too."""
    tenant = [(TENANT_COLUMN, "text")] if routed_by_tenant(source) else []
    return [*_CHUNK_COLUMNS, ("agentdb_embedding", "vector"), *tenant]


def _column_list(source: Source) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(name) for name, _ in _chunk_columns(source))


def _with_tenant(source: Source, rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """Chunk rows (doc_id, chunk, title, text, Jsonb metadata, vector) as `_chunk_columns` takes them."""
    routed = routed_by_tenant(source)
    for row in rows:
        yield (*row, tenant_of(source, row[4].obj)) if routed else row


def copy_chunks(cur: psycopg.Cursor[Any], source: Source, rows: Iterable[tuple[Any, ...]]) -> int:
    """Write chunk rows (doc_id, chunk, title, text, Jsonb metadata, vector or None) into a document
    source's table with one COPY; one statement, so the lexical triggers index them all at once. Binary: a
    vector goes as its 4-byte floats, not formatted as decimal text and parsed back (which took most of the
    client's time when the records carry their vectors). Returns how many rows were written."""
    copy = sql.SQL("copy {} ({}) from stdin (format binary)").format(source.table, _column_list(source))
    written = 0
    with cur.copy(copy) as writer:
        writer.set_types([kind for _, kind in _chunk_columns(source)])
        for row in _with_tenant(source, rows):
            writer.write_row(row)
            written += 1
    return written


def analyze_source(conn: psycopg.Connection[Any], source: Source) -> None:
    """After a bulk write: a block source's partly filled posting blocks merged (each write statement added
    its own), then the written tables vacuumed and analyzed right away, not at autovacuum's leisure (which, for
    a large postings table, waits until a fifth of it is new): fresh statistics, so the planner picks index
    scans, and the visibility map set, so the lexical leg's index-only scans of the postings skip the heap
    from the first query on. A plain
    VACUUM blocks neither readers nor writers; inside a transaction block, where it cannot run, statistics
    only."""
    if source.lexical_layout == "blocks":
        optimize_source(conn, source.name)
    tables = sql.SQL(", ").join(
        [source.table, *map(sql.SQL, ("agentdb.postings", "agentdb.posting_blocks", "agentdb.term_stats"))]
    )
    command = "vacuum (analyze, truncate false) {}" if can_vacuum(conn) else "analyze {}"
    conn.execute(sql.SQL(command).format(tables))


def write_documents(
    conn: psycopg.Connection[Any],
    source: Source,
    documents: list[Document],
    embedder: Embedder | None,
    *,
    progress: bool = True,
    report: IngestReport | None = None,
    write_scope: Callable[[], AbstractContextManager[Any]] | None = None,
) -> IngestReport:
    """Chunk, embed and COPY `documents`, one transaction per batch (_batches); an existing id is replaced whole.
    With `write_scope` (a principal's role: its row-level security applies) each batch is written inside
    that scope, with INSERT, since PostgreSQL refuses COPY FROM under row-level security."""
    report = report or IngestReport()
    _check_embedder(source, documents, embedder)
    delete = sql.SQL("delete from {} where doc_id = any(%s) returning doc_id").format(source.table)
    columns = _chunk_columns(source)
    insert = sql.SQL("insert into {} ({}) values ({})").format(
        source.table, _column_list(source), sql.SQL(", ").join(sql.Placeholder() * len(columns))
    )
    bar = tqdm(total=len(documents), unit="doc", disable=not progress, desc=f"ingest {source.name}")
    started_at, chunks_before = time.perf_counter(), report.chunks
    try:
        for batch in _batches(documents):
            rows: list[tuple[Any, ...]] = []
            to_embed: list[int] = []
            texts: list[str] = []
            for doc in batch:
                if doc.embedding is not None:
                    rows.append(
                        (
                            doc.doc_id,
                            0,
                            doc.title,
                            doc.text,
                            Jsonb(doc.metadata),
                            doc.embedding,
                        )
                    )
                    continue
                assert embedder is not None
                for position, (piece, embedded) in enumerate(
                    embedding_chunks(doc.title, doc.text, embedder, source.chunk_size, source.chunk_overlap)
                ):
                    to_embed.append(len(rows))
                    texts.append(embedded)
                    rows.append((doc.doc_id, position, doc.title, piece, Jsonb(doc.metadata), None))
            if texts:
                assert embedder is not None
                started = time.perf_counter()
                vectors = embedder.embed(texts)
                report.embed_seconds += time.perf_counter() - started
                for index, vector in zip(to_embed, vectors, strict=True):
                    rows[index] = (*rows[index][:5], vector)
            with write_scope() if write_scope is not None else conn.transaction():
                with conn.cursor() as cur:
                    ids = [d.doc_id for d in batch]
                    write_lexical(conn, source, "remove", ids)
                    cur.execute(delete, (ids,))
                    report.replaced += len({r[0] for r in cur.fetchall()})
                    if write_scope is None:
                        copy_chunks(cur, source, rows)
                    else:
                        cur.executemany(insert, list(_with_tenant(source, rows)))
                    write_lexical(conn, source, "add", ids)
            report.documents += len(batch)
            report.chunks += len(rows)
            elapsed = time.perf_counter() - started_at
            rate = (report.chunks - chunks_before) / elapsed if elapsed else 0.0
            bar.set_postfix_str(f"{report.chunks} chunks, {rate:.1f} chunks/s", refresh=False)
            bar.update(len(batch))
    finally:
        bar.close()
    if report.embed_seconds and embedder is not None:
        record_embedding_backends(conn, source, [embedder.backend])
    return report


def _check_tenants(tenant_field: str | None, documents: list[Document], fields: list[FieldSpec]) -> None:
    """Before anything is written: under a tenant field every document carries it as a non-empty string (its
    tenant, which a coordinator distributes the source by)."""
    if tenant_field is None:
        return
    check_tenant_field(tenant_field, fields)
    for doc in documents:
        value = doc.metadata.get(tenant_field)
        if not (isinstance(value, str) and value):
            raise StorageContentError(
                f"document {doc.doc_id!r} has no tenant: its field {tenant_field!r} must be a non-empty string"
                f" (found {value!r}); nothing was written",
                path=f"{doc.file}:{doc.line}",
                hint=f"give every document a {tenant_field!r} value",
            )


def ingest(
    conn: psycopg.Connection[Any],
    source_name: str,
    records: Iterable[Located],
    embedder: Embedder | None,
    *,
    mapping: FieldMap | None = None,
    skip_bad: bool = False,
    skip_bad_option: str = "--skip-bad",
    create: bool = True,
    progress: bool = True,
    chunk_size: int = CHUNK_SIZE,
    chunk_overlap: int = CHUNK_OVERLAP,
    check: Callable[[Source, list[Document], list[FieldSpec]], None] | None = None,
    write_scope: Callable[[], AbstractContextManager[Any]] | None = None,
    tenant_field: str | None = None,
    lexical_layout: Literal["rows", "blocks"] | None = None,
) -> IngestReport:
    """Ingest `records` into the document source `source_name` (created on first use when `create`, with
    `tenant_field` as its tenant field: Source.tenant_field; an existing source must have the one given; and
    its postings in `lexical_layout`, None for create_document_source's default).
    `skip_bad_option` is how the caller names skip_bad in hints. `check` sees the existing source, the validated documents and the new fields before anything is
    written, and may refuse them (a writer's permissions); `write_scope` is where the batches are written
    (see write_documents)."""
    started = time.perf_counter()
    mapping = mapping or FieldMap()
    source: Source | None
    try:
        source = get_source(conn, source_name)
    except AgentDBError:
        if not create or embedder is None:
            raise
        source = None  # created below, once every record is known to be good
        check_source_name(source_name)
        check_tenant_field(tenant_field, [])
    if source is None:
        assert embedder is not None
        fields, dim = [], embedder.dim
    elif source.kind != "documents":
        raise StorageKindMismatch(
            f"source {source_name!r} is a registered table: write to the table itself; agentdb indexes it",
            path="source",
        )
    else:
        fields, dim = source.fields, source.embedding_dim
        if tenant_field is not None and tenant_field != source.tenant_field:
            raise InvalidParamValue(
                f"source {source_name!r} exists with tenant field {source.tenant_field!r}, not {tenant_field!r};"
                " a tenant field is chosen when a source is created",
                path="tenant_field",
            )
    documents, new_fields, bad = prepare(
        records, mapping, fields, dim, skip_bad=skip_bad, skip_bad_option=skip_bad_option
    )
    _check_tenants(
        source.tenant_field if source is not None else tenant_field, documents, fields + new_fields
    )
    report = IngestReport(skipped=bad, new_fields=[f.name for f in new_fields])
    if check is not None:
        if source is None:
            raise unknown_source(source_name)
        check(source, documents, new_fields)
    if not documents and not bad:
        raise InvalidParamValue("no records to ingest", path="files")
    if not documents and source is None:
        raise StorageContentError(
            f"every record was bad ({len(bad)}, first: {bad[0]}); source {source_name!r} was not created",
            path=bad[0].path,
            hint="fix the rows reported, or check the file's format (delimiter, quotes, header)",
        )
    created = False
    if source is None:
        assert embedder is not None
        try:
            source = create_document_source(
                conn,
                source_name,
                embedding_model=embedder.model_name,
                embedding_dim=embedder.dim,
                chunk_size=chunk_size,
                chunk_overlap=chunk_overlap,
                tenant_field=tenant_field,
                lexical_layout=lexical_layout,
            )
            created = True
        except (StorageKindMismatch, psycopg.errors.UniqueViolation):
            # Another ingestion created it meanwhile: write into theirs (add_fields checks the field types).
            source = get_source(conn, source_name)
    _check_embedder(source, documents, embedder)
    with conn.transaction():
        source = add_fields(conn, source, new_fields)
    # A source this call created is loaded without its vector index, which is built once over all its rows
    # afterwards, even when a batch fails (the batches written before it stay). A process that dies in
    # between leaves the index out; the next ingestion into the source builds it first.
    if created:
        drop_vector_index(conn, source)
    else:
        ensure_vector_index(conn, source)
    try:
        write_documents(
            conn, source, documents, embedder, progress=progress, report=report, write_scope=write_scope
        )
    finally:
        # (In a caller's transaction that failed, its rollback takes the drop back.)
        if created and conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
            if progress:  # the step after the bar, which can take a while
                tqdm.write(
                    f"building the vector index of {source.name} ({report.chunks} chunks)...", file=sys.stderr
                )
            ensure_vector_index(conn, source)
    if report.chunks >= ANALYZE_AFTER_CHUNKS:
        analyze_source(conn, source)
    elif conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
        merge_written_terms(conn, source, [d.doc_id for d in documents])
    report.seconds = time.perf_counter() - started
    return report
