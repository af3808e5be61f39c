"""The retrieval door for Python: embed the query when the mode needs it, then call agentdb.retrieve,
the single SQL implementation that the SQL functions, the CLI and HTTP share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from agentdb.embed import Embedder, load_embedder
from agentdb.errors import AgentDBError, InvalidParamValue, from_db_error
from agentdb.sources import get_source

Mode = Literal["dense", "lexical", "hybrid"]


@dataclass(frozen=True)
class Hit:
    id: str
    chunk: int
    rank: int
    score: float
    distance: float | None
    bm25_score: float | None
    rank_dense: int | None
    rank_sparse: int | None
    title: str | None
    text: str | None
    metadata: dict[str, Any]


@dataclass
class Result:
    route: Literal["found", "not_found"]
    hits: list[Hit]
    diagnostics: dict[str, Any] = field(default_factory=dict)


def _jsonb(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


def run_sql(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Execute a statement, translating agentdb's database errors into AgentDBError."""
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.Error as exc:
        mapped = from_db_error(exc)
        if mapped is None:
            raise
        raise mapped from None


def retrieve(
    conn: psycopg.Connection[Any],
    source: str,
    query: str,
    *,
    mode: Mode = "hybrid",
    top_k: int = 10,
    rrf_k: int = 60,
    threshold: float = 0.5,
    filter: dict[str, Any] | None = None,
    query_embedding: list[float] | np.ndarray | None = None,
    embedder: Embedder | None = None,
    group_by_doc: bool = False,
    ef_search: int = 100,
    candidates: int | None = None,
    row_filter: dict[str, Any] | None = None,
    fields: list[str] | None = None,
    filter_query: dict[str, Any] | None = None,
    exclusion_query: dict[str, Any] | None = None,
) -> Result:
    """Search `source`; dense and hybrid modes embed `query` with the source's model unless a vector is given."""
    if mode not in ("dense", "lexical", "hybrid"):
        raise InvalidParamValue(
            f"retrieval_mode must be dense, lexical or hybrid, not {mode!r}", path="retrieval_mode"
        )
    model = None
    if mode != "lexical" and query_embedding is None and query.strip():
        src = get_source(conn, source)
        embedder = embedder or load_embedder(src.embedding_model)
        model = embedder.model_name
        query_embedding = embedder.embed([query])[0]
    vector = None if query_embedding is None else np.asarray(query_embedding, dtype=np.float32)
    rows = run_sql(
        conn,
        "select agentdb.retrieve(%(source)s, %(query)s, %(embedding)s, %(mode)s, %(top_k)s, %(rrf_k)s,"
        " %(threshold)s, %(filter)s, %(model)s, %(group_by_doc)s, %(ef_search)s, %(candidates)s,"
        " %(row_filter)s, %(fields)s, null, %(filter_query)s, %(exclusion_query)s)",
        {
            "source": source,
            "query": query,
            "embedding": vector,
            "mode": mode,
            "top_k": top_k,
            "rrf_k": rrf_k,
            "threshold": threshold,
            "filter": _jsonb(filter),
            "model": model,
            "group_by_doc": group_by_doc,
            "ef_search": ef_search,
            "candidates": candidates,
            "row_filter": _jsonb(row_filter),
            "fields": fields,
            "filter_query": _jsonb(filter_query),
            "exclusion_query": _jsonb(exclusion_query),
        },
    )
    payload = rows[0][0]
    hits = [Hit(**{k: h.get(k) for k in Hit.__dataclass_fields__}) for h in payload["hits"]]
    return Result(route=payload["route"], hits=hits, diagnostics=payload["diagnostics"])


__all__ = ["AgentDBError", "Hit", "Mode", "Result", "retrieve", "run_sql"]
