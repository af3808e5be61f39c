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

from agentdb.db import run_sql
from agentdb.filters import UNFILTERED, ReadScope


@dataclass(frozen=True, slots=True)
class Row:
    """One readable chunk (a registered table's row is chunk 0); `key_index` is its key's position."""

    key_index: int
    doc_id: str
    chunk: int
    title: str | None
    text: str | None
    metadata: dict[str, Any]


def read(
    conn: psycopg.Connection[Any],
    source: str,
    keys: Sequence[str],
    *,
    chunk_from: Sequence[int | None] | None = None,
    chunk_to: Sequence[int | None] | None = None,
    scope: ReadScope = UNFILTERED,
    fields: list[str] | None = None,
) -> list[Row]:
    """The visible chunks of documents `keys` of `source` under `scope` (positions chunk_from[i]..chunk_to[i]
    of keys[i] when given), ordered by key then chunk; keys that are missing or hidden return nothing."""
    if not keys:
        return []
    rows = run_sql(
        conn,
        "select ord, doc_id, chunk, title, text, metadata from agentdb.read(source => %(source)s,"
        " keys => %(keys)s, chunk_from => %(chunk_from)s, chunk_to => %(chunk_to)s, scope => %(scope)s,"
        " fields => %(fields)s)",
        {
            "source": source,
            "keys": list(keys),
            "chunk_from": None if chunk_from is None else list(chunk_from),
            "chunk_to": None if chunk_to is None else list(chunk_to),
            "scope": scope.value(),
            "fields": fields,
        },
    )
    return [
        Row(ord - 1, doc_id, chunk, title, text, metadata or {})
        for ord, doc_id, chunk, title, text, metadata in rows
    ]


__all__ = ["Row", "read"]
