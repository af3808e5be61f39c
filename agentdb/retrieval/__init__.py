"""The retrieval door for Python: embed the query when the mode needs it, then call agentdb.retrieve,
the single SQL implementation that the SQL functions, the CLI and HTTP share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
import psycopg

from agentdb.config import RRF_K
from agentdb.db import run_sql
from agentdb.embed import Embedder, load_embedder
from agentdb.errors import AgentDBError, InvalidParamValue
from agentdb.filters import ReadScope
from agentdb.sources import get_source

Mode = Literal["dense", "lexical", "hybrid"]
# How hybrid mode fuses its two legs (sql/040_retrieve.sql): Reciprocal Rank Fusion of the ranks, or a convex
# combination (alpha x BM25 + (1 - alpha) x cosine similarity) of the scores min-max normalised per leg.
Fusion = Literal["rrf", "convex"]


@dataclass
class Hit:
    """One retrieved chunk, the single hit type of the read path: retrieval makes it, deepening pools it,
    expansion widens it (`chunks`, `hit_chunks`), navigation makes one per visited document (`tree`), the agent
    merges it (`score` and `rank` become the merged
    ones) and generation renders it. Its JSON for HTTP clients is made in one place, the agent's response
    model (agentdb.agent.models.AgentHit)."""

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
    table: str | None = None  # the source it was read from
    chunks: list[int] | None = None  # the chunk positions its text covers, once expanded
    hit_chunks: list[int] | None = None  # the positions of the hits an expansion merged into it
    tree: dict[str, Any] | None = None  # where navigation found it: depth, parent, path, visit order

    @classmethod
    def from_row(cls, row: Mapping[str, Any], table: str | None = None) -> Hit:
        """A hit from the JSON of `agentdb.retrieve` or `agentdb.expand`, read from source `table`. By position,
        in field order (tests/test_retrieval_api.py checks it against `row`): a top 100 makes 100 hits, and
        keyword arguments of a frozen dataclass cost several times as much a hit (most of it a setattr per
        field, which is why a Hit is not frozen; nothing assigns to one, dataclasses.replace copies)."""
        get: Callable[[str], Any] = row.get  # the JSON's values, typed as the fields they fill
        chunks, hit_chunks = get("chunks"), get("hit_chunks")
        return cls(
            get("id"),
            get("chunk"),
            get("rank"),
            get("score"),
            get("distance"),
            get("bm25_score"),
            get("rank_dense"),
            get("rank_sparse"),
            get("title"),
            get("text"),
            get("metadata") or {},
            table,
            None if chunks is None else list(chunks),
            None if hit_chunks is None else list(hit_chunks),
        )

    def row(self) -> dict[str, Any]:
        """The hit as the SQL functions take it (`agentdb.expand`'s `hits`)."""
        return {name: getattr(self, name) for name in ROW_FIELDS}


# The fields of a hit in the SQL functions' JSON: Hit's fields up to metadata; the rest are added by the steps
# after retrieval.
ROW_FIELDS = tuple(f.name for f in fields(Hit) if f.name not in ("table", "chunks", "hit_chunks", "tree"))


@dataclass
class Result:
    route: Literal["found", "not_found"]
    hits: list[Hit]
    diagnostics: dict[str, Any] = field(default_factory=dict)


def retrieve(
    conn: psycopg.Connection[Any],
    source: str,
    query: str,
    *,
    mode: Mode = "hybrid",
    top_k: int = 10,
    rrf_k: int = RRF_K,
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
    fusion: Fusion = "rrf",
    alpha: float = 0.5,
    output_results: bool = False,
) -> Result:
    """Search `source`; dense and hybrid modes embed `query` with the source's model unless a vector is given.
    Hybrid mode fuses its legs by `fusion`: "rrf" (with `rrf_k`) or "convex" (with `alpha`, the BM25 weight).
    The diagnostics hold the funnel's counts; `output_results` adds `output.results`, every hit again with its
    text, which HTTP shows only when a request asks for diagnostics."""
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
        "select agentdb.retrieve(source => %(source)s, query => %(query)s, query_embedding => %(query_embedding)s,"
        " mode => %(mode)s, top_k => %(top_k)s, rrf_k => %(rrf_k)s, threshold => %(threshold)s,"
        " scope => %(scope)s, model => %(model)s, group_by_doc => %(group_by_doc)s, ef_search => %(ef_search)s,"
        " candidates => %(candidates)s, fields => %(fields)s, fusion => %(fusion)s, alpha => %(alpha)s,"
        " output_results => %(output_results)s)",
        {
            "source": source,
            "query": query,
            "query_embedding": vector,
            "mode": mode,
            "top_k": top_k,
            "rrf_k": rrf_k,
            "threshold": threshold,
            "scope": ReadScope(filter, filter_query, exclusion_query, row_filter).value(),
            "model": model,
            "group_by_doc": group_by_doc,
            "ef_search": ef_search,
            "candidates": candidates,
            "fields": fields,
            "fusion": fusion,
            "alpha": alpha,
            "output_results": output_results,
        },
    )
    payload = rows[0][0]
    hits = [Hit.from_row(h, table=source) for h in payload["hits"]]
    return Result(route=payload["route"], hits=hits, diagnostics=payload["diagnostics"])


__all__ = ["ROW_FIELDS", "AgentDBError", "Fusion", "Hit", "Mode", "Result", "retrieve"]
