"""Navigation in the retrieval agent (`steps.retrieval.navigation`): the options and their rules, and the
SQL-backed reader, edge lists and scorer that the pure `navigation` package walks with. Every read goes
through the one scoped reader (`agentdb.read`) or functions built on it, under the query's filters, the
principal's row filter and role, and the `fields` projection, so a hidden node is a missing node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field

from agentdb.db import run_sql
from agentdb.errors import InvalidParamValue, parse_params
from agentdb.reader import read
from navigation import Direction, Node

# The dense leg's weight in a node's relevance (the lexical leg has the rest): on the runbook questions of
# examples/pgdocs/questions.jsonl 0.8 put a gold section in the top 3 for 0.844 of them, 0.5 for 0.805.
DENSE_WEIGHT = 0.8
# The most neighbours agentdb.neighbors returns at once (its `max`).
NEIGHBORS_MAX = 256


class NavigationOptions(BaseModel):
    """`steps.retrieval.navigation` (REFERENCE.md section 2). Fields of the other strategy or selection are
    refused, not ignored; defaults depend on the strategy (`max_depth` 5 and `beam_width` 3 for a tree,
    `direction` out, `max_steps` 8 and `neighbor_limit` 8 for a graph). Ranked selection reads at most
    `max_nodes` nodes and scores children with the search's two legs (`scoring` hybrid) or, for comparison,
    by keyword overlap with title and text (`keywords`, how Antfly ranks branches); with `links_index` (a
    graph index such as cross-references) it also follows the best links of every node it reads."""

    model_config = ConfigDict(extra="forbid")

    query_index: int = Field(ge=0, le=7)
    strategy: Literal["tree", "graph"]
    selection: Literal["agentic", "ranked"]
    index: str = Field(min_length=1, max_length=63)
    start_key: str | None = Field(None, min_length=1, max_length=1000)
    start_nodes: str | None = Field(None, min_length=1, max_length=100_000)
    max_depth: int | None = Field(None, ge=1, le=20)
    beam_width: int | None = Field(None, ge=1, le=20)
    direction: Direction | None = None
    edge_types: list[str] | None = Field(None, min_length=1, max_length=64)
    max_steps: int | None = Field(None, ge=1, le=20)
    neighbor_limit: int | None = Field(None, ge=1, le=NEIGHBORS_MAX)
    max_nodes: int = Field(30, ge=1, le=500)
    scoring: Literal["hybrid", "keywords"] = "hybrid"
    links_index: str | None = Field(None, min_length=1, max_length=63)
    max_context_tokens: int = Field(16_000, ge=1_000, le=200_000)
    instruction: str | None = Field(None, max_length=10_000)
    instruction_field: str | None = Field(None, min_length=1, max_length=63)

    @classmethod
    def parse(
        cls, data: Mapping[str, Any] | None, path: str, *, queries: int, iterations: int
    ) -> NavigationOptions:
        """Validate a raw navigation object of a request with `queries` queries and
        `max_internal_iterations` = `iterations`: 3007 with the JSON path of the first bad field."""
        options = parse_params(cls, data, path)
        options._check(path, queries, iterations)
        return options

    def _check(self, path: str, queries: int, iterations: int) -> None:
        given = self.model_fields_set

        def refuse(name: str, why: str) -> None:
            raise InvalidParamValue(f"{name} {why}", path=f"{path}.{name}")

        if self.query_index >= queries:
            refuse("query_index", f"must name one of the request's {queries} queries (0..{queries - 1})")
        only = {
            "tree": ("max_depth", "beam_width", "start_nodes"),
            "graph": ("direction", "edge_types", "max_steps", "neighbor_limit"),
        }
        for strategy, names in only.items():
            for name in names:
                if name in given and self.strategy != strategy:
                    refuse(name, f"applies to strategy {strategy!r} only")
        if self.strategy == "graph" and self.selection == "ranked":
            refuse("selection", "must be 'agentic' for a graph: ranked selection walks trees only")
        if self.selection == "ranked":
            for name in ("instruction", "instruction_field"):
                if name in given:
                    refuse(name, "applies to agentic selection only")
        else:
            if "start_nodes" in given:
                refuse("start_nodes", "applies to ranked selection only; use start_key")
            for name in ("max_nodes", "scoring"):
                if name in given:
                    refuse(name, "applies to ranked selection only (agentic runs end by their budgets)")
            if "links_index" in given:
                refuse("links_index", "applies to ranked selection only (the model chooses its own moves)")
            if iterations < 1:
                raise InvalidParamValue(
                    "agentic navigation needs max_internal_iterations >= 1 (the model's turns)",
                    path="max_internal_iterations",
                )
        if self.start_key is not None and self.start_nodes is not None:
            refuse("start_nodes", "and start_key exclude each other")

    @property
    def tool(self) -> str:
        """The tool permission this navigation needs."""
        return "tree_search" if self.strategy == "tree" else "graph_search"


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

    def filters(self) -> dict[str, Any]:
        return {
            "filter": self.filter,
            "filter_query": self.filter_query,
            "exclusion_query": self.exclusion_query,
            "row_filter": self.row_filter,
        }

    def json_filters(self) -> dict[str, Jsonb | None]:
        return {k: None if v is None else Jsonb(v) for k, v in self.filters().items()}


class SqlNodes:
    """`navigation.NodeReader`: a node is its document's first chunk, read by the scoped reader."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def read(self, keys: Sequence[str]) -> list[Node]:
        s = self.scope
        rows = read(s.conn, s.source, keys, chunk_to=[0] * len(keys), fields=s.fields, **s.filters())
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
            "select key, edge_type from agentdb.neighbors(%(source)s, %(index)s, %(key)s, %(direction)s,"
            " %(edge_types)s, %(max)s, %(filter)s, %(filter_query)s, %(exclusion_query)s, %(row_filter)s)",
            {
                "source": self.scope.source,
                "index": self.index,
                "key": key,
                "direction": direction,
                "edge_types": None if edge_types is None else list(edge_types),
                # a walk asks for more to make up for the nodes it excludes: never past the function's bound
                "max": min(limit, NEIGHBORS_MAX),
                **self.scope.json_filters(),
            },
        )
        return [(k, t) for k, t in rows]

    def children(self, key: str) -> list[str]:
        return [k for k, _ in self.neighbours(key, "out", None, NEIGHBORS_MAX)]

    def roots(self) -> list[str]:
        """The visible roots of a tree index (documents no other document points to)."""
        rows = run_sql(
            self.scope.conn,
            "select key from agentdb.index_roots(%(source)s, %(index)s, null, %(filter)s, %(filter_query)s,"
            " %(exclusion_query)s, %(row_filter)s)",
            {"source": self.scope.source, "index": self.index, **self.scope.json_filters()},
        )
        return [r[0] for r in rows]


