"""The records a walk reads and produces: nodes, offered candidates, steps, visits and the run's result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["completed", "incomplete"]
StepKind = Literal["tree_navigation", "graph_navigation"]
Direction = Literal["out", "in", "both"]
Reason = Literal["max_iterations", "tool_calls", "context", "max_nodes", "max_steps"]


@dataclass(frozen=True)
class Node:
    """One node as the caller's scoped reader returns it: key, title, text and the other projected fields."""

    key: str
    title: str = ""
    text: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Candidate:
    """A key offered for the next move, with where it sits in the walk if it is taken.

    `score` is the walk's relevance for it (ranked: the combined path score; agentic: 0 unless a scorer ordered
    the children), `own_score` the scorer's score of the node alone, and `node` a preview read to show it.
    """

    key: str
    depth: int
    parent: str | None
    path: tuple[str, ...]
    score: float = 0.0
    own_score: float = 0.0
    edge_type: str | None = None
    node: Node | None = None


@dataclass(frozen=True)
class Step:
    """One node read by a walk: where it sits (depth, real branch parent, path), where the walk came from, and
    how long reading and expanding it took."""

    kind: StepKind
    order: int
    current_key: str
    from_key: str | None
    parent: str | None
    depth: int
    path: tuple[str, ...]
    duration_ms: float
    score: float | None = None
    edge_type: str | None = None

    @property
    def name(self) -> StepKind:
        """The step's name in a response (`tree_navigation` or `graph_navigation`)."""
        return self.kind

    def details(self) -> dict[str, Any]:
        """The step's `details` object for a response or a `step_progress` event."""
        out: dict[str, Any] = {
            "depth": self.depth,
            "from_key": self.from_key,
            "current_key": self.current_key,
            "parent": self.parent,
            "path": list(self.path),
            "order": self.order,
        }
        if self.score is not None:
            out["score"] = self.score
        if self.edge_type is not None:
            out["edge_type"] = self.edge_type
        return out


@dataclass(frozen=True)
class Visit:
    """A visited node and the step that read it: the evidence a walk collects."""

    node: Node
    step: Step

    @property
    def key(self) -> str:
        return self.node.key

    @property
    def depth(self) -> int:
        return self.step.depth

    @property
    def parent(self) -> str | None:
        return self.step.parent

    @property
    def path(self) -> tuple[str, ...]:
        return self.step.path

    @property
    def order(self) -> int:
        return self.step.order

    @property
    def score(self) -> float:
        return self.step.score if self.step.score is not None else 0.0


@dataclass(frozen=True)
class CallRecord:
    """One tool call the model made, whether it was executed, and the tool result it got back."""

    turn: int
    name: str
    args: Any
    executed: bool
    result: str


@dataclass(frozen=True)
class NavigationResult:
    """The outcome of a run: `completed`, or `incomplete` with the budget that ran out (`reason`), and the
    evidence and steps collected either way; agentic runs also report rules, turns and tool calls."""

    status: Status
    reason: Reason | None
    visits: tuple[Visit, ...]
    unreadable: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    turns: int = 0
    tool_calls_made: int = 0
    calls: tuple[CallRecord, ...] = ()

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps in visit order."""
        return tuple(v.step for v in self.visits)

    @property
    def keys(self) -> list[str]:
        """The visited keys in visit order."""
        return [v.key for v in self.visits]

    def ranked(self, limit: int | None = None) -> list[Visit]:
        """The visits by final relevance (highest first, earlier visit first on ties), at most `limit`."""
        ordered = sorted(self.visits, key=lambda v: (-v.score, v.order))
        return ordered if limit is None else ordered[:limit]
