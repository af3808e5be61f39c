"""The one scoped reader: rows of a source by key under the caller's whole scope.

Its Python door over the stored function `agentdb.read` (sql/035_scope.sql): the query filters, the row
filter, row-level security through the caller's role and the `fields` projection apply to every row, and a
hidden key is indistinguishable from a missing one. Document fetch, neighbour expansion, navigation and
memory read through it; run it inside `agentdb.auth.read_scope` for a principal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agentdb.db import run_sql


@dataclass(frozen=True, slots=True)
class Row:
    """One readable chunk (a registered table's row is chunk 0); `key_index` is its key's position."""

    key_index: int
    doc_id: str
    chunk: int
    title: str | None
    text: str | None
    metadata: dict[str, Any]


def _json(value: dict[str, Any] | None) -> Jsonb | None:
    return None if value is None else Jsonb(value)


def read(
    conn: psycopg.Connection[Any],
    source: str,
    keys: Sequence[str],
    *,
    chunk_from: Sequence[int | None] | None = None,
    chunk_to: Sequence[int | None] | None = None,
    filter: dict[str, Any] | None = None,
    filter_query: dict[str, Any] | None = None,
    exclusion_query: dict[str, Any] | None = None,
    row_filter: dict[str, Any] | None = None,
    fields: list[str] | None = None,
) -> list[Row]:
    """The visible chunks of documents `keys` of `source` (positions chunk_from[i]..chunk_to[i] of keys[i]
    when given), ordered by key then chunk; keys that are missing or hidden return nothing."""
    if not keys:
        return []
    rows = run_sql(
        conn,
        "select ord, doc_id, chunk, title, text, metadata from agentdb.read(source => %(source)s,"
        " keys => %(keys)s, chunk_from => %(chunk_from)s, chunk_to => %(chunk_to)s, filter => %(filter)s,"
        " filter_query => %(filter_query)s, exclusion_query => %(exclusion_query)s,"
        " row_filter => %(row_filter)s, fields => %(fields)s)",
        {
            "source": source,
            "keys": list(keys),
            "chunk_from": None if chunk_from is None else list(chunk_from),
            "chunk_to": None if chunk_to is None else list(chunk_to),
            "filter": _json(filter),
            "filter_query": _json(filter_query),
            "exclusion_query": _json(exclusion_query),
            "row_filter": _json(row_filter),
            "fields": fields,
        },
    )
    return [
        Row(ord - 1, doc_id, chunk, title, text, metadata or {})
        for ord, doc_id, chunk, title, text, metadata in rows
    ]


__all__ = ["Row", "read"]
