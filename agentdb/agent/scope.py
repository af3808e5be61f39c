"""Where the agent's reads run: under the caller's database role, and with errors that name the query."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import psycopg

from agentdb.auth import Principal, principal_scope
from agentdb.errors import AgentDBError


def read_scope(conn: psycopg.Connection[Any], principal: Principal | None) -> AbstractContextManager[Any]:
    """Every read of a principal runs under its database role (grants and row security); none in local dev."""
    return principal_scope(conn, principal) if principal is not None else nullcontext(conn)


@contextmanager
def in_query(index: int) -> Iterator[None]:
    """Errors raised for one query carry the full path from the request root (`queries[1].fields[0]`)."""
    try:
        yield
    except AgentDBError as exc:
        if exc.path and not exc.path.startswith("queries["):
            exc.path = f"queries[{index}].{exc.path}"
        raise


__all__ = ["in_query", "read_scope"]
