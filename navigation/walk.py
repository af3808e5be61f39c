"""What tree and graph walks share: the visited set, the visit records with their steps, the nodes lost
mid-walk, and the one way a node is read (under the node budget, timed, reported to the progress callback)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace

from navigation.budget import Budget
from navigation.nodes import Candidate, Node, Reason, Step, StepKind, Visit
from navigation.protocols import NodeReader, ProgressCallback


class Walk(ABC):
    """The state of one exploration: offered candidates, visits in order, and keys never to offer again."""

    kind: StepKind

    def __init__(
        self, reader: NodeReader, *, budget: Budget | None = None, on_step: ProgressCallback | None = None
    ) -> None:
        self.reader = reader
        self.budget = budget if budget is not None else Budget()
        self.on_step = on_step
        self.visits: list[Visit] = []
        self.visited: set[str] = set()
        self.unreadable: list[str] = []
        self.scored = False  # whether candidate scores mean anything (then steps report them)

    @abstractmethod
    def add_roots(
        self, roots: Sequence[str | Node], scores: Mapping[str, float] | None = None
    ) -> list[Candidate]:
        """Offer start nodes (depth 0, no parent); returns the candidates actually offered."""

    @abstractmethod
    def offered(self) -> list[Candidate]:
        """The candidates a move may choose now, in the order to show them."""

    @abstractmethod
    def get(self, key: str) -> Candidate | None:
        """The offered candidate for `key`, if it is offered now."""

    @abstractmethod
    def _take(self, key: str) -> Candidate | None:
        """Remove `key` from the offered candidates and return it."""

    @abstractmethod
    def _arrive(self, candidate: Candidate) -> None:
        """Update the offer after `candidate` was read (expand children, replace neighbours)."""

    @abstractmethod
    def attach_preview(self, candidate: Candidate) -> None:
        """Keep a preview node on an offered candidate so it is not read again to be shown."""

    @property
    def moves_left(self) -> int | None:
        """Moves still allowed (None: the walk has no move limit of its own)."""
        return None

    def limit_reason(self) -> Reason | None:
        """A walk-specific budget that stops further moves while something is still offered."""
        return None

    def is_closed(self, key: str) -> bool:
        """Whether `key` was visited or found unreadable, so it is never offered again."""
        return key in self.visited or key in self.unreadable

    def drop(self, key: str) -> None:
        """Withdraw an offered key whose node is no longer readable; the rest of the offer stays."""
        self._take(key)
        if key not in self.unreadable:
            self.unreadable.append(key)

    def previews(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """`candidates` with a preview node each, read in one batch; the unreadable ones are dropped."""
        missing = [c.key for c in candidates if c.node is None]
        found = {n.key: n for n in self.reader.read(missing)} if missing else {}
        out = []
        for c in candidates:
            if c.node is None:
                node = found.get(c.key)
                if node is None:
                    self.drop(c.key)
                    continue
                c = replace(c, node=node)
                self.attach_preview(c)
            out.append(c)
        return out

    def visit(self, key: str) -> Visit | None:
        """Move to the offered `key`: read it and update the offer. None when the node budget is spent (the
        key stays offered) or the node is not readable (its branch stops, the rest of the offer stays)."""
        candidate = self.get(key)
        if candidate is None:
            raise ValueError(f"{key!r} is not offered")
        if not self.budget.take_node():
            return None
        started = time.perf_counter()
        self._take(key)
        node = next((n for n in self.reader.read([key]) if n.key == key), None)
        if node is None:
            self.unreadable.append(key)
            return None
        self.visited.add(key)
        self._arrive(candidate)
        step = Step(
            kind=self.kind,
            order=len(self.visits),
            current_key=key,
            from_key=self.visits[-1].key if self.visits else None,
            parent=candidate.parent,
            depth=candidate.depth,
            path=candidate.path,
            duration_ms=(time.perf_counter() - started) * 1000.0,
            score=candidate.score if self.scored else None,
            edge_type=candidate.edge_type,
        )
        visit = Visit(node, step)
        self.visits.append(visit)
        if self.on_step is not None:
            self.on_step(step)
        return visit


def root_candidates(
    roots: Sequence[str | Node], scores: Mapping[str, float] | None, exclude: Walk
) -> list[Candidate]:
    """Depth-0 candidates for `roots` (first occurrence of a key wins), skipping closed keys."""
    out: list[Candidate] = []
    seen: set[str] = set()
    for root in roots:
        key, node = (root, None) if isinstance(root, str) else (root.key, root)
        if key in seen or exclude.is_closed(key):
            continue
        seen.add(key)
        score = float(scores.get(key, 0.0)) if scores is not None else 0.0
        out.append(Candidate(key, 0, None, (key,), score, score, None, node))
    return out
