"""What a walk needs from its caller: scoped reads, child and neighbour lists, scores, search and a model.

agentdb implements these with SQL that re-applies the query filter, the principal's row filter and the field
projection on every call; the tests implement them with dictionaries. Nothing here knows about either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from navigation.nodes import Direction, Node, Step


class NodeReader(Protocol):
    """Reads nodes by key under the caller's scope."""

    def read(self, keys: Sequence[str]) -> Sequence[Node]:
        """The visible nodes among `keys`, in any order; a key left out is missing or not visible (the walk
        cannot and must not tell which)."""
        ...


class ChildLister(Protocol):
    """Lists the children of a node in a tree index."""

    def children(self, key: str) -> Sequence[str]:
        """The child keys of `key` in stored order (empty for a leaf or an unknown key)."""
        ...


class NeighbourLister(Protocol):
    """Lists the neighbours of a node in a graph index."""

    def neighbours(
        self, key: str, direction: Direction, edge_types: Sequence[str] | None, limit: int
    ) -> Sequence[tuple[str, str]]:
        """At most `limit` (neighbour key, edge type) pairs of `key` along `direction` (`out`: edges from
        `key`, `in`: edges to it, `both`), only of `edge_types` when given, in a stable order."""
        ...


class Scorer(Protocol):
    """Scores candidate keys against the run's query."""

    def score(self, keys: Sequence[str]) -> Mapping[str, float]:
        """Relevance of each key (higher is better); a key left out scores 0."""
        ...


class Searcher(Protocol):
    """Runs the `search` tool: the request's query (possibly rewritten) under the caller's permissions."""

    def search(self, query: str) -> Sequence[Node]:
        """The hits for `query`, best first."""
        ...


ProgressCallback = Callable[[Step], None]
"""Called once per node read by a walk (for the `step_progress` event)."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call of the model: `search` with `{"query": ...}` or `navigate` with `{"next_key": ...}`;
    `args` is kept as sent so a malformed call can be answered with feedback."""

    name: str
    args: Any
    id: str = ""


@dataclass(frozen=True)
class ToolResult:
    """The answer to one tool call (`is_error` marks rejected calls, whose content says what to do)."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class Decision:
    """The model's answer for one turn: tool calls, or none to stop; `text` is whatever it wrote besides."""

    calls: tuple[ToolCall, ...] = ()
    text: str = ""

    @property
    def stop(self) -> bool:
        """True when the model made no tool call, which ends the run."""
        return not self.calls


@dataclass(frozen=True)
class Remaining:
    """What is left of the run's budgets once the current turn's iteration is spent (`moves`: graph steps)."""

    iterations: int
    tool_calls: int
    context_tokens: int
    moves: int | None = None


@dataclass(frozen=True)
class Turn:
    """Everything the chooser needs for one model turn.

    `opening` is the first turn's message (question, start node, offered keys) and empty later; `results`
    answer the previous turn's calls in order; `rules` are the accumulated workflow rules (trusted, kept apart
    from evidence); `selectable` are the keys a `navigate` may name now; `tools` the tools it may call.
    """

    number: int
    query: str
    opening: str
    results: tuple[ToolResult, ...]
    rules: tuple[str, ...]
    selectable: tuple[str, ...]
    tools: tuple[str, ...]
    remaining: Remaining


class Chooser(Protocol):
    """The model in an agentic run: one call per turn."""

    def choose(self, turn: Turn) -> Decision:
        """The model's tool calls for this turn (or none, to stop)."""
        ...
