"""The hard budgets one run shares: model turns, tool calls (never more than 20), nodes read and context tokens.

Every budget is checked before the work it bounds, and running out is a value (`Budget.exhausted`, a reason
string), never an exception: the run then stops with status `incomplete` and what it collected.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from navigation.nodes import Reason
from navigation.protocols import Remaining

TOOL_CALL_CAP = 20
"""No run makes more tool calls than this, whatever it is configured with."""

TokenEstimator = Callable[[str], int]
T = TypeVar("T")


def estimate_tokens(text: str) -> int:
    """A cheap token estimate: one token per four characters, rounded up."""
    return (len(text) + 3) // 4


class Budget:
    """Counters and limits for one run; `take_*` and `charge` spend one unit when there is one left, and
    otherwise record the first budget that ran out in `exhausted` and return False.

    `max_iterations` counts model turns, `max_tool_calls` the model's tool calls (capped at 20),
    `max_nodes` the nodes a walk moves to (each read attempt, a vanished node included; previews read to show
    offered candidates are not counted), and the context is `max_context_tokens` less `reserve_tokens`, kept
    back for the model's answer, measured with `estimate`.
    """

    def __init__(
        self,
        *,
        max_iterations: int = 20,
        max_tool_calls: int = TOOL_CALL_CAP,
        max_nodes: int | None = None,
        max_context_tokens: int = 100_000,
        reserve_tokens: int = 4_096,
        estimate: TokenEstimator = estimate_tokens,
    ) -> None:
        for name, value in (
            ("max_iterations", max_iterations),
            ("max_tool_calls", max_tool_calls),
            ("max_context_tokens", max_context_tokens),
            ("reserve_tokens", reserve_tokens),
        ):
            if value < 0:
                raise ValueError(f"{name} must not be negative")
        if max_nodes is not None and max_nodes < 0:
            raise ValueError("max_nodes must not be negative")
        self.max_iterations = max_iterations
        self.max_tool_calls = min(max_tool_calls, TOOL_CALL_CAP)
        self.max_nodes = max_nodes
        self.max_context_tokens = max_context_tokens
        self.reserve_tokens = reserve_tokens
        self.estimate = estimate
        self.iterations = 0
        self.tool_calls = 0
        self.nodes_read = 0
        self.context_used = 0
        self.exhausted: Reason | None = None

    def exhaust(self, reason: Reason) -> bool:
        """Record `reason` as the budget that ran out (the first one recorded stays); returns False."""
        if self.exhausted is None:
            self.exhausted = reason
        return False

    @property
    def iterations_left(self) -> int:
        return max(self.max_iterations - self.iterations, 0)

    @property
    def tool_calls_left(self) -> int:
        return max(self.max_tool_calls - self.tool_calls, 0)

    @property
    def nodes_left(self) -> int | None:
        return None if self.max_nodes is None else max(self.max_nodes - self.nodes_read, 0)

    @property
    def context_left(self) -> int:
        """Tokens still free for the conversation, the reserve (for the model's answer) kept back."""
        return max(self.max_context_tokens - self.reserve_tokens - self.context_used, 0)

    def take_iteration(self) -> bool:
        """Spend one model turn, if one is left."""
        if self.iterations >= self.max_iterations:
            return self.exhaust("max_iterations")
        self.iterations += 1
        return True

    def take_tool_call(self) -> bool:
        """Spend one tool call, if one is left."""
        if self.tool_calls >= self.max_tool_calls:
            return self.exhaust("tool_calls")
        self.tool_calls += 1
        return True

    def take_node(self) -> bool:
        """Spend one node read, if one is left."""
        if self.max_nodes is not None and self.nodes_read >= self.max_nodes:
            return self.exhaust("max_nodes")
        self.nodes_read += 1
        return True

    def fits(self, text: str) -> bool:
        """Whether `text` fits the context left."""
        return self.estimate(text) <= self.context_left

    def charge(self, text: str) -> bool:
        """Add `text` to the context used, if it fits."""
        cost = self.estimate(text)
        if cost > self.context_left:
            return self.exhaust("context")
        self.context_used += cost
        return True

    def fit_prefix(self, items: Sequence[T], render: Callable[[T], str], *, overhead: int = 0) -> list[T]:
        """The longest prefix of `items` whose renderings, plus `overhead` tokens, fit the context left."""
        left = self.context_left - overhead
        out: list[T] = []
        for item in items:
            left -= self.estimate(render(item))
            if left < 0:
                break
            out.append(item)
        return out

    def remaining(self, moves: int | None = None) -> Remaining:
        """A snapshot of what is left, for the chooser."""
        return Remaining(self.iterations_left, self.tool_calls_left, self.context_left, moves)


def fit_prefix(
    items: Sequence[T], render: Callable[[T], str], budget: Budget, *, overhead: int = 0
) -> list[T]:
    """The longest prefix of `items` whose renderings fit what is left of `budget`'s context."""
    return budget.fit_prefix(items, render, overhead=overhead)
