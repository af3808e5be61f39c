"""The navigation step of the pipeline: walk a tree or graph index from the seed query's hits (or a start
key), ranked (best-first by hybrid relevance, no model; agentdb.agent.navigation.ranked runs it in SQL) or
agentic (the model moves one node per turn), and turn the visits into hits and steps. Every read is the
scoped reader's (agentdb.agent.navigation.sql)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentdb.agent.navigation.options import NavigationOptions
from agentdb.agent.navigation.ranked import SeedSearch, ranked_walk
from agentdb.agent.navigation.sql import Scope, SqlEdges, SqlNodes
from agentdb.config import RRF_K
from agentdb.embed import Embedder
from agentdb.llm import Message, Model, ToolSpec
from agentdb.retrieval import Fusion, Hit, Mode, retrieve
from navigation import (
    Budget,
    Decision,
    GraphWalk,
    Lookup,
    NavigationResult,
    Node,
    Step,
    ToolCall,
    TreeWalk,
    Turn,
    Visit,
    run_agentic,
    system_prompt,
    tool_definitions,
)


class Cancelled(Exception):
    """The client went away while a walk was running."""


@dataclass
class WalkOutcome:
    """What a walk produced: the hits (visited documents), the steps, the status and the model's calls."""

    hits: list[Hit]
    steps: list[dict[str, Any]]
    status: str
    details: dict[str, Any]
    tool_calls: int = 0
    turns: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)


class ModelChooser:
    """`navigation.Chooser` over an agentdb Model: one Messages API call per turn, the conversation kept
    here (tool results answer the previous turn's tool calls), the workflow rules in the system prompt."""

    def __init__(
        self, model: Model, kind: str, *, lookups: Sequence[Lookup] = (), max_tokens: int = 1024
    ) -> None:
        self.model = model
        self.kind = kind
        self.lookups = lookups
        self.max_tokens = max_tokens
        self.messages: list[Message] = []

    def choose(self, turn: Turn) -> Decision:
        if turn.opening:
            self.messages.append(Message.user(turn.opening))
        if turn.results:
            self.messages.append(
                Message(
                    "user",
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": r.call_id,
                            "content": r.content,
                            "is_error": r.is_error,
                        }
                        for r in turn.results
                    ],
                )
            )
        completion = self.model.complete(
            self.messages,
            system=system_prompt(self.kind, turn.rules),  # type: ignore[arg-type]
            tools=[ToolSpec(**spec) for spec in tool_definitions(turn.tools, self.lookups)],
            max_tokens=self.max_tokens,
        )
        self.messages.append(Message.assistant(completion))
        return Decision(
            calls=tuple(ToolCall(c.name, c.input, c.id) for c in completion.tool_calls), text=completion.text
        )


class QuerySearcher:
    """`navigation.Searcher`: the request's query object run again with the model's text, under the same
    filters, row filter and projection; one hit per document."""

    def __init__(
        self,
        scope: Scope,
        mode: Mode,
        limit: int,
        embedder: Embedder,
        fusion: Fusion = "rrf",
        alpha: float = 0.5,
    ) -> None:
        self.scope, self.mode, self.limit, self.embedder = scope, mode, limit, embedder
        self.fusion, self.alpha = fusion, alpha

    def search(self, query: str) -> list[Node]:
        s = self.scope
        result = retrieve(
            s.conn,
            s.source,
            query,
            mode=self.mode,
            top_k=self.limit,
            fusion=self.fusion,
            alpha=self.alpha,
            group_by_doc=True,
            embedder=self.embedder,
            fields=s.fields,
            **s.filters(),
        )
        return [Node(h.id, h.title or "", h.text or "", h.metadata) for h in result.hits]


def _hit(visit: Visit, rank: int, score: float, table: str, fields: list[str] | None) -> Hit:
    node = visit.node
    return Hit(
        id=node.key,
        chunk=0,
        rank=rank,
        score=score,
        distance=None,
        bm25_score=None,
        rank_dense=None,
        rank_sparse=None,
        title=node.title if fields is None or "title" in fields else None,
        text=node.text if fields is None or "text" in fields else None,
        metadata=dict(node.fields),
        table=table,
        tree={"depth": visit.depth, "parent": visit.parent, "path": list(visit.path), "order": visit.order},
    )


def _step(step: Step) -> dict[str, Any]:
    return {
        "id": f"{step.kind}_{step.order}",
        "kind": "navigation",
        "name": step.kind,
        "status": "completed",
        "duration_ms": round(step.duration_ms, 3),
        "details": step.details(),
    }


