"""Knowledge packs: a document source (its chunks, their embeddings and its schema) in one Parquet file, so a
corpus is embedded once and loaded anywhere in seconds.

A pack has one row per chunk (`doc_id`, `chunk`, `title`, `text`, `metadata` as JSON text, `embedding` as
little-endian float16 or float32 bytes) and, in the Parquet key-value metadata under `agentdb.pack`, a JSON
manifest: the source's schema (fields, chunking, text search configuration, BM25 k1 and b), the embedding
model, dimension and storage type, its indexes, and the document and chunk counts. Files are written and
read with DuckDB (no pyarrow at run time). An import goes through the same source creation and COPY path
as ingestion, in one transaction, so the lexical triggers keep the BM25 postings consistent and a failure
leaves nothing behind.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tqdm import tqdm

from agentdb.errors import StorageContentError, StorageFileNotFound, StorageKindMismatch
from agentdb.ingest.pipeline import analyze_source, copy_chunks
from agentdb.sources import (
    FieldSpec,
    Source,
    check_source_name,
    coerce_value,
    create_document_source,
    drop_source,
    drop_vector_index,
    ensure_vector_index,
    get_source,
    record_embedding_backends,
)

PACK_FORMAT: Literal["agentdb-pack"] = "agentdb-pack"
PACK_VERSION = 1
MANIFEST_KEY = "agentdb.pack"
# How a chunk's embedding input is made (agentdb.ingest.pipeline._embedding_input); recorded in the manifest.
EMBEDDING_INPUT = "title + '\\n' + chunk text (the chunk text alone when the title is empty)"
COLUMNS = (
    ("doc_id", "VARCHAR"),
    ("chunk", "INTEGER"),
    ("title", "VARCHAR"),
    ("text", "VARCHAR"),
    ("metadata", "VARCHAR"),
    ("embedding", "BLOB"),
)
Dtype = Literal["float16", "float32"]
_NUMPY_DTYPES: dict[str, str] = {"float16": "<f2", "float32": "<f4"}
_BATCH_ROWS = 2048


class PackSource(BaseModel):
    """The schema of the packed source: what `create_document_source` needs to make it again."""

    model_config = ConfigDict(extra="forbid")

    name: str
    fields: list[FieldSpec] = Field(default_factory=list)
    chunk_size: int
    chunk_overlap: int
    ts_config: str
    bm25_k1: float
    bm25_b: float


class PackEmbedding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    dim: int = Field(gt=0)
    dtype: Dtype
    input: str = EMBEDDING_INPUT
    # The embedding backends that computed the vectors (agentdb.embed); empty in packs that do not say.
    backends: list[str] = Field(default_factory=list)


class PackManifest(BaseModel):
    """The `agentdb.pack` key of the Parquet metadata."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["agentdb-pack"] = PACK_FORMAT
    version: int = PACK_VERSION
    source: PackSource
    embedding: PackEmbedding
    # Hierarchy and graph indexes declared over the source (none can be declared yet; kept for them).
    indexes: list[dict[str, Any]] = Field(default_factory=list)
    documents: int = Field(ge=0)
    chunks: int = Field(ge=0)


@dataclass(frozen=True)
class PackRow:
    doc_id: str
    chunk: int
    title: str
    text: str
    metadata: dict[str, Any]
    embedding: np.ndarray | None  # float32, as it goes into the database


@dataclass(frozen=True)
class ImportReport:
    source: str
    documents: int
    chunks: int
    replaced: bool
    seconds: float

    def summary(self) -> str:
        return (
            f"imported {self.documents} documents, {self.chunks} chunks into source {self.source!r} "
            f"in {self.seconds:.1f}s{' (replaced the existing source)' if self.replaced else ''}"
        )


def _duckdb() -> Any:
    import duckdb

    return duckdb.connect()


