"""What one MCP session may spend: tool calls, nodes (documents) read and bytes returned.

Each is checked before the work it bounds where it can be (a call before it runs, a read's size capped by the
nodes left) and counted after; a spent budget is a tool error (1429, at `budget.<name>`) saying which one and
what raises it, never a silent truncation. Nothing a tool returns can change a budget: only these methods do."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from agentdb.config import Settings
from agentdb.errors import TooManyRequests


@dataclass
class Budget:
    max_tool_calls: int
    max_nodes_read: int
    max_bytes: int
    tool_calls: int = 0
    nodes_read: int = 0
    bytes_returned: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, settings: Settings) -> Budget:
        return cls(settings.mcp_max_tool_calls, settings.mcp_max_nodes_read, settings.mcp_max_bytes)

    def _spent(self, name: str, limit: int, setting: str) -> TooManyRequests:
        return TooManyRequests(
            f"this session's budget of {limit} {name.replace('_', ' ')} is spent",
            path=f"budget.{name}",
            hint=f"start a new session; an operator may raise {setting}",
        )

    def call(self) -> None:
        """Count one tool call (every call counts, failed ones too); 1429 once the session has made them all."""
        with self._lock:
            if self.tool_calls >= self.max_tool_calls:
                raise self._spent("tool_calls", self.max_tool_calls, "AGENTDB_MCP_MAX_TOOL_CALLS")
            self.tool_calls += 1

    def take_nodes(self, wanted: int, path: str) -> int:
        """How many of `wanted` nodes the session may still read (at most what is left); 1429 when none."""
        with self._lock:
            left = self.max_nodes_read - self.nodes_read
            if left <= 0:
                raise self._spent("nodes_read", self.max_nodes_read, "AGENTDB_MCP_MAX_NODES_READ")
            return min(wanted, left)

    def spend_nodes(self, count: int) -> None:
        with self._lock:
            self.nodes_read += count

    def spend_bytes(self, count: int) -> None:
        """Count a result of `count` bytes before it is sent; 1429 (and nothing sent) when it would go over."""
        with self._lock:
            if self.bytes_returned + count > self.max_bytes:
                raise self._spent("bytes", self.max_bytes, "AGENTDB_MCP_MAX_BYTES")
            self.bytes_returned += count

    def state(self) -> dict[str, int]:
        """What is left of each budget (shown with every result)."""
        with self._lock:
            return {
                "tool_calls": self.max_tool_calls - self.tool_calls,
                "nodes_read": self.max_nodes_read - self.nodes_read,
                "bytes": self.max_bytes - self.bytes_returned,
            }


__all__ = ["Budget"]
