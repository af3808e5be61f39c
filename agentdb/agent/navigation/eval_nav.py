"""Navigation against plain search on runbook questions (`agentdb eval-nav`, bench/navigation.py): each
method is a retrieval request run through the agent pipeline exactly as HTTP runs it, scored by
agentdb.evaluation.score_navigation."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from tqdm import tqdm

from agentdb.agent.models import RetrievalRequest
from agentdb.agent.pipeline import respond, run
from agentdb.config import Settings
from agentdb.evaluation import NavigationScores, Question, score_navigation

# method name -> the `steps.retrieval.navigation` object (None: plain hybrid search); a `links_index` here is
# replaced by evaluate_navigation's own (left out when that is None)
METHODS: dict[str, dict[str, Any] | None] = {
    "hybrid search": None,
    "ranked tree navigation (hybrid)": {"scoring": "hybrid", "links_index": "xref"},
    "ranked tree navigation (keywords)": {"scoring": "keywords"},
}


def request_for(
    source: str, question: str, navigation: dict[str, Any] | None, index: str, limit: int = 10
) -> RetrievalRequest:
    """The request a method sends for one question: one hybrid query, navigated when asked."""
    body: dict[str, Any] = {
        "query": question,
        "queries": [
            {"table": source, "semantic_search": question, "full_text_search": question, "limit": limit}
        ],
    }
    body["steps"] = {"retrieval": {"expand_window": 1}}
    if navigation is not None:
        body["steps"] = {
            "retrieval": {
                "expand_window": 1,
                "navigation": {
                    "query_index": 0,
                    "strategy": "tree",
                    "selection": "ranked",
                    "index": index,
                    **navigation,
                },
            }
        }
    return RetrievalRequest.model_validate(body)


def evaluate_navigation(
    conn: psycopg.Connection[Any],
    settings: Settings,
    source: str,
    questions: list[Question],
    *,
    index: str = "sections",
    links_index: str | None = "xref",
    methods: dict[str, dict[str, Any] | None] | None = None,
    progress: bool = True,
    splits: dict[str, list[Question]] | None = None,
) -> dict[str, list[NavigationScores]]:
    """Every method over every question, in the same process against the same database: the scores over
    all questions (`"all"`) and over each of `splits` (name -> a subset of `questions`) from the same runs."""
    out: dict[str, list[NavigationScores]] = {"all": [], **{name: [] for name in splits or {}}}
    for method, navigation in (methods or METHODS).items():
        if navigation is not None and "links_index" in navigation:
            navigation = {k: v for k, v in navigation.items() if k != "links_index"}
            if links_index is not None:
                navigation["links_index"] = links_index
        ranked, nodes, latencies = {}, {}, {}
        for q in tqdm(questions, desc=method, unit="q", disable=not progress):
            started = time.perf_counter()
            response = respond(run(conn, request_for(source, q.question, navigation, index), None, settings))
            latencies[q.id] = (time.perf_counter() - started) * 1000
            ranked[q.id] = [h.id for h in response.hits]
            summary = [s for s in response.steps if s.id == "navigation"]
            nodes[q.id] = summary[0].details["nodes_read"] if summary else 0
        for name, subset in {"all": questions, **(splits or {})}.items():
            out[name].append(
                score_navigation(
                    method,
                    subset,
                    [ranked[q.id] for q in subset],
                    [nodes[q.id] for q in subset],
                    [latencies[q.id] for q in subset],
                )
            )
    return out


__all__ = ["METHODS", "evaluate_navigation", "request_for"]
