"""The retrieval agent pipeline (seed 002, pipeline mode): validate every query and permission first,
run each query through agentdb.retrieve under the caller's scope, merge the hit lists by RRF, and report
steps, usage and diagnostics. The same event stream feeds the JSON response and server-sent events."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from agentdb.auth import Principal, check_fields, check_filter, check_table, check_tool, principal_scope
from agentdb.embed import Embedder, load_embedder
from agentdb.errors import AgentDBError, InvalidParamValue
from agentdb.retrieval import Hit, Mode, retrieve
from agentdb.sources import get_source

MERGE_RRF_K = 60


class FullTextSearch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    match: str
    field: str | None = None


class QuerySpec(BaseModel):
    """One query of a retrieval request: which table, which legs, which filters, how many hits."""

    model_config = ConfigDict(extra="forbid")

    table: str
    semantic_search: str | None = None
    full_text_search: str | FullTextSearch | None = None
    retrieval_mode: Mode | None = None
    filter: dict[str, Any] | None = None
    filter_query: dict[str, Any] | None = None
    exclusion_query: dict[str, Any] | None = None
    fields: list[str] | None = Field(None, max_length=256)
    limit: int = Field(10, ge=1, le=1000)
    threshold: float = Field(0.5, ge=0, le=2)
    rrf_k: int = Field(60, ge=1, le=1000)


class Generator(BaseModel):
    provider: str
    model: str | None = None


class Steps(BaseModel):
    retrieval: dict[str, Any] | None = None
    generation: dict[str, Any] | None = None


class RetrievalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(max_length=10_000)
    queries: list[QuerySpec] = Field(min_length=1, max_length=8)
    stream: bool = False
    diagnostics: bool = False
    max_internal_iterations: int = Field(0, ge=0, le=20)
    generator: Generator | None = None
    steps: Steps | None = None


class IndexScores(BaseModel):
    distance: float | None = None
    bm25: float | None = None
    rank_dense: int | None = None
    rank_sparse: int | None = None


class AgentHit(BaseModel):
    id: str = Field(alias="_id")
    score: float = Field(alias="_score")
    source: dict[str, Any] = Field(alias="_source")
    table: str = Field(alias="_table")
    chunk: int = Field(alias="_chunk")
    index_scores: IndexScores = Field(alias="_index_scores")

    model_config = ConfigDict(populate_by_name=True)


class Step(BaseModel):
    id: str
    kind: Literal["retrieval"] = "retrieval"
    name: str
    status: Literal["completed", "failed"]
    duration_ms: float
    details: dict[str, Any]


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0


class RetrievalResponse(BaseModel):
    hits: list[AgentHit]
    status: Literal["completed", "incomplete", "failed"]
    steps: list[Step]
    route: Literal["found", "not_found"]
    usage: Usage
    tool_calls_made: int = 0
    debug_info: dict[str, Any] | None = None


Event = tuple[str, dict[str, Any]]


def _unsupported(request: RetrievalRequest) -> None:
    """Model loops, navigation and generation arrive in later work: refuse them clearly, never ignore them."""
    if request.max_internal_iterations:
        raise InvalidParamValue("max_internal_iterations > 0 (the agentic model loop) is not supported yet; "
                                "use 0 for pipeline mode", path="max_internal_iterations")
    if request.steps and request.steps.retrieval and request.steps.retrieval.get("navigation") is not None:
        raise InvalidParamValue("steps.retrieval.navigation is not supported yet", path="steps.retrieval.navigation")
    if request.steps and request.steps.generation and request.steps.generation.get("enabled"):
        raise InvalidParamValue("steps.generation is not supported yet", path="steps.generation.enabled")


def _plan(spec: QuerySpec, query: str) -> tuple[Mode, str, str]:
    """The mode (given, or inferred from the legs supplied) and the texts of the lexical and dense legs."""
    full_text = spec.full_text_search.match if isinstance(spec.full_text_search, FullTextSearch) else spec.full_text_search
    mode: Mode = spec.retrieval_mode or (
        "hybrid" if (spec.semantic_search and full_text) or not (spec.semantic_search or full_text)
        else "dense" if spec.semantic_search else "lexical"
    )
    lexical_text = full_text or spec.semantic_search or query
    dense_text = spec.semantic_search or full_text or query
    return mode, lexical_text, dense_text


def validate(conn: psycopg.Connection[Any], request: RetrievalRequest, principal: Principal | None) -> list[list[str] | None]:
    """Every check that can fail before any query runs: features, tables, permissions, projections.
    Returns each query's effective projection (a field grant narrows an unrestricted request)."""
    _unsupported(request)
    projections = []
    for i, spec in enumerate(request.queries):
        if isinstance(spec.full_text_search, FullTextSearch) and spec.full_text_search.field not in (None, "text"):
            raise InvalidParamValue(
                "a field-scoped full_text_search is not supported: the lexical index covers title and text together",
                path=f"queries[{i}].full_text_search.field",
            )
        fields = spec.fields
        if principal is not None:
            check_tool(principal, "search")
            check_table(principal, spec.table, path=f"queries[{i}].table")
            fields = check_fields(principal, spec.fields, path=f"queries[{i}].fields")
        try:
            source = get_source(conn, spec.table)
        except AgentDBError as exc:
            exc.path = f"queries[{i}].table"
            raise
        if principal is not None:
            for name in ("filter", "filter_query", "exclusion_query"):
                check_filter(conn, principal, source, getattr(spec, name), path=name)
        projections.append(fields)
    return projections


