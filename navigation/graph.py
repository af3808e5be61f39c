"""Graph exploration: a single path whose offer is replaced at every hop by the current node's unvisited
neighbours (the same direction and edge types at every hop). Visited and unreadable nodes are never offered
again, so cycles and self-loops cannot trap the walk: with no unvisited neighbour left it simply ends.
`max_steps` counts the moves after the start; depth is the number of moves to a node along the path."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from navigation.budget import Budget
from navigation.nodes import Candidate, Direction, Node, Reason, StepKind, Visit
from navigation.protocols import NeighbourLister, NodeReader, ProgressCallback
from navigation.walk import Walk, root_candidates

DIRECTIONS: tuple[Direction, ...] = ("out", "in", "both")


def graph_candidates(
    neighbours: NeighbourLister,
    at: Candidate,
    *,
    direction: Direction = "out",
    edge_types: Sequence[str] | None = None,
    limit: int = 8,
    exclude: Collection[str] = (),
) -> list[Candidate]:
    """The candidates offered at node `at`: at most `limit` distinct neighbours not in `exclude`, each one
    hop deeper with `at` as its parent and the edge type that reached it."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}")
    # Ask for enough rows that excluded (visited) keys cannot crowd out the ones still to offer.
    rows = neighbours.neighbours(at.key, direction, edge_types, limit + len(exclude) + 1)
    wanted = None if edge_types is None else set(edge_types)
    out: list[Candidate] = []
    seen: set[str] = set()
    for key, edge_type in rows:
        if key in exclude or key in seen or (wanted is not None and edge_type not in wanted):
            continue
        seen.add(key)
        out.append(Candidate(key, at.depth + 1, at.key, (*at.path, key), edge_type=edge_type))
        if len(out) >= limit:
            break
    return out


class GraphWalk(Walk):
    """A single-path walk over a scoped reader and a neighbour lister; agentic only, so a model (or a test)
    picks each move among `offered()`."""

    kind: StepKind = "graph_navigation"

    def __init__(
        self,
        reader: NodeReader,
        neighbours: NeighbourLister,
        *,
        direction: Direction = "out",
        edge_types: Sequence[str] | None = None,
        neighbor_limit: int = 8,
        max_steps: int = 8,
        budget: Budget | None = None,
        on_step: ProgressCallback | None = None,
    ) -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}")
        if neighbor_limit < 1:
            raise ValueError("neighbor_limit must be at least 1")
        if max_steps < 0:
            raise ValueError("max_steps must not be negative")
        super().__init__(reader, budget=budget, on_step=on_step)
        self.neighbours = neighbours
        self.direction: Direction = direction
        self.edge_types = None if edge_types is None else tuple(edge_types)
        self.neighbor_limit = neighbor_limit
        self.max_steps = max_steps
        self.moves = 0
        self.current: Candidate | None = None
        self._offer: list[Candidate] = []

    @property
    def moves_left(self) -> int | None:
        return max(self.max_steps - self.moves, 0)

    def add_roots(
        self, roots: Sequence[str | Node], scores: Mapping[str, float] | None = None
    ) -> list[Candidate]:
        """Offer start nodes, replacing the offer; only before the path has started."""
        if self.current is not None:
            raise ValueError("the path has already started")
        self._offer = root_candidates(roots, scores, self)
        return list(self._offer)

    def offered(self) -> list[Candidate]:
        """The current node's unvisited neighbours (before the start: the start candidates)."""
        return list(self._offer)

    def get(self, key: str) -> Candidate | None:
        return next((c for c in self._offer if c.key == key), None)

    def _take(self, key: str) -> Candidate | None:
        candidate = self.get(key)
        self._offer = [c for c in self._offer if c.key != key]
        return candidate

    def attach_preview(self, candidate: Candidate) -> None:
        self._offer = [candidate if c.key == candidate.key else c for c in self._offer]

    def visit(self, key: str) -> Visit | None:
        """Move to the offered `key` (see `Walk.visit`); a move past `max_steps` is refused."""
        if self.current is not None and self.moves >= self.max_steps:
            raise ValueError("max_steps moves were already made")
        return super().visit(key)

    def limit_reason(self) -> Reason | None:
        """`max_steps` once the moves are spent while neighbours are still offered."""
        return (
            "max_steps" if self.current is not None and self.moves >= self.max_steps and self._offer else None
        )

    def _arrive(self, candidate: Candidate) -> None:
        if self.current is not None:
            self.moves += 1
        self.current = candidate
        self._offer = graph_candidates(
            self.neighbours,
            candidate,
            direction=self.direction,
            edge_types=self.edge_types,
            limit=self.neighbor_limit,
            exclude=self.visited | set(self.unreadable),
        )
