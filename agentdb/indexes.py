"""Hierarchy and graph indexes over a source: declaring them, loading explicit edges, checking them, and the
neighbours of a node as the caller may see them.

The work is done by stored functions (sql/070_indexes.sql) so that SQL, Python, the CLI and HTTP give the same
results and errors: a tree from a parent-key field (edge parent -> child, type `child`), a graph from a key-list
or single-key field (node -> key, e.g. `links` -> `xref`), or explicit edges from a JSONL/CSV file or a request.
Field-derived edges are kept current by the source's statement triggers; `check_indexes` compares them with the
documents and `rebuild_indexes` repairs them.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import orjson
import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from agentdb.db import run_sql
from agentdb.errors import (
    AgentDBError,
    Forbidden,
    InvalidParamValue,
    StorageContentError,
    StorageFileNotFound,
)
from agentdb.filters import UNFILTERED, ReadScope
from agentdb.ingest.readers import json_objects
from agentdb.sources import Source

INDEX_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
IndexKind = Literal["tree", "graph"]
Direction = Literal["out", "in", "both"]
# Keys an explicit edge may have (agentdb.index_add_edges checks them too).
EDGE_KEYS = ("from", "to", "type", "weight", "metadata")
# Edges go to the database this many at a time, all in one transaction.
EDGE_BATCH = 10_000
_EDGE_PATH = re.compile(r"^edges\[(\d+)\](.*)$")


class IndexInfo(BaseModel):
    """A declared index: `field` is None for explicit edges; `edges` counts its stored edges."""

    name: str
    kind: IndexKind
    field: str | None
    edge_type: str
    edges: int
    created_at: datetime


@dataclass(frozen=True)
class IndexCheck:
    """How the stored edges of one index differ from what the documents imply. `missing` and `extra` are
    mismatches of field-derived edges; `dangling` edges name a key that has no document (they are kept)."""

    index: str
    missing: int
    extra: int
    dangling: int

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.extra == 0


@dataclass(frozen=True)
class Neighbor:
    key: str
    edge_type: str
    weight: float


@dataclass(frozen=True)
class EdgeRecord:
    """An edge read from a file, with where it came from (for error paths such as `edges.csv:4.to`)."""

    file: str
    line: int
    edge: dict[str, Any]


def check_index_name(name: str, path: str = "name") -> None:
    if not isinstance(name, str) or not INDEX_NAME.match(name):
        raise InvalidParamValue(
            f"invalid index name {name!r}: use lowercase letters, digits and _, starting with a letter (max 63)",
            path=path,
        )


def create_index(
    conn: psycopg.Connection[Any],
    source: str,
    name: str,
    *,
    kind: IndexKind,
    field: str | None = None,
    edge_type: str | None = None,
) -> IndexInfo:
    """Declare index `name` on `source` (a tree or graph from `field`, or explicit edges when `field` is None)
    and build its edges from the current documents in the same transaction. 3007 at name, kind, field or
    edge_type; 3010 for an unknown source; 1409 Conflict when the name is taken."""
    check_index_name(name)
    row = run_sql(
        conn,
        "select agentdb.index_create(source => %(s)s, name => %(n)s, kind => %(k)s, field => %(f)s,"
        " edge_type => %(t)s)",
        {"s": source, "n": name, "k": kind, "f": field, "t": edge_type},
    )
    return IndexInfo.model_validate(row[0][0])


def list_indexes(conn: psycopg.Connection[Any], source: str) -> list[IndexInfo]:
    """The indexes of `source` by name, with their edge counts (3010 for an unknown source)."""
    rows = run_sql(
        conn,
        "select name, kind, field, edge_type, edges, created_at from agentdb.index_list(source => %(s)s)",
        {"s": source},
    )
    return [
        IndexInfo(name=r[0], kind=r[1], field=r[2], edge_type=r[3], edges=r[4], created_at=r[5]) for r in rows
    ]


def get_index(conn: psycopg.Connection[Any], source: str, name: str) -> IndexInfo:
    """Index `name` of `source`, or 3010 at `index`."""
    for info in list_indexes(conn, source):
        if info.name == name:
            return info
    raise StorageFileNotFound(
        f"source {source!r} has no index {name!r}",
        path="index",
        hint=f"list them with `agentdb index list {source}`",
    )


def check_index(
    conn: psycopg.Connection[Any],
    source: Source | str,
    name: str,
    strategy: str | None = None,
    *,
    path: str = "index",
    fields: Sequence[str] | None = None,
) -> IndexInfo:
    """Index `name` of `source` as a navigation may use it: 3010 at `path` when the source has no such index;
    3007 at `path` when `strategy` is "tree" and the index is a graph (a tree walk needs one parent per node;
    a graph walk takes either kind). With `fields` (a caller's field grant), an index over a field outside it
    is 403 at `path`: its edges would show that field's values."""
    source_name = source if isinstance(source, str) else source.name
    try:
        info = get_index(conn, source_name, name)
    except AgentDBError as exc:
        exc.path = path
        raise
    if strategy == "tree" and info.kind != "tree":
        raise InvalidParamValue(
            f"index {name!r} of source {source_name!r} is a graph: tree navigation needs a tree index",
            path=path,
            hint=f"use strategy graph, or an index listed as tree by `agentdb index list {source_name}`",
        )
    if fields is not None and info.field is not None and info.field not in fields:
        raise Forbidden(f"the index {name!r} is built from a field outside the caller's grant", path=path)
    return info


def drop_index(conn: psycopg.Connection[Any], source: str, name: str) -> int:
    """Remove index `name` of `source` with its edges; returns how many edges went (3010 when unknown)."""
    row = run_sql(
        conn, "select agentdb.index_drop(source => %(s)s, index => %(n)s)", {"s": source, "n": name}
    )
    return int(row[0][0])


def add_edges(conn: psycopg.Connection[Any], source: str, index: str, edges: Sequence[Any]) -> int:
    """Add explicit edges ({"from", "to", "type", "weight", "metadata"}) to an index without a field, all or
    nothing: the first bad edge is 3007 at `edges[i]...` and nothing is written. Returns how many were written
    (an edge given twice, or already stored, counts once and takes the last weight and metadata)."""
    written = 0
    with conn.transaction():
        for start in range(0, len(edges), EDGE_BATCH) or [0]:
            batch = list(edges[start : start + EDGE_BATCH])
            try:
                row = run_sql(
                    conn,
                    "select agentdb.index_add_edges(source => %(s)s, index => %(n)s, edges => %(e)s)",
                    {"s": source, "n": index, "e": Jsonb(batch)},
                )
            except AgentDBError as exc:
                raise _shift(exc, start) from None
            written += int(row[0][0])
    return written


def _shift(exc: AgentDBError, offset: int) -> AgentDBError:
    """`exc` with the edge position in its path and message moved by `offset` (a batch's first edge)."""
    match = _EDGE_PATH.match(exc.path or "")
    if not match or offset == 0:
        return exc
    position = int(match.group(1))
    exc.path = f"edges[{position + offset}]{match.group(2)}"
    exc.message = exc.message.replace(f"edges[{position}]", f"edges[{position + offset}]", 1)
    return exc


def read_edges_file(path: Path) -> list[EdgeRecord]:
    """The edges of a JSONL file (one object a line) or a CSV file with a header (from, to and optionally type,
    weight, metadata as JSON), gzip too. A line that is not an edge object is 3007 at `FILE:LINE`."""
    if not path.exists():
        raise StorageFileNotFound(f"{path}: no such file", path="edges")
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    kind = suffixes[-1] if suffixes else ""
    if kind in (".jsonl", ".ndjson", ".json"):
        return list(_read_jsonl(path))
    if kind == ".csv":
        return list(_read_csv(path))
    raise StorageContentError(
        f"{path}: unknown edge file type; expected .jsonl or .csv (optionally .gz)", path="edges"
    )


def _open(path: Path) -> io.TextIOBase:
    """The file as text (UTF-8, newlines kept for the CSV reader), gunzipped when it ends in .gz."""
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")  # noqa: SIM115 - closed by the caller's with


def _read_jsonl(path: Path) -> Iterator[EdgeRecord]:
    def at(number: int) -> str:
        return f"{path.name}:{number}"

    with _open(path) as handle:
        for number, edge in json_objects(handle, "an edge", at, at):
            yield EdgeRecord(path.name, number, edge)


def _read_csv(path: Path) -> Iterator[EdgeRecord]:
    with _open(path) as text:
        reader = csv.reader(text, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                return
            header = [h.strip() for h in header]
            for column in header:
                if column not in EDGE_KEYS:
                    raise InvalidParamValue(
                        f"{path.name}:1: unknown column {column!r}; an edge file has columns "
                        + ", ".join(EDGE_KEYS),
                        path=f"{path.name}:1.{column}",
                    )
            for row in reader:
                number = reader.line_num
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise InvalidParamValue(
                        f"{path.name}:{number}: {len(row)} values for {len(header)} columns",
                        path=f"{path.name}:{number}",
                    )
                yield EdgeRecord(
                    path.name, number, _csv_edge(path.name, number, dict(zip(header, row, strict=True)))
                )
        except csv.Error as exc:
            raise InvalidParamValue(
                f"{path.name}:{reader.line_num}: malformed CSV: {exc}", path=f"{path.name}:{reader.line_num}"
            ) from None


def _csv_edge(file: str, line: int, cells: dict[str, str]) -> dict[str, Any]:
    """A CSV row as an edge object: empty type, weight and metadata cells are absent; weight is a number when
    it reads as one (else the text, which the database refuses with its path) and metadata is JSON."""
    edge: dict[str, Any] = {"from": cells.get("from", ""), "to": cells.get("to", "")}
    if cells.get("type", "").strip():
        edge["type"] = cells["type"].strip()
    weight = cells.get("weight", "").strip()
    if weight:
        try:
            edge["weight"] = float(weight)
        except ValueError:
            edge["weight"] = weight
    metadata = cells.get("metadata", "").strip()
    if metadata:
        try:
            edge["metadata"] = orjson.loads(metadata)
        except orjson.JSONDecodeError as exc:
            raise InvalidParamValue(
                f"{file}:{line}: metadata is not JSON: {exc}", path=f"{file}:{line}.metadata"
            ) from None
    return edge


def load_edges(conn: psycopg.Connection[Any], source: str, index: str, records: Sequence[EdgeRecord]) -> int:
    """`add_edges` for edges read from a file: an error names the file and line (`edges.csv:4.to`)."""
    try:
        return add_edges(conn, source, index, [r.edge for r in records])
    except InvalidParamValue as exc:
        match = _EDGE_PATH.match(exc.path or "")
        if not match:
            raise
        record = records[int(match.group(1))]
        where = f"{record.file}:{record.line}"
        message = exc.message.replace(f"edges[{match.group(1)}]", where, 1)
        raise InvalidParamValue(message, path=where + match.group(2), hint=exc.hint) from None


def create_index_from_file(
    conn: psycopg.Connection[Any],
    source: str,
    name: str,
    path: Path,
    *,
    kind: IndexKind = "graph",
    edge_type: str | None = None,
) -> IndexInfo:
    """Create an index of explicit edges and load them from `path`, in one transaction (a bad edge leaves
    no index behind)."""
    records = read_edges_file(path)
    with conn.transaction():
        create_index(conn, source, name, kind=kind, edge_type=edge_type)
        load_edges(conn, source, name, records)
        return get_index(conn, source, name)


def check_indexes(conn: psycopg.Connection[Any], source: str, index: str | None = None) -> list[IndexCheck]:
    """Compare the edges of `source`'s indexes (or of `index`) with what the documents imply."""
    rows = run_sql(
        conn,
        "select index_name, what, mismatches from agentdb.index_check(source => %(s)s, index => %(i)s)",
        {"s": source, "i": index},
    )
    found: dict[str, dict[str, int]] = {}
    for name, what, count in rows:
        found.setdefault(name, {})[what] = int(count)
    return [IndexCheck(index=name, **counts) for name, counts in found.items()]


def rebuild_indexes(conn: psycopg.Connection[Any], source: str, index: str | None = None) -> int:
    """Rebuild the field-derived edges of `source`'s indexes (or of `index`) from the documents; returns the
    number of edges written. Explicit edges are left alone."""
    row = run_sql(
        conn, "select agentdb.index_rebuild(source => %(s)s, index => %(i)s)", {"s": source, "i": index}
    )
    return int(row[0][0])


def neighbors(
    conn: psycopg.Connection[Any],
    source: str,
    index: str,
    key: str,
    *,
    direction: Direction = "out",
    edge_types: Sequence[str] | None = None,
    max: int = 8,  # noqa: A002 - the SQL door's name
    scope: ReadScope = UNFILTERED,
) -> list[Neighbor]:
    """The neighbours of `key` that the connection's role may read (agentdb.neighbors): run it inside
    `agentdb.auth.read_scope` for a principal. Ordered by weight, then key and edge type."""
    rows = run_sql(
        conn,
        "select key, edge_type, weight from agentdb.neighbors(source => %(s)s, index => %(i)s,"
        " node => %(k)s, direction => %(d)s, edge_types => %(t)s, max => %(m)s, scope => %(scope)s)",
        {
            "s": source,
            "i": index,
            "k": key,
            "d": direction,
            "t": None if edge_types is None else list(edge_types),
            "m": max,
            "scope": scope.value(),
        },
    )
    return [Neighbor(key=r[0], edge_type=r[1], weight=float(r[2])) for r in rows]


def roots(
    conn: psycopg.Connection[Any],
    source: str,
    index: str,
    *,
    max: int | None = None,  # noqa: A002 - the SQL door's name
    scope: ReadScope = UNFILTERED,
) -> list[str]:
    """The roots of an index (documents no other document points to) that the connection's role may read
    (agentdb.index_roots), by key."""
    rows = run_sql(
        conn,
        "select key from agentdb.index_roots(source => %(s)s, index => %(i)s, max => %(m)s, scope => %(scope)s)",
        {
            "s": source,
            "i": index,
            "m": max,
            "scope": scope.value(),
        },
    )
    return [r[0] for r in rows]


__all__ = [
    "EdgeRecord",
    "IndexCheck",
    "IndexInfo",
    "Neighbor",
    "add_edges",
    "check_index",
    "check_index_name",
    "check_indexes",
    "create_index",
    "create_index_from_file",
    "drop_index",
    "get_index",
    "list_indexes",
    "load_edges",
    "neighbors",
    "read_edges_file",
    "rebuild_indexes",
    "roots",
]
