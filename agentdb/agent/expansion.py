"""Retrieve-then-expand: widen hits with their neighbouring chunks and merge windows that meet.

The work is done by the stored function `agentdb.expand` (sql/060_expand.sql, where the rules are written
down); this module is its Python door.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agentdb.db import run_sql
from agentdb.filters import UNFILTERED, ReadScope
from agentdb.retrieval import Hit

DEFAULT_WINDOW = 3


def expand(
    conn: psycopg.Connection[Any],
    source: str,
    hits: Sequence[Hit | Mapping[str, Any]],
    window: int = DEFAULT_WINDOW,
    *,
    scope: ReadScope = UNFILTERED,
    fields: list[str] | None = None,
) -> list[Hit]:
    """Expand `hits` of `source` (as returned by `agentdb.retrieval.retrieve`, or the SQL function's own JSON
    objects) to windows of `window` chunks. Each result keeps its best merged hit's fields and gets the merged
    text, the chunk positions it covers (`chunks`) and those of the input hits it absorbed (`hit_chunks`).

    Every neighbour is read through the scoped reader `agentdb.read`: `scope` (the query filters and the row
    filter) applies, and `fields` projects the text, as in the retrieval that produced the hits; run it under
    the same principal scope as that retrieval.
    """
    if not hits:
        return []
    rows = [h.row() if isinstance(h, Hit) else dict(h) for h in hits]
    # The function needs only each hit's key and rank, and keeps every field of a group's best hit: it is sent
    # those (and the hit's position, `i`) and the other fields are put back here, so the texts, titles and
    # metadata of the hits do not travel to the database and back.
    slim = [
        {"id": r.get("id"), "chunk": r.get("chunk"), "rank": r.get("rank"), "i": i}
        for i, r in enumerate(rows)
    ]
    merged = run_sql(
        conn,
        "select agentdb.expand(source => %(source)s, hits => %(hits)s, expand_window => %(window)s,"
        " scope => %(scope)s, fields => %(fields)s)",
        {
            "source": source,
            "hits": Jsonb(slim),
            "window": window,
            "scope": scope.value(),
            "fields": fields,
        },
    )[0][0]
    out = []
    for item in merged:
        row = {**rows[item["i"]], "chunks": item["chunks"], "hit_chunks": item["hit_chunks"]}
        if "text" in item:
            row["text"] = item["text"]
        out.append(Hit.from_row(row, table=source))
    return out


__all__ = ["DEFAULT_WINDOW", "expand"]
