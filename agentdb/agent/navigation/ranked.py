"""Ranked tree navigation through its one implementation, agentdb_internal.tree_walk_run (sql/075_tree_walk.sql,
also behind the SQL door agentdb.tree_walk): one statement per walk, every read in it the caller's scoped
reader's. Each visit comes back as a notice while the walk runs, so progress is reported as it happens and a
cancelled request stops the statement."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

from agentdb.agent.navigation.options import NavigationOptions
from agentdb.agent.navigation.sql import Scope
from agentdb.db import run_sql
from navigation import NavigationResult, Node, Step, Visit

VISIT_NOTICE = "agentdb.tree_walk.visit"


@dataclass(frozen=True)
class SeedSearch:
    """How the request's seed search ran: its hits' keys and the parameters its deeper run repeats."""

    keys: Sequence[str]
    mode: str
    embedding: Any
    rrf_k: int
    threshold: float
    fusion: str
    alpha: float


def _step(v: dict[str, Any]) -> Step:
    return Step(
        kind="tree_navigation",
        order=v["order"],
        current_key=v["key"],
        from_key=v.get("from_key"),
        parent=v["parent"],
        depth=v["depth"],
        path=tuple(v["path"]),
        duration_ms=float(v["duration_ms"]),
        score=float(v["score"]),
        edge_type=v["edge_type"],
    )


def ranked_walk(
    scope: Scope,
    options: NavigationOptions,
    *,
    query: str,
    seeds: SeedSearch,
    limit: int,
    on_step: Callable[[Step], None],
) -> tuple[NavigationResult, list[tuple[Visit, float]]]:
    """Walk `options.index` best-first from the seeds (or the options' start): the result (every visit, the
    keys found unreadable, why it stopped) and the answer, at most `limit` visits with their scores.
    `on_step` gets each step as it is read; an exception it raises cancels the walk and is raised here."""
    conn = scope.conn
    reported: list[Step] = []
    failed: list[BaseException] = []

    def relay(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary != VISIT_NOTICE or failed or diag.message_detail is None:
            return
        step = _step(_with_from(orjson.loads(diag.message_detail), reported))
        try:
            on_step(step)
        except BaseException as exc:  # raised again once the statement has stopped
            failed.append(exc)
            conn.cancel_safe()
        reported.append(step)

    conn.add_notice_handler(relay)
    try:
        rows = run_sql(
            conn,
            "select agentdb_internal.tree_walk_run(source => %(source)s, index => %(index)s, query => %(query)s,"
            " query_embedding => %(embedding)s, seeds => %(seeds)s, start_key => %(start_key)s,"
            " start_nodes => %(start_nodes)s, max_depth => %(max_depth)s, beam_width => %(beam_width)s,"
            " max_nodes => %(max_nodes)s, top_k => %(top_k)s, mode => %(mode)s, threshold => %(threshold)s,"
            " rrf_k => %(rrf_k)s, fusion => %(fusion)s, alpha => %(alpha)s, scoring => %(scoring)s,"
            " scope => %(scope)s, fields => %(fields)s, links_index => %(links_index)s, progress => true)",
            {
                "source": scope.source,
                "index": options.index,
                "query": query,
                "embedding": seeds.embedding,
                "seeds": list(seeds.keys),
                "start_key": options.start_key,
                "start_nodes": options.start_nodes,
                "max_depth": options.max_depth or 5,
                "beam_width": options.beam_width or 3,
                "max_nodes": options.max_nodes,
                "top_k": limit,
                "mode": seeds.mode,
                "threshold": seeds.threshold,
                "rrf_k": seeds.rrf_k,
                "fusion": seeds.fusion,
                "alpha": seeds.alpha,
                "scoring": options.scoring,
                "fields": scope.fields,
                "links_index": options.links_index,
                "scope": scope.rows().value(),
            },
        )
    except psycopg.errors.QueryCanceled:
        if failed:
            raise failed[0] from None
        raise
    finally:
        conn.remove_notice_handler(relay)
    if failed:
        raise failed[0]
    walked = rows[0][0]
    visits = []
    for v in walked["visits"]:
        step = reported[v["order"]] if v["order"] < len(reported) else _step(_with_from(v, reported))
        if v["order"] >= len(reported):  # notices held back (client_min_messages): reported now
            on_step(step)
            reported.append(step)
        visits.append(Visit(Node(v["key"], v["title"] or "", v["text"] or "", v["metadata"]), step))
    result = NavigationResult(
        status="incomplete" if walked["stopped"] else "completed",
        reason=walked["stopped"],
        visits=tuple(visits),
        unreadable=tuple(walked["unreadable"]),
    )
    by_key = {v.key: v for v in visits}
    return result, [(by_key[a["key"]], float(a["score"])) for a in walked["answer"]]


def _with_from(visit: dict[str, Any], before: Sequence[Step]) -> dict[str, Any]:
    """The visit with the key read just before it."""
    return {**visit, "from_key": before[-1].current_key if before else None}


__all__ = ["VISIT_NOTICE", "SeedSearch", "ranked_walk"]
