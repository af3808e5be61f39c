"""The navigation step's options (`steps.retrieval.navigation`) and their rules: what each strategy and
selection takes, the defaults that depend on them, and a clear 3007 for anything else."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentdb.errors import InvalidParamValue, parse_params
from navigation import Direction

# The most neighbours agentdb.neighbors returns at once (its `max`).
NEIGHBORS_MAX = 256


class NavigationOptions(BaseModel):
    """`steps.retrieval.navigation`. Fields of the other strategy or selection are
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


__all__ = ["NEIGHBORS_MAX", "NavigationOptions"]
