"""Tree exploration: a walk whose frontier keeps unvisited siblings while one branch is explored, and ranked
selection, the deterministic best-first walk that needs no model.

Depth counts from a start node (0). A node at `max_depth` is read but not expanded, so nothing deeper is
ever offered; an expansion offers at most `beam_width` children that are not yet visited: the best-scoring
ones when the walk has a scorer, else the first in stored order. A ranked walk may also follow links (a
graph index's out-edges, e.g. cross-references): each expansion then offers the `link_width` best unvisited
link targets too, scored by their own relevance (a jump, not a descent). Every visit records its depth, its real
branch parent (the node whose expansion offered it), the key visited just before it and its path from the
start. `max_depth` and `beam_width` shape the walk; only the node budget makes a ranked walk `incomplete`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from navigation.budget import Budget
from navigation.frontier import Frontier
from navigation.nodes import Candidate, NavigationResult, Node, StepKind, Visit
from navigation.protocols import ChildLister, NeighbourLister, NodeReader, ProgressCallback, Scorer
from navigation.scoring import DEFAULT_COMBINE, ScoreCombiner
from navigation.walk import Walk, root_candidates


class TreeWalk(Walk):
    """A tree exploration over a scoped reader and a child lister, driven by a ranked loop or a model.

    With a `scorer`, children are scored against the query and each gets the combined score
    `combine(own score, parent's combined score)` (default: own + 0.5 x parent); roots get their seed score.
    With `links` (and a scorer), an expansion also offers the `link_width` best unvisited out-neighbours
    there, each with its own score.
    """

    kind: StepKind = "tree_navigation"

    def __init__(
        self,
        reader: NodeReader,
        children: ChildLister,
        *,
        max_depth: int = 5,
        beam_width: int = 3,
        scorer: Scorer | None = None,
        combine: ScoreCombiner = DEFAULT_COMBINE,
        links: NeighbourLister | None = None,
        link_width: int = 2,
        budget: Budget | None = None,
        on_step: ProgressCallback | None = None,
    ) -> None:
        if max_depth < 0:
            raise ValueError("max_depth must not be negative")
        if beam_width < 1:
            raise ValueError("beam_width must be at least 1")
        super().__init__(reader, budget=budget, on_step=on_step)
        self.children = children
        self.max_depth = max_depth
        self.beam_width = beam_width
        self.scorer = scorer
        self.combine = combine
        self.links = links
        self.link_width = link_width
        self.frontier = Frontier()
        self.scored = scorer is not None

    def add_roots(
        self, roots: Sequence[str | Node], scores: Mapping[str, float] | None = None
    ) -> list[Candidate]:
        """Offer start nodes; without `scores` they are scored by the scorer (if any)."""
        candidates = root_candidates(roots, scores, self)
        if scores is None and self.scorer is not None and candidates:
            own = self.scorer.score([c.key for c in candidates])
            scored = {c.key: float(own.get(c.key, 0.0)) for c in candidates}
            candidates = [replace(c, score=scored[c.key], own_score=scored[c.key]) for c in candidates]
        if scores is not None:
            self.scored = True
        return self.frontier.extend(candidates)

    def offered(self) -> list[Candidate]:
        """The frontier, children of the latest expansion first, older siblings after them."""
        return self.frontier.newest_first()

    def get(self, key: str) -> Candidate | None:
        return self.frontier.get(key)

    def _take(self, key: str) -> Candidate | None:
        return self.frontier.discard(key)

    def attach_preview(self, candidate: Candidate) -> None:
        if candidate.key in self.frontier:
            self.frontier.replace(candidate)

    def expansion(self, parent: Candidate) -> list[Candidate]:
        """The children `parent` offers (unvisited, at most `beam_width`, best first when scored), then the
        link targets it offers when the walk follows links (unvisited, at most `link_width`, best first by
        their own score; a key offered both ways keeps its higher score in the frontier)."""
        if parent.depth >= self.max_depth:
            return []
        keys = [k for k in dict.fromkeys(self.children.children(parent.key)) if not self.is_closed(k)]
        if self.scorer is None:
            return [
                Candidate(k, parent.depth + 1, parent.key, (*parent.path, k)) for k in keys[: self.beam_width]
            ]
        linked: dict[str, str] = {}
        if self.links is not None:
            for k, edge_type in self.links.neighbours(parent.key, "out", None, 256):
                if k not in linked and not self.is_closed(k):
                    linked[k] = edge_type
        if not keys and not linked:
            return []
        own = self.scorer.score(list(dict.fromkeys([*keys, *linked])))
        children = _best(
            [(self.combine(float(own.get(k, 0.0)), parent.score), float(own.get(k, 0.0)), k) for k in keys],
            self.beam_width,
        )
        jumps = _best([(float(own.get(k, 0.0)), float(own.get(k, 0.0)), k) for k in linked], self.link_width)
        return [
            Candidate(k, parent.depth + 1, parent.key, (*parent.path, k), combined, own_score)
            for combined, own_score, k in children
        ] + [
            Candidate(k, parent.depth + 1, parent.key, (*parent.path, k), score, score, linked[k])
            for score, _, k in jumps
        ]

    def _arrive(self, candidate: Candidate) -> None:
        self.frontier.extend(self.expansion(candidate))

    def result(self) -> NavigationResult:
        """The walk so far as a result: `incomplete` when a budget ran out with candidates still offered."""
        reason = self.budget.exhausted if self.frontier else None
        return NavigationResult(
            status="incomplete" if reason else "completed",
            reason=reason,
            visits=tuple(self.visits),
            unreadable=tuple(self.unreadable),
        )


def _best(scored: list[tuple[float, float, str]], width: int) -> list[tuple[float, float, str]]:
    """The `width` highest (combined, own, key) entries by combined score (ties: listed order)."""
    return [t for _, t in sorted(enumerate(scored), key=lambda e: (-e[1][0], e[0]))[:width]]


def rank_tree(
    reader: NodeReader,
    children: ChildLister,
    scorer: Scorer,
    start: str | Sequence[str] | Mapping[str, float],
    *,
    max_depth: int = 5,
    beam_width: int = 3,
    max_nodes: int = 30,
    combine: ScoreCombiner = DEFAULT_COMBINE,
    links: NeighbourLister | None = None,
    link_width: int = 2,
    budget: Budget | None = None,
    on_step: ProgressCallback | None = None,
) -> NavigationResult:
    """Ranked tree selection: best-first expansion from a start key, several start keys, or seed hits
    (key -> seed score), reading the frontier's best combined score next (ties: smallest key) until the
    frontier is empty (`completed`) or `max_nodes` nodes were read (`incomplete`, reason `max_nodes`).

    With `links`, expansions also offer the best `link_width` link targets (see `TreeWalk`). Deterministic
    for deterministic protocols; needs no model. `budget`, when given, replaces `max_nodes`
    (its own `max_nodes` applies). The result's `ranked(limit)` orders the visits by final relevance.
    """
    budget = budget if budget is not None else Budget(max_nodes=max_nodes)
    walk = TreeWalk(
        reader,
        children,
        max_depth=max_depth,
        beam_width=beam_width,
        scorer=scorer,
        combine=combine,
        links=links,
        link_width=link_width,
        budget=budget,
        on_step=on_step,
    )
    if isinstance(start, str):
        walk.add_roots([start])
    elif isinstance(start, Mapping):
        walk.add_roots(list(start), scores=start)
    else:
        walk.add_roots(list(start))
    while (best := walk.frontier.best()) is not None:
        if budget.nodes_left == 0:
            budget.exhaust("max_nodes")
            break
        walk.visit(best.key)
    return walk.result()


def answer_order(
    visits: Sequence[Visit],
    relevance: Mapping[str, float],
    links_of: Callable[[str], Collection[str]] | None,
    *,
    head: int,
    link_bonus: float,
) -> list[tuple[Visit, float]]:
    """The visits as an answer, each with the score it is ranked by: the `head` most relevant first (by
    relevance; ties: visit order), then the rest by relevance + `link_bonus` x the relevance of the most
    relevant head visit that links to it (`links_of(key)`: a head visit's link targets; None: no links), so
    the sections the best ones point to come before unlinked ones of similar relevance (answers often need
    several sections)."""
    ordered = sorted(visits, key=lambda v: (-relevance.get(v.key, 0.0), v.order))
    top = ordered[:head]
    linked = {} if links_of is None else {v.key: links_of(v.key) for v in top}
    out = [(v, relevance.get(v.key, 0.0)) for v in top]
    rest = []
    for v in ordered[head:]:
        bonus = max((relevance.get(h.key, 0.0) for h in top if v.key in linked.get(h.key, ())), default=0.0)
        rest.append((v, relevance.get(v.key, 0.0) + link_bonus * bonus))
    return out + sorted(rest, key=lambda t: (-t[1], t[0].order))
