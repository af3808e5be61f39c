"""Errors of one query name it: the full path from the request root."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agentdb.errors import AgentDBError


@contextmanager
def in_query(index: int) -> Iterator[None]:
    """Errors raised for one query carry the full path from the request root (`queries[1].fields[0]`)."""
    try:
        yield
    except AgentDBError as exc:
        if exc.path and not exc.path.startswith("queries["):
            exc.path = f"queries[{index}].{exc.path}"
        raise


__all__ = ["in_query"]
