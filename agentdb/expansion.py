"""Retrieve-then-expand (seed 003): widen hits with their neighbouring chunks and merge windows that meet.

The work is done by the stored function `agentdb.expand` (sql/060_expand.sql, where the rules are written
down); this module is its Python door.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agentdb.retrieval import Hit, run_sql

DEFAULT_WINDOW = 3


@dataclass(frozen=True)
class ExpandedHit(Hit):
    """A hit widened to a window of its document: the best merged hit's fields, the merged text, the chunk
    positions it covers (`chunks`) and the positions of the input hits it absorbed (`hit_chunks`)."""

    chunks: list[int] = field(default_factory=list)
    hit_chunks: list[int] = field(default_factory=list)


_HIT_FIELDS = [f.name for f in dataclasses.fields(Hit)]


def _as_json(hit: Hit | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(hit, Hit):
        return {name: getattr(hit, name) for name in _HIT_FIELDS}
    return dict(hit)


def expand(
    conn: psycopg.Connection[Any],
    source: str,
    hits: Sequence[Hit | Mapping[str, Any]],
    window: int = DEFAULT_WINDOW,
    *,
    filter: dict[str, Any] | None = None,
    row_filter: dict[str, Any] | None = None,
    fields: list[str] | None = None,
) -> list[ExpandedHit]:
    """Expand `hits` of `source` (as returned by `agentdb.retrieval.retrieve`) to windows of `window` chunks.

    `filter` and `row_filter` are re-applied to every neighbour read, and `fields` projects the text, as in
    the retrieval that produced the hits; run it under the same principal scope as that retrieval.
    """
    if not hits:
        return []
    rows = run_sql(
        conn,
        "select agentdb.expand(%(source)s, %(hits)s, %(window)s, %(filter)s, %(row_filter)s, %(fields)s)",
        {
            "source": source,
            "hits": Jsonb([_as_json(h) for h in hits]),
            "window": window,
            "filter": None if filter is None else Jsonb(filter),
            "row_filter": None if row_filter is None else Jsonb(row_filter),
            "fields": fields,
        },
    )
    out = []
    for item in rows[0][0]:
        values = {name: item.get(name) for name in _HIT_FIELDS}
        values["metadata"] = values["metadata"] or {}
        out.append(ExpandedHit(**values, chunks=list(item["chunks"]), hit_chunks=list(item["hit_chunks"])))
    return out


__all__ = ["DEFAULT_WINDOW", "ExpandedHit", "expand"]
