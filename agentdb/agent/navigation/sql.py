"""The SQL-backed reader, edge lists and scorer that the pure `navigation` package walks with. Every read goes
through the one scoped reader (`agentdb.read`) or functions built on it, under the query's filters, the
principal's row filter and role, and the `fields` projection, so a hidden node is a missing node."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from agentdb.agent.navigation.options import NEIGHBORS_MAX
from agentdb.db import run_sql
from agentdb.filters import ReadScope
from agentdb.scoped_reader import read
from navigation import Direction, Node


@dataclass(frozen=True)
class Scope:
    """Where a walk reads: one source under one query's filters, the caller's row filter and projection."""

    conn: psycopg.Connection[Any]
    source: str
    filter: dict[str, Any] | None = None
    filter_query: dict[str, Any] | None = None
    exclusion_query: dict[str, Any] | None = None
    row_filter: dict[str, Any] | None = None
    fields: list[str] | None = None

    def rows(self) -> ReadScope:
        """Which rows it reads: the query filters and the row filter."""
        return ReadScope(self.filter, self.filter_query, self.exclusion_query, self.row_filter)

    def filters(self) -> dict[str, Any]:
        """The filters as keyword arguments of agentdb.retrieval.retrieve."""
        return {
            "filter": self.filter,
            "filter_query": self.filter_query,
            "exclusion_query": self.exclusion_query,
            "row_filter": self.row_filter,
        }


class SqlNodes:
    """`navigation.NodeReader`: a node is its document's first chunk, read by the scoped reader."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def read(self, keys: Sequence[str]) -> list[Node]:
        s = self.scope
        rows = read(s.conn, s.source, keys, chunk_to=[0] * len(keys), scope=s.rows(), fields=s.fields)
        return [Node(r.doc_id, r.title or "", r.text or "", r.metadata) for r in rows]


class SqlEdges:
    """`navigation.ChildLister` and `NeighbourLister` over an index: agentdb.neighbors returns only the
    neighbours the scope may read (each checked by the scoped reader), so no key, count or field outside it
    reaches the walk."""

    def __init__(self, scope: Scope, index: str) -> None:
        self.scope = scope
        self.index = index

    def neighbours(
        self, key: str, direction: Direction, edge_types: Sequence[str] | None, limit: int
    ) -> list[tuple[str, str]]:
        rows = run_sql(
            self.scope.conn,
            "select key, edge_type from agentdb.neighbors(source => %(source)s, index => %(index)s,"
            " node => %(key)s, direction => %(direction)s, edge_types => %(edge_types)s, max => %(max)s,"
            " scope => %(scope)s)",
            {
                "source": self.scope.source,
                "index": self.index,
                "key": key,
                "direction": direction,
                "edge_types": None if edge_types is None else list(edge_types),
                # a walk asks for more to make up for the nodes it excludes: never past the function's bound
                "max": min(limit, NEIGHBORS_MAX),
                "scope": self.scope.rows().value(),
            },
        )
        return [(k, t) for k, t in rows]

    def children(self, key: str) -> list[str]:
        return [k for k, _ in self.neighbours(key, "out", None, NEIGHBORS_MAX)]

    def roots(self) -> list[str]:
        """The visible roots of a tree index (documents no other document points to)."""
        rows = run_sql(
            self.scope.conn,
            "select key from agentdb.index_roots(source => %(source)s, index => %(index)s, scope => %(scope)s)",
            {"source": self.scope.source, "index": self.index, "scope": self.scope.rows().value()},
        )
        return [r[0] for r in rows]


class SqlScorer:
    """`navigation.Scorer`: a node's own relevance to the query as the ranked walk scores it
    (agentdb_internal.tree_walk_own, hybrid scoring): both legs of the search restricted to the candidates in
    one statement, the lexical one divided by `lexical_scale` (the query's best BM25 score in the source, so
    both legs lie in [0, 1] and candidates met anywhere in a walk compare)."""

    def __init__(self, scope: Scope, query: str, embedding: Any, lexical_scale: float) -> None:
        self.scope = scope
        self.query = query
        self.embedding = embedding
        self.lexical_scale = lexical_scale

    def score(self, keys: Sequence[str]) -> dict[str, float]:
        if not keys:
            return {}
        s = self.scope
        rows = run_sql(
            s.conn,
            "select doc_id, rel from agentdb_internal.tree_walk_own(source => %(source)s, keys => %(keys)s,"
            " query => %(query)s, query_embedding => %(embedding)s, scale => %(scale)s, scoring => 'hybrid',"
            " scope => %(scope)s, fields => %(fields)s)",
            {
                "source": s.source,
                "keys": list(keys),
                "query": self.query,
                "embedding": self.embedding,
                "scale": self.lexical_scale,
                "fields": s.fields,
                "scope": s.rows().value(),
            },
        )
        return {key: rel for key, rel in rows}


__all__ = ["Scope", "SqlEdges", "SqlNodes", "SqlScorer"]