class SqlScorer:
    """`navigation.Scorer`: a node's relevance to the query, both legs of the search restricted to the
    candidates in one statement (agentdb.score_keys): DENSE_WEIGHT x its best chunk's cosine similarity +
    (1 - DENSE_WEIGHT) x its best chunk's BM25 divided by `lexical_scale` (the query's best BM25 score in
    the source, so both legs lie in [0, 1] and candidates met anywhere in the walk compare)."""

    def __init__(self, scope: Scope, query: str, embedding: Any, lexical_scale: float) -> None:
        self.scope = scope
        self.query = query
        self.embedding = embedding
        self.lexical_scale = max(lexical_scale, 1e-9)

    def score(self, keys: Sequence[str]) -> dict[str, float]:
        if not keys:
            return {}
        s = self.scope
        rows = run_sql(
            s.conn,
            "select doc_id, dense, lexical from agentdb.score_keys(%(source)s, %(keys)s, %(query)s,"
            " %(embedding)s, %(filter)s, %(filter_query)s, %(exclusion_query)s, %(row_filter)s)",
            {
                "source": s.source,
                "keys": list(keys),
                "query": self.query,
                "embedding": self.embedding,
                **s.json_filters(),
            },
        )
        return {
            key: DENSE_WEIGHT * (dense or 0.0) + (1 - DENSE_WEIGHT) * min(lexical / self.lexical_scale, 1.0)
            for key, dense, lexical in rows
        }


__all__ = ["DENSE_WEIGHT", "NavigationOptions", "Scope", "SqlEdges", "SqlNodes", "SqlScorer"]