def read_scope(conn: psycopg.Connection[Any], principal: Principal | None) -> AbstractContextManager[Any]:
    """Every read of a principal runs under its database role (grants and row security); none in local dev."""
    return principal_scope(conn, principal) if principal is not None else nullcontext(conn)


def _agent_hit(hit: Hit, table: str, score: float) -> dict[str, Any]:
    source = dict(hit.metadata or {})
    if hit.title is not None:
        source["title"] = hit.title
    if hit.text is not None:
        source["text"] = hit.text
    return {
        "_id": hit.id, "_score": score, "_source": source, "_table": table, "_chunk": hit.chunk,
        "_index_scores": {"distance": hit.distance, "bm25": hit.bm25_score,
                          "rank_dense": hit.rank_dense, "rank_sparse": hit.rank_sparse},
    }


def merge(hit_lists: list[tuple[str, list[Hit]]], limit: int) -> list[dict[str, Any]]:
    """One list: a single query keeps its own scores; several are fused by RRF over their ranks.
    Hits are de-duplicated by (table, document id), keeping the best chunk."""
    if len(hit_lists) == 1:
        table, hits = hit_lists[0]
        seen: set[str] = set()
        out = []
        for hit in hits:
            if hit.id not in seen:
                seen.add(hit.id)
                out.append(_agent_hit(hit, table, hit.score))
        return out[:limit]
    fused: dict[tuple[str, str], float] = {}
    best: dict[tuple[str, str], tuple[str, Hit]] = {}
    for table, hits in hit_lists:
        rank = 0
        seen_here: set[str] = set()
        for hit in hits:
            if hit.id in seen_here:
                continue
            seen_here.add(hit.id)
            rank += 1
            key = (table, hit.id)
            fused[key] = fused.get(key, 0.0) + 1.0 / (MERGE_RRF_K + rank)
            best.setdefault(key, (table, hit))
    ordered = sorted(fused, key=lambda k: (-fused[k], k))
    return [_agent_hit(best[k][1], k[0], fused[k]) for k in ordered[:limit]]


def run(
    conn: psycopg.Connection[Any],
    request: RetrievalRequest,
    principal: Principal | None,
    *,
    embedder_for: Callable[[str], Embedder] = load_embedder,
) -> Iterator[Event]:
    """The pipeline as events: step_started / step_completed per query, then one `hit` each, then `done`.
    Validation errors are raised before the first event."""
    projections = validate(conn, request, principal)
    steps: list[dict[str, Any]] = []
    results: list[tuple[str, list[Hit]]] = []
    diagnostics: list[dict[str, Any]] = []
    for i, (spec, fields) in enumerate(zip(request.queries, projections, strict=True)):
        mode, lexical_text, dense_text = _plan(spec, request.query)
        step = {"id": f"retrieval_{i}", "kind": "retrieval", "name": f"query_{i}", "status": "completed"}
        yield "step_started", {**step, "status": "running", "details": {"table": spec.table, "retrieval_mode": mode}}
        started = time.perf_counter()
        embedding = None
        if mode != "lexical" and dense_text.strip():
            embedding = embedder_for(get_source(conn, spec.table).embedding_model).embed([dense_text])[0]
        with read_scope(conn, principal):
            result = retrieve(
                conn, spec.table, lexical_text, mode=mode, top_k=spec.limit, rrf_k=spec.rrf_k,
                threshold=spec.threshold, filter=spec.filter, filter_query=spec.filter_query,
                exclusion_query=spec.exclusion_query, fields=fields, query_embedding=embedding,
                row_filter=principal.row_filter if principal else None,
            )
        done_step = {
            **step, "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "details": {"table": spec.table, "retrieval_mode": mode, "route": result.route,
                        "result_count": len(result.hits)},
        }
        steps.append(done_step)
        results.append((spec.table, result.hits))
        diagnostics.append({"query_index": i, "table": spec.table, **result.diagnostics})
        yield "step_completed", done_step
    hits = merge(results, max(q.limit for q in request.queries))
    for hit in hits:
        yield "hit", hit
    yield "done", {
        "status": "completed", "route": "found" if hits else "not_found", "steps": steps,
        "usage": Usage().model_dump(), "tool_calls_made": 0,
        "debug_info": {"queries": diagnostics} if request.diagnostics else None,
    }


def respond(events: Iterator[Event]) -> RetrievalResponse:
    """Collect the event stream into the JSON response."""
    hits = []
    final: dict[str, Any] = {}
    for kind, payload in events:
        if kind == "hit":
            hits.append(payload)
        elif kind == "done":
            final = payload
    return RetrievalResponse.model_validate({**final, "hits": hits})