def _source_counts(conn: psycopg.Connection[Any], source: Source) -> tuple[int, int]:
    row = conn.execute(
        sql.SQL("select count(distinct doc_id), count(*) from {}").format(source.table)
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _vector_bytes(value: Any, np_dtype: str) -> bytes:
    array = value.to_numpy() if hasattr(value, "to_numpy") else value  # pgvector's Vector, or an array
    return np.asarray(array, dtype=np_dtype).tobytes()


def export_pack(
    conn: psycopg.Connection[Any],
    source_name: str,
    path: Path,
    *,
    dtype: Dtype = "float16",
    progress: bool = True,
) -> PackManifest:
    """Write the document source `source_name` to the pack file `path` (replaced atomically)."""
    source = get_source(conn, source_name)
    if source.kind != "documents":
        raise StorageKindMismatch(
            f"source {source_name!r} is a registered table; only document sources can be packed",
            path="source",
            hint="ingest the table's rows into a document source to pack them",
        )
    if dtype not in _NUMPY_DTYPES:
        raise StorageContentError(f"unknown embedding dtype {dtype!r}", path="dtype")
    documents, chunks = _source_counts(conn, source)
    manifest = PackManifest(
        source=PackSource(
            name=source.name,
            fields=source.fields,
            chunk_size=source.chunk_size,
            chunk_overlap=source.chunk_overlap,
            ts_config=source.ts_config,
            bm25_k1=source.bm25_k1,
            bm25_b=source.bm25_b,
        ),
        embedding=PackEmbedding(
            model=source.embedding_model,
            dim=source.embedding_dim,
            dtype=dtype,
            backends=source.embedding_backends,
        ),
        documents=documents,
        chunks=chunks,
    )
    np_dtype = _NUMPY_DTYPES[dtype]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    duck = _duckdb()
    bar = tqdm(total=chunks, unit="chunk", disable=not progress, desc=f"export {source.name}")
    try:
        duck.execute(
            "create table pack (" + ", ".join(f"{name} {kind}" for name, kind in COLUMNS) + ")"  # noqa: S608 - constant columns
        )
        query = sql.SQL(
            "select doc_id, chunk, title, text, metadata::text, agentdb_embedding from {}"
            " order by agentdb_chunk_id"
        ).format(source.table)
        # A server-side cursor streams the table in batches; it needs a transaction (read only here).
        with conn.transaction(), conn.cursor(name="agentdb_pack_export") as cur:
            cur.execute(query)
            while rows := cur.fetchmany(_BATCH_ROWS):
                batch = {
                    "doc_id": np.array([r[0] for r in rows], dtype=object),
                    "chunk": np.array([r[1] for r in rows], dtype=np.int32),
                    "title": np.array([r[2] for r in rows], dtype=object),
                    "text": np.array([r[3] for r in rows], dtype=object),
                    "metadata": np.array([r[4] for r in rows], dtype=object),
                    "embedding": np.array(
                        [None if r[5] is None else _vector_bytes(r[5], np_dtype) for r in rows],
                        dtype=object,
                    ),
                }
                duck.register("batch", batch)
                duck.execute("insert into pack select * from batch")
                duck.unregister("batch")
                bar.update(len(rows))
        duck.execute(
            "copy pack to ? (format parquet, compression zstd, kv_metadata {'agentdb.pack': ?})",
            [str(tmp), manifest.model_dump_json()],
        )
        tmp.replace(path)
    finally:
        bar.close()
        duck.close()
        tmp.unlink(missing_ok=True)
    return manifest


def read_manifest(path: Path) -> PackManifest:
    """The manifest of the pack at `path`, after checking that the file is a pack agentdb can read."""
    import duckdb

    path = Path(path)
    if not path.is_file():
        raise StorageFileNotFound(f"{path}: no such file", path="file")
    duck = _duckdb()
    try:
        try:
            found = duck.execute(
                "select value from parquet_kv_metadata(?) where decode(key) = ?", [str(path), MANIFEST_KEY]
            ).fetchall()
            columns = duck.execute("describe select * from read_parquet(?)", [str(path)]).fetchall()
        except duckdb.Error as exc:
            raise StorageContentError(
                f"{path}: not a readable Parquet file: {exc}",
                path="file",
                hint="pass a file written by `agentdb pack export`",
            ) from exc
    finally:
        duck.close()
    if not found:
        raise StorageContentError(
            f"{path}: a Parquet file without an {MANIFEST_KEY!r} manifest is not a knowledge pack",
            path="file",
            hint="pass a file written by `agentdb pack export`",
        )
    try:
        raw = orjson.loads(found[0][0])
    except orjson.JSONDecodeError as exc:
        raise StorageContentError(f"{path}: the pack manifest is not JSON: {exc}", path="pack") from exc
    if isinstance(raw, dict) and raw.get("format") == PACK_FORMAT and raw.get("version") != PACK_VERSION:
        raise StorageContentError(
            f"{path}: pack format version {raw.get('version')!r} is not supported (this agentdb reads "
            f"version {PACK_VERSION})",
            path="pack.version",
            hint="export the pack again with this agentdb",
        )
    try:
        manifest = PackManifest.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(["pack", *(str(p) for p in error["loc"])])
        raise StorageContentError(f"{path}: bad pack manifest: {where}: {error['msg']}", path=where) from None
    got = [(str(c[0]), str(c[1])) for c in columns]
    if got != list(COLUMNS):
        raise StorageContentError(
            f"{path}: the pack's columns are {got}, expected {list(COLUMNS)}", path="pack.columns"
        )
    return manifest


def _row(
    raw: tuple[Any, ...], number: int, manifest: PackManifest, fields: dict[str, FieldSpec], path: Path
) -> PackRow:
    """Check one pack row against the manifest and decode it; errors carry `file:row.column`."""

    def bad(column: str, message: str) -> StorageContentError:
        return StorageContentError(
            f"{path}: row {number}: {message}; nothing was imported", path=f"{path}:{number}.{column}"
        )

    doc_id, chunk, title, text, metadata_text, blob = raw
    if not doc_id:
        raise bad("doc_id", "missing document id")
    if chunk is None or chunk < 0:
        raise bad("chunk", "the chunk number must be 0 or more")
    if text is None:
        raise bad("text", "missing text")
    try:
        metadata = orjson.loads(metadata_text) if metadata_text is not None else {}
    except orjson.JSONDecodeError as exc:
        raise bad("metadata", f"metadata is not JSON: {exc}") from exc
    if not isinstance(metadata, dict):
        raise bad("metadata", "metadata must be a JSON object")
    for key, value in metadata.items():
        spec = fields.get(key)
        if spec is None:
            raise bad(f"metadata.{key}", f"metadata key {key!r} is not a field of the pack's source")
        try:
            coerce_value(spec, value)
        except ValueError as exc:
            raise bad(f"metadata.{key}", f"{exc} (the field is {spec.type})") from exc
    vector = None
    if blob is not None:
        np_dtype = np.dtype(_NUMPY_DTYPES[manifest.embedding.dtype])
        if len(blob) != manifest.embedding.dim * np_dtype.itemsize:
            raise bad(
                "embedding",
                f"the embedding has {len(blob)} bytes, expected {manifest.embedding.dim} "
                f"{manifest.embedding.dtype} values",
            )
        vector = np.frombuffer(blob, dtype=np_dtype).astype(np.float32)
        if not np.all(np.isfinite(vector)):
            raise bad("embedding", "the embedding has values that are not finite numbers")
    return PackRow(str(doc_id), int(chunk), title or "", text, metadata, vector)


def read_rows(path: Path, manifest: PackManifest | None = None) -> Iterator[PackRow]:
    """Every row of the pack at `path`, checked and decoded, in file order."""
    path = Path(path)
    manifest = manifest or read_manifest(path)
    fields = {f.name: f for f in manifest.source.fields}
    duck = _duckdb()
    try:
        cursor = duck.execute(
            "select " + ", ".join(name for name, _ in COLUMNS) + " from read_parquet(?)",  # noqa: S608 - constant columns
            [str(path)],
        )
        number = 1
        while rows := cursor.fetchmany(_BATCH_ROWS):
            for raw in rows:
                yield _row(raw, number, manifest, fields, path)
                number += 1
    finally:
        duck.close()


def import_pack(
    conn: psycopg.Connection[Any],
    path: Path,
    *,
    embedding_model: str,
    embedding_dim: int | None = None,
    source_name: str | None = None,
    replace: bool = False,
    progress: bool = True,
) -> ImportReport:
    """Load the pack at `path` as a new document source (named as in the pack unless `source_name`).

    The pack's embedding model must be `embedding_model` (the one queries will be embedded with), else
    8003 and nothing is written. An existing source of that name is an error unless `replace`. Everything
    (dropping the old source, creating the new one, writing every chunk) is one transaction.
    """
    started = time.perf_counter()
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.embedding.model != embedding_model:
        raise StorageContentError(
            f"{path}: the pack was embedded with {manifest.embedding.model!r} but this agentdb embeds queries "
            f"with {embedding_model!r}; nothing was imported",
            path="pack.embedding.model",
            hint=f"export the pack from a source ingested with {embedding_model!r}, or configure the pack's "
            "model (AGENTDB_MODEL) if this agentdb has it",
        )
    if embedding_dim is not None and manifest.embedding.dim != embedding_dim:
        raise StorageContentError(
            f"{path}: the pack's vectors have dimension {manifest.embedding.dim} but the model "
            f"{embedding_model!r} makes {embedding_dim}; nothing was imported",
            path="pack.embedding.dim",
        )
    name = source_name or manifest.source.name
    check_source_name(name)
    bar = tqdm(total=manifest.chunks, unit="chunk", disable=not progress, desc=f"import {name}")
    replaced = False
    try:
        with conn.transaction():
            exists = conn.execute("select 1 from agentdb.sources where name = %s", (name,)).fetchone()
            if exists:
                if not replace:
                    raise StorageKindMismatch(
                        f"source {name!r} already exists; nothing was imported",
                        path="source",
                        hint="pass --replace to replace it, or --source NAME to import under another name",
                    )
                drop_source(conn, name)
                replaced = True
            source = create_document_source(
                conn,
                name,
                embedding_model=manifest.embedding.model,
                embedding_dim=manifest.embedding.dim,
                fields=manifest.source.fields,
                ts_config=manifest.source.ts_config,
                bm25_k1=manifest.source.bm25_k1,
                bm25_b=manifest.source.bm25_b,
                chunk_size=manifest.source.chunk_size,
                chunk_overlap=manifest.source.chunk_overlap,
            )

            def rows() -> Iterator[tuple[Any, ...]]:
                for row in read_rows(path, manifest):
                    yield (row.doc_id, row.chunk, row.title, row.text, Jsonb(row.metadata), row.embedding)
                    bar.update(1)

            try:
                drop_vector_index(conn, source)  # built again below over all the rows, in this transaction
                with conn.cursor() as cur:
                    written = copy_chunks(cur, source, rows())
                ensure_vector_index(conn, source)
            except psycopg.errors.UniqueViolation as exc:
                raise StorageContentError(
                    f"{path}: a (doc_id, chunk) pair appears twice; nothing was imported", path="pack"
                ) from exc
            documents, chunks = _source_counts(conn, source)
            if (documents, chunks) != (manifest.documents, manifest.chunks):
                raise StorageContentError(
                    f"{path}: the pack holds {documents} documents and {chunks} chunks but its manifest says "
                    f"{manifest.documents} and {manifest.chunks} (truncated or edited?); nothing was imported",
                    path="pack.chunks",
                )
            assert written == chunks
            if manifest.embedding.backends:
                record_embedding_backends(conn, source, manifest.embedding.backends)
    finally:
        bar.close()
    analyze_source(conn, source)
    return ImportReport(name, documents, chunks, replaced, time.perf_counter() - started)
