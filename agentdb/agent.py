"""The retrieval agent pipeline (seed 002, pipeline mode): validate every query and permission first,
run each query through agentdb.retrieve under the caller's scope, merge the hit lists by RRF, and report
steps, usage and diagnostics. The same event stream feeds the JSON response and server-sent events."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentdb.auth import Principal, check_fields, check_filter, check_table, check_tool, principal_scope
from agentdb.config import Settings
from agentdb.deepening import DeepeningOptions, deepen
from agentdb.embed import Embedder, load_embedder
from agentdb.errors import AgentDBError, InvalidParamValue
from agentdb.expansion import expand
from agentdb.filters import validate_filter
from agentdb.generation import GenerationResult, GenerationStep, generate
from agentdb.llm import GeneratorSpec, Usage, UsageMeter, resolve_model
from agentdb.retrieval import Hit, Mode, Result, retrieve
from agentdb.sources import get_source

MERGE_RRF_K = 60
# Query texts are questions, not documents: longer ones are refused before they reach the database.
MAX_QUERY_CHARS = 10_000


class FullTextSearch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    match: str = Field(max_length=MAX_QUERY_CHARS)
    field: str | None = None


class QuerySpec(BaseModel):
    """One query of a retrieval request: which table, which legs, which filters, how many hits."""

    model_config = ConfigDict(extra="forbid")

    table: str
    semantic_search: str | None = Field(None, max_length=MAX_QUERY_CHARS)
    full_text_search: str | FullTextSearch | None = None
    retrieval_mode: Mode | None = None
    filter: dict[str, Any] | None = None
    filter_query: dict[str, Any] | None = None
    exclusion_query: dict[str, Any] | None = None
    fields: list[str] | None = Field(None, max_length=256)
    limit: int = Field(10, ge=1, le=1000)
    threshold: float = Field(0.5, ge=0, le=2)
    rrf_k: int = Field(60, ge=1, le=1000)

    @field_validator("full_text_search")
    @classmethod
    def _short_text(cls, value: str | FullTextSearch | None) -> str | FullTextSearch | None:
        if isinstance(value, str) and len(value) > MAX_QUERY_CHARS:
            raise ValueError(f"String should have at most {MAX_QUERY_CHARS} characters")
        return value


class RetrievalOptions(BaseModel):
    """`steps.retrieval`: agentic deepening (seed 003), neighbour expansion, and (later) navigation."""

    model_config = ConfigDict(extra="forbid")

    navigation: dict[str, Any] | None = None
    deepening: dict[str, Any] | None = None
    expand_window: int = Field(3, ge=1, le=101)


class Steps(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retrieval: RetrievalOptions | None = None
    generation: dict[str, Any] | None = None


class RetrievalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(max_length=MAX_QUERY_CHARS)
    queries: list[QuerySpec] = Field(min_length=1, max_length=8)
    stream: bool = False
    diagnostics: bool = False
    max_internal_iterations: int = Field(0, ge=0, le=20)
    generator: GeneratorSpec | None = None
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
    chunks: list[int] | None = Field(None, alias="_chunks")
    index_scores: IndexScores = Field(alias="_index_scores")

    model_config = ConfigDict(populate_by_name=True)


class Step(BaseModel):
    id: str
    kind: Literal["retrieval", "deepening", "expansion", "generation"] = "retrieval"
    name: str
    status: Literal["completed", "failed"]
    duration_ms: float
    details: dict[str, Any]


class UsageOut(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0


class RetrievalResponse(BaseModel):
    hits: list[AgentHit]
    status: Literal["completed", "incomplete", "failed"]
    steps: list[Step]
    route: Literal["found", "not_found"]
    usage: UsageOut
    generation: dict[str, Any] | None = None
    tool_calls_made: int = 0
    debug_info: dict[str, Any] | None = None


Event = tuple[str, dict[str, Any]]


@dataclass
class Plan:
    """What a validated request will do beyond retrieval, with its models resolved (no network yet)."""

    projections: list[list[str] | None]
    expand_window: int = 1
    deepening: DeepeningOptions | None = None
    judge: UsageMeter | None = None
    generation: GenerationStep | None = None
    generator: UsageMeter | None = None
    meters: list[UsageMeter] = field(default_factory=list)

    def usage(self) -> Usage:
        total = Usage()
        for meter in self.meters:
            total = total + meter.usage
        return total


def _features(request: RetrievalRequest, settings: Settings, plan: Plan) -> None:
    """Parse the optional steps and resolve their models; the model loop and navigation come later, so
    asking for them is a clear 400, never a silent ignore."""
    if request.max_internal_iterations:
        raise InvalidParamValue(
            "max_internal_iterations > 0 (the agentic model loop) is not supported yet; "
            "use 0 for pipeline mode",
            path="max_internal_iterations",
        )
    options = (
        request.steps.retrieval
        if request.steps and request.steps.retrieval
        else RetrievalOptions.model_validate({})
    )
    if options.navigation is not None:
        raise InvalidParamValue(
            "steps.retrieval.navigation is not supported yet", path="steps.retrieval.navigation"
        )
    plan.expand_window = options.expand_window
    if options.deepening is not None:
        plan.deepening = DeepeningOptions.parse(options.deepening, path="steps.retrieval.deepening")
        where = "steps.retrieval.deepening.generator" if plan.deepening.generator else "generator"
        plan.judge = UsageMeter(
            resolve_model(plan.deepening.generator or request.generator, settings, path=where)
        )
        plan.meters.append(plan.judge)
    if request.steps and request.steps.generation is not None:
        step = GenerationStep.parse(request.steps.generation, path="steps.generation")
        if step.enabled:
            step.check_query(request.query)
            where = "steps.generation.generator" if step.generator else "generator"
            plan.generation = step
            plan.generator = UsageMeter(
                resolve_model(step.generator or request.generator, settings, path=where)
            )
            plan.meters.append(plan.generator)


def _plan(spec: QuerySpec, query: str) -> tuple[Mode, str, str]:
    """The mode (given, or inferred from the legs supplied) and the texts of the lexical and dense legs."""
    full_text = (
        spec.full_text_search.match
        if isinstance(spec.full_text_search, FullTextSearch)
        else spec.full_text_search
    )
    mode: Mode = spec.retrieval_mode or (
        "hybrid"
        if (spec.semantic_search and full_text) or not (spec.semantic_search or full_text)
        else "dense"
        if spec.semantic_search
        else "lexical"
    )
    lexical_text = full_text or spec.semantic_search or query
    dense_text = spec.semantic_search or full_text or query
    return mode, lexical_text, dense_text


def validate(
    conn: psycopg.Connection[Any], request: RetrievalRequest, principal: Principal | None, settings: Settings
) -> Plan:
    """Every check that can fail before any query runs or any model is called: features and their models,
    tables, permissions, projections (a field grant narrows an unrestricted request)."""
    plan = Plan(projections=[])
    _features(request, settings, plan)
    projections = plan.projections
    for i, spec in enumerate(request.queries):
        if isinstance(spec.full_text_search, FullTextSearch) and spec.full_text_search.field not in (
            None,
            "text",
        ):
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
        for name in ("filter", "filter_query", "exclusion_query"):
            where = f"queries[{i}].{name}"
            if principal is not None:
                check_filter(conn, principal, source, getattr(spec, name), path=where)
            else:
                validate_filter(conn, source, getattr(spec, name), where)
        projections.append(fields)
    return plan


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
        "_id": hit.id,
        "_score": score,
        "_source": source,
        "_table": table,
        "_chunk": hit.chunk,
        "_chunks": getattr(hit, "chunks", None),
        "_index_scores": {
            "distance": hit.distance,
            "bm25": hit.bm25_score,
            "rank_dense": hit.rank_dense,
            "rank_sparse": hit.rank_sparse,
        },
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


@contextmanager
def in_query(index: int) -> Iterator[None]:
    """Errors raised for one query carry the full path from the request root (`queries[1].fields[0]`)."""
    try:
        yield
    except AgentDBError as exc:
        if exc.path and not exc.path.startswith("queries["):
            exc.path = f"queries[{index}].{exc.path}"
        raise


def _retrieve_query(
    conn: psycopg.Connection[Any],
    index: int,
    request: RetrievalRequest,
    spec: QuerySpec,
    fields: list[str] | None,
    principal: Principal | None,
    plan: Plan,
    embedder_for: Callable[[str], Embedder],
) -> Iterator[tuple[str, Any]]:
    """One query: retrieval (deepened by the judge when asked), then neighbour expansion. Yields the step
    events, and finally ("result", (hits, diagnostics))."""
    mode, lexical_text, dense_text = _plan(spec, request.query)
    embedding = None
    if mode != "lexical" and dense_text.strip():
        embedding = embedder_for(get_source(conn, spec.table).embedding_model).embed([dense_text])[0]

    def retrieve_k(k: int) -> Result:
        # Hits are documents: the best chunk of each, so `limit` counts distinct documents.
        with read_scope(conn, principal), in_query(index):
            return retrieve(
                conn,
                spec.table,
                lexical_text,
                mode=mode,
                top_k=k,
                rrf_k=spec.rrf_k,
                threshold=spec.threshold,
                filter=spec.filter,
                filter_query=spec.filter_query,
                exclusion_query=spec.exclusion_query,
                fields=fields,
                query_embedding=embedding,
                group_by_doc=True,
                row_filter=principal.row_filter if principal else None,
            )

    result = retrieve_k(spec.limit)
    hits: list[Hit] = list(result.hits)
    if plan.deepening is not None and plan.judge is not None:
        rounds = deepen(
            lambda k: retrieve_k(min(k, 1000)).hits,
            plan.judge,
            request.query,
            top_k=min(spec.limit, plan.deepening.max_chunks),
            max_iters=plan.deepening.max_iters,
            max_chunks=plan.deepening.max_chunks,
            function_call_max_trials=plan.deepening.function_call_max_trials,
            source=spec.table,
        )
        hits = list(rounds.hits)
        for summary in rounds.rounds:
            yield (
                "step_completed",
                {
                    "id": f"deepening_{spec.table}_{summary.round}",
                    "kind": "deepening",
                    "name": "deepening_round",
                    "status": "completed",
                    "duration_ms": 0.0,
                    "details": {**summary.to_dict(), "table": spec.table, "stopped": rounds.stopped},
                },
            )
    if plan.expand_window > 1 and hits:
        with read_scope(conn, principal), in_query(index):
            hits = list(
                expand(
                    conn,
                    spec.table,
                    hits,
                    plan.expand_window,
                    filter=spec.filter,
                    row_filter=principal.row_filter if principal else None,
                    fields=fields,
                )
            )
    yield "result", (mode, result, hits)


def _generate(
    plan: Plan, request: RetrievalRequest, hits: list[dict[str, Any]], stream: bool
) -> Iterator[Event]:
    """The generation step over the merged hits; when streaming, text deltas arrive as `generation`
    events (the model call runs in a worker thread feeding a queue), then the final answer."""
    assert plan.generation is not None and plan.generator is not None
    knowledge: dict[str, list[dict[str, Any]]] = {}
    for hit in hits:
        knowledge.setdefault(hit["_table"], []).append(hit)
    step, model = plan.generation, plan.generator

    def ask(
        cancel: threading.Event | None = None, on_text: Callable[[str], None] | None = None
    ) -> GenerationResult:
        return generate(
            model,
            request.query,
            knowledge,
            system_prompt=step.system_prompt,
            template=step.template,
            placement=step.placement,
            max_tokens=step.max_tokens,
            cancel=cancel,
            on_text=on_text,
        )

    started = time.perf_counter()
    if not stream:
        answer = ask()
    else:
        deltas: queue.Queue[str | None] = queue.Queue()
        outcome: dict[str, Any] = {}
        cancel = threading.Event()

        def work() -> None:
            try:
                outcome["answer"] = ask(cancel, deltas.put)
            except BaseException as exc:  # handed to the generator thread below
                outcome["error"] = exc
            finally:
                deltas.put(None)

        worker = threading.Thread(target=work, name="agentdb-generation", daemon=True)
        worker.start()
        try:
            while (delta := deltas.get()) is not None:
                yield "generation", {"delta": delta}
        except GeneratorExit:  # the client went away: stop the model call
            cancel.set()
            raise
        worker.join()
        if "error" in outcome:
            raise outcome["error"]
        answer = outcome["answer"]
    yield (
        "step_completed",
        {
            "id": "generation",
            "kind": "generation",
            "name": "generation",
            "status": "completed",
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "details": {"model": answer.model, "citations": answer.citations},
        },
    )
    yield "generation", answer.to_dict()


def run(
    conn: psycopg.Connection[Any],
    request: RetrievalRequest,
    principal: Principal | None,
    settings: Settings,
    *,
    plan: Plan | None = None,
    embedder_for: Callable[[str], Embedder] = load_embedder,
) -> Iterator[Event]:
    """The pipeline as events: step_started / step_completed per query (and per deepening round), one
    `hit` each, the `generation` events when asked, then `done`. Validation errors are raised before the
    first event (pass a `plan` from `validate` to skip validating twice)."""
    plan = plan or validate(conn, request, principal, settings)
    steps: list[dict[str, Any]] = []
    results: list[tuple[str, list[Hit]]] = []
    diagnostics: list[dict[str, Any]] = []
    for i, (spec, fields) in enumerate(zip(request.queries, plan.projections, strict=True)):
        step = {"id": f"retrieval_{i}", "kind": "retrieval", "name": f"query_{i}", "status": "completed"}
        yield "step_started", {**step, "status": "running", "details": {"table": spec.table}}
        started = time.perf_counter()
        outcome: tuple[Mode, Result, list[Hit]] | None = None
        for kind, payload in _retrieve_query(conn, i, request, spec, fields, principal, plan, embedder_for):
            if kind == "result":
                outcome = payload
            else:
                steps.append(payload)
                yield kind, payload
        assert outcome is not None
        mode, result, hits = outcome
        done_step = {
            **step,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "details": {
                "table": spec.table,
                "retrieval_mode": mode,
                "route": "found" if hits else "not_found",
                "result_count": len(hits),
                # dense candidates beyond `threshold`, which the funnel dropped before fusion
                "dropped_by_threshold": int(
                    result.diagnostics.get("parameters", {}).get("filtered_count", 0)
                ),
                "expand_window": plan.expand_window,
            },
        }
        steps.append(done_step)
        results.append((spec.table, hits))
        diagnostics.append({"query_index": i, "table": spec.table, **result.diagnostics})
        yield "step_completed", done_step
    merged = merge(results, max(q.limit for q in request.queries))
    for hit in merged:
        yield "hit", hit
    generation = None
    if plan.generation is not None:
        for kind, payload in _generate(plan, request, merged, request.stream):
            if kind == "step_completed":
                steps.append(payload)
            elif "text" in payload:
                generation = payload
            yield kind, payload
    usage = plan.usage().to_dict()
    yield (
        "done",
        {
            "status": "completed",
            "route": "found" if merged else "not_found",
            "steps": steps,
            "usage": {k: usage[k] for k in ("input_tokens", "output_tokens", "llm_calls")},
            "tool_calls_made": 0,
            "generation": generation,
            "debug_info": {"queries": diagnostics} if request.diagnostics else None,
        },
    )


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
