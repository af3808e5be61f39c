"""The tree frontier: offered, unvisited candidates, kept while one branch is explored so the walk can come back
to the siblings it left behind."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from navigation.nodes import Candidate


class Frontier:
    """Candidates by key, each remembering the expansion that offered it.

    `pop_best` gives the highest score (ties: the smallest key), for ranked walks; `newest_first` lists the
    latest expansion first (in its own order) and older ones after it, for showing to a model. A key offered
    again keeps its first entry unless the new one scores higher.
    """

    def __init__(self) -> None:
        self._items: dict[str, tuple[int, int, Candidate]] = {}
        self._batches = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[Candidate]:
        return (entry[2] for entry in self._items.values())

    def extend(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        """Add one expansion's candidates; returns those that were added or replaced an entry."""
        batch = self._batches
        self._batches += 1
        added = []
        for position, candidate in enumerate(candidates):
            old = self._items.get(candidate.key)
            if old is not None and candidate.score <= old[2].score:
                continue
            self._items[candidate.key] = (batch, position, candidate)
            added.append(candidate)
        return added

    def get(self, key: str) -> Candidate | None:
        """The entry for `key`, if it is in the frontier."""
        entry = self._items.get(key)
        return None if entry is None else entry[2]

    def replace(self, candidate: Candidate) -> None:
        """Update the entry for an existing key in place (e.g. to attach a preview)."""
        batch, position, _ = self._items[candidate.key]
        self._items[candidate.key] = (batch, position, candidate)

    def discard(self, key: str) -> Candidate | None:
        """Remove `key` and return its entry, if it was there."""
        entry = self._items.pop(key, None)
        return None if entry is None else entry[2]

    def best(self) -> Candidate | None:
        """The highest-scoring candidate (ties: the smallest key), left in place."""
        if not self._items:
            return None
        return min(self._items.values(), key=lambda e: (-e[2].score, e[2].key))[2]

    def pop_best(self) -> Candidate | None:
        """Remove and return the highest-scoring candidate (ties: the smallest key)."""
        best = self.best()
        if best is not None:
            del self._items[best.key]
        return best

    def newest_first(self) -> list[Candidate]:
        """The candidates, latest expansion first, each expansion in the order it was offered."""
        return [e[2] for e in sorted(self._items.values(), key=lambda e: (-e[0], e[1]))]
