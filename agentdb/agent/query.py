"""One query of a retrieval request: retrieval under the caller's scope, deepened by the judge when asked,
then widened by neighbour expansion."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from agentdb.agent.deepening import RoundSummary, deepen
from agentdb.agent.expansion import expand
from agentdb.agent.scope import in_query
from agentdb.agent.validate import Plan
from agentdb.auth import Principal, read_scope
from agentdb.embed import Embedder
from agentdb.retrieval import Hit, Mode, Result, retrieve


@dataclass
class QueryOutcome:
    """What one query produced: its mode, the first retrieval's result (for the funnel), the final hits,
    the deepening round steps, the tool calls its models made, and its query vector."""

    mode: Mode
    result: Result
    hits: list[Hit]
    steps: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0
    embedding: Any = None  # the dense leg's query vector (None in lexical mode), for navigation to reuse


def run_query(
    conn: psycopg.Connection[Any],
    index: int,
    query: str,
    principal: Principal | None,
    plan: Plan,
    embedder_for: Callable[[str], Embedder],
) -> QueryOutcome:
    """Query `index` of the plan, for a request whose user text is `query` (the judge of deepening reads it),
    under the query's scope (`Plan.scope`)."""
    spec = plan.queries[index]
    mode, lexical_text, dense_text = plan.legs[index]
    embedding = None
    if mode != "lexical" and dense_text.strip():
        embedding = embedder_for(plan.sources[index].embedding_model).embed([dense_text])[0]
    scope = plan.scope(conn, index)
    results: dict[int, Result] = {}

    def retrieve_k(k: int) -> Result:
        # Hits are documents: the best chunk of each, so `limit` counts distinct documents.
        if k not in results:
            with read_scope(conn, principal), in_query(index):
                results[k] = retrieve(
                    conn,
                    spec.table,
                    lexical_text,
                    mode=mode,
                    top_k=k,
                    rrf_k=spec.rrf_k,
                    fusion=spec.fusion,
                    alpha=spec.alpha,
                    threshold=spec.threshold,
                    **scope.filters(),
                    fields=scope.fields,
                    query_embedding=embedding,
                    group_by_doc=True,
                    output_results=plan.diagnostics,
                )
        return results[k]

    result = retrieve_k(spec.limit)
    outcome = QueryOutcome(mode=mode, result=result, hits=list(result.hits), embedding=embedding)
    if plan.deepening is not None and plan.judge is not None:
        finished: list[tuple[RoundSummary, float]] = []
        last = time.perf_counter()

        def timed(summary: RoundSummary) -> None:
            # A round's time: its retrieval and the judge's verdict on it.
            nonlocal last
            now = time.perf_counter()
            finished.append((summary, round((now - last) * 1000, 3)))
            last = now

        # A round asking for a size already retrieved (round 1, unless max_chunks < limit) reuses it.
        rounds = deepen(
            lambda k: retrieve_k(min(k, 1000)).hits,
            plan.judge,
            query,
            top_k=min(spec.limit, plan.deepening.max_chunks),
            max_iters=plan.deepening.max_iters,
            max_chunks=plan.deepening.max_chunks,
            function_call_max_trials=plan.deepening.function_call_max_trials,
            source=spec.table,
            on_round=timed,
        )
        outcome.hits = list(rounds.hits)
        outcome.tool_calls = rounds.tool_calls
        outcome.steps = [
            {
                "id": f"deepening_{spec.table}_{summary.round}",
                "kind": "deepening",
                "name": "deepening_round",
                "status": "completed",
                "duration_ms": duration,
                "details": {**summary.to_dict(), "table": spec.table, "stopped": rounds.stopped},
            }
            for summary, duration in finished
        ]
    if plan.expand_window > 1 and outcome.hits:
        with read_scope(conn, principal), in_query(index):
            outcome.hits = expand(
                conn,
                spec.table,
                outcome.hits,
                plan.expand_window,
                scope=scope.rows(),
                fields=scope.fields,
            )
    return outcome


__all__ = ["QueryOutcome", "run_query"]