def walk(
    scope: Scope,
    options: NavigationOptions,
    *,
    query: str,
    seeds: Sequence[Hit],
    mode: Mode,
    limit: int,
    embedder: Embedder,
    embedding: Any,
    fusion: Fusion = "rrf",
    alpha: float = 0.5,
    rrf_k: int = RRF_K,
    threshold: float = 0.5,
    model: Model | None,
    max_iterations: int,
    report: Callable[[dict[str, Any]], None],
    cancel: threading.Event | None = None,
    lookups: Sequence[Lookup] = (),
) -> WalkOutcome:
    """Run the navigation `options` over `scope`: `report` gets a step_progress payload per node read;
    agentic runs offer `lookups` (read-only tools such as search_memory) besides their moves."""

    def on_step(step: Step) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled
        report(_step(step))

    started = time.perf_counter()
    if options.selection == "ranked":
        search = SeedSearch(
            keys=[h.id for h in seeds],
            mode=mode,
            embedding=None if embedding is None else np.asarray(embedding),
            rrf_k=rrf_k,
            threshold=threshold,
            fusion=fusion,
            alpha=alpha,
        )
        result, answer = ranked_walk(scope, options, query=query, seeds=search, limit=limit, on_step=on_step)
        visits = [v for v, _ in answer]
        relevance = {v.key: score for v, score in answer}
        # Reading max_nodes nodes is how a ranked walk ends; it is not an exhausted budget.
        status = "completed"
    else:
        assert model is not None
        result = _agentic(
            scope,
            options,
            query=query,
            start_key=options.start_key or (seeds[0].id if seeds else None),
            search=QuerySearcher(scope, mode, limit, embedder, fusion, alpha),
            chooser=ModelChooser(model, f"{options.strategy}_navigation", lookups=lookups),
            budget=Budget(max_iterations=max_iterations, max_context_tokens=options.max_context_tokens),
            on_step=on_step,
            lookups=lookups,
        )
        visits = list(result.visits)[:limit]
        relevance = {v.key: v.score for v in visits}
        status = result.status
    return _outcome(result, visits, relevance, status, scope, options, started)


def _agentic(
    scope: Scope,
    options: NavigationOptions,
    *,
    query: str,
    start_key: str | None,
    search: QuerySearcher,
    chooser: ModelChooser,
    budget: Budget,
    on_step: Callable[[Step], None],
    lookups: Sequence[Lookup],
) -> NavigationResult:
    """The model's walk: one move per turn over a tree or graph runner, under `budget`."""
    nodes = SqlNodes(scope)
    edges = SqlEdges(scope, options.index)
    runner: TreeWalk | GraphWalk
    if options.strategy == "tree":
        runner = TreeWalk(
            nodes,
            edges,
            max_depth=options.max_depth or 5,
            beam_width=options.beam_width or 3,
            budget=budget,
            on_step=on_step,
        )
    else:
        runner = GraphWalk(
            nodes,
            edges,
            direction=options.direction or "out",
            edge_types=options.edge_types,
            neighbor_limit=options.neighbor_limit or 8,
            max_steps=options.max_steps or 8,
            budget=budget,
            on_step=on_step,
        )
    return run_agentic(
        chooser,
        runner,
        query=query,
        start_key=start_key,
        search=search,
        instruction=options.instruction,
        instruction_field=options.instruction_field,
        lookups=lookups,
    )


def _outcome(
    result: NavigationResult,
    visits: Sequence[Visit],
    relevance: dict[str, float],
    status: str,
    scope: Scope,
    options: NavigationOptions,
    started: float,
) -> WalkOutcome:
    details: dict[str, Any] = {
        "strategy": options.strategy,
        "selection": options.selection,
        "index": options.index,
        "nodes_read": len(result.visits),
        "unreadable": len(result.unreadable),
        "stopped": result.reason,
        "duration_ms": round((time.perf_counter() - started) * 1000, 3),
    }
    if result.rules:
        details["rules"] = list(result.rules)
    return WalkOutcome(
        hits=[_hit(v, i + 1, relevance[v.key], scope.source, scope.fields) for i, v in enumerate(visits)],
        steps=[_step(s) for s in result.steps],
        status=status,
        details=details,
        tool_calls=result.tool_calls_made,
        turns=result.turns,
        calls=[{"turn": c.turn, "name": c.name, "executed": c.executed} for c in result.calls],
    )


__all__ = ["Cancelled", "ModelChooser", "QuerySearcher", "WalkOutcome", "walk"]
