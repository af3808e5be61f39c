"""The retrieval agent in pipeline mode (seed 002) as one stream of events: each query (retrieval,
deepening, expansion), the merge, the optional generation step, then `done`. The same events become the
JSON response (`respond`) and server-sent events (`json_events`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import psycopg

from agentdb.agent.merge import merge
from agentdb.agent.models import AgentHit, RetrievalRequest, RetrievalResponse
from agentdb.agent.query import run_query
from agentdb.agent.stream import stream_call
from agentdb.agent.validate import Plan, validate
from agentdb.auth import Principal
from agentdb.config import Settings
from agentdb.embed import Embedder, load_embedder
from agentdb.generation import GenerationResult, generate
from agentdb.retrieval import Hit

# (kind, payload): step_started / step_completed (a step dict), hit (a Hit), generation (a delta or the
# answer), done (the rest of the response).
Event = tuple[str, Any]


def _generation(
    plan: Plan, query: str, hits: list[Hit], stream: bool
) -> Generator[Event, None, GenerationResult]:
    """The generation step over the merged hits, grouped by table; when streaming, text deltas come out as
    `generation` events while the model writes. Returns the answer."""
    assert plan.generation is not None and plan.generator is not None
    knowledge: dict[str, list[Hit]] = {}
    for hit in hits:
        knowledge.setdefault(hit.table or "", []).append(hit)
    step, model = plan.generation, plan.generator

    def ask(
        cancel: threading.Event | None = None, on_text: Callable[[str], None] | None = None
    ) -> GenerationResult:
        return generate(
            model,
            query,
            knowledge,
            system_prompt=step.system_prompt,
            template=step.template,
            placement=step.placement,
            max_tokens=step.max_tokens,
            cancel=cancel,
            on_text=on_text,
        )

    if not stream:
        return ask()
    return (yield from stream_call(ask, lambda delta: ("generation", {"delta": delta})))


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
    hit_lists: list[list[Hit]] = []
    diagnostics: list[dict[str, Any]] = []
    tool_calls = 0
    for i, (spec, fields) in enumerate(zip(request.queries, plan.projections, strict=True)):
        step = {"id": f"retrieval_{i}", "kind": "retrieval", "name": f"query_{i}", "status": "completed"}
        yield "step_started", {**step, "status": "running", "details": {"table": spec.table}}
        started = time.perf_counter()
        outcome = run_query(conn, i, request.query, spec, fields, principal, plan, embedder_for)
        for round_step in outcome.steps:
            steps.append(round_step)
            yield "step_completed", round_step
        tool_calls += outcome.tool_calls
        done_step = {
            **step,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "details": {
                "table": spec.table,
                "retrieval_mode": outcome.mode,
                "route": "found" if outcome.hits else "not_found",
                "result_count": len(outcome.hits),
                # dense candidates beyond `threshold`, which the funnel dropped before fusion
                "dropped_by_threshold": int(
                    outcome.result.diagnostics.get("parameters", {}).get("filtered_count", 0)
                ),
                "expand_window": plan.expand_window,
            },
        }
        steps.append(done_step)
        hit_lists.append(outcome.hits)
        diagnostics.append({"query_index": i, "table": spec.table, **outcome.result.diagnostics})
        yield "step_completed", done_step
    merged = merge(hit_lists, max(q.limit for q in request.queries))
    for hit in merged:
        yield "hit", hit
    generation = None
    if plan.generation is not None:
        started = time.perf_counter()
        answer = yield from _generation(plan, request.query, merged, request.stream)
        generation_step = {
            "id": "generation",
            "kind": "generation",
            "name": "generation",
            "status": "completed",
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "details": {"model": answer.model, "citations": answer.citations},
        }
        steps.append(generation_step)
        yield "step_completed", generation_step
        generation = answer.to_dict()
        yield "generation", generation
    usage = plan.usage().to_dict()
    yield (
        "done",
        {
            "status": "completed",
            "route": "found" if merged else "not_found",
            "steps": steps,
            "usage": {k: usage[k] for k in ("input_tokens", "output_tokens", "llm_calls")},
            "tool_calls_made": tool_calls,
            "generation": generation,
            "debug_info": {"queries": diagnostics} if request.diagnostics else None,
        },
    )


def json_events(events: Iterator[Event]) -> Iterator[tuple[str, Any]]:
    """The event stream with JSON payloads, as server-sent events carry it (hits in the client's shape)."""
    for kind, payload in events:
        yield kind, AgentHit.of(payload).to_json() if kind == "hit" else payload


def respond(events: Iterator[Event]) -> RetrievalResponse:
    """Collect the event stream into the JSON response."""
    hits: list[AgentHit] = []
    final: dict[str, Any] = {}
    for kind, payload in events:
        if kind == "hit":
            hits.append(AgentHit.of(payload))
        elif kind == "done":
            final = payload
    return RetrievalResponse.model_validate({**final, "hits": hits})


__all__ = ["Event", "json_events", "respond", "run"]
