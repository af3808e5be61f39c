"""Saved agents: create, read, change (mutable parameters only), run and delete."""

from __future__ import annotations

from typing import Any, Literal

import psycopg
from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, Field

from agentdb import saved_agents
from agentdb.agent import MAX_QUERY_CHARS, RetrievalResponse
from agentdb.api.access import principal, read_principal
from agentdb.api.routing import DatabaseRoute, connection, read_connection
from agentdb.auth import Principal

router = APIRouter(tags=["agents"], route_class=DatabaseRoute)


class RunRequest(BaseModel):
    input: str = Field("", max_length=MAX_QUERY_CHARS)
    diagnostics: bool = False
    # The run's variables, for an agent whose memory store name uses them (`user_{var.user_id}`).
    vars: dict[str, str | int] | None = None
    # Read-your-writes, as in POST /agents/retrieval (agentdb.api.routing.read_wish reads them).
    min_lsn: str | None = Field(None, max_length=40, description="as in POST /agents/retrieval")
    consistency: Literal["any", "primary"] | None = Field(None, description="as in POST /agents/retrieval")


@router.post("/agents", response_model=saved_agents.SavedAgent, status_code=201)
def create(
    spec: saved_agents.SavedAgentIn,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> saved_agents.SavedAgent:
    """Create an agent owned by the caller (needs the `search` tool and a grant on its source, or the
    `memory` tool for an agent on one of its memory stores: `source_kind` "name")."""
    return saved_agents.create_agent(conn, caller, spec)


@router.get("/agents", response_model=list[saved_agents.SavedAgent])
def list_all(
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> list[saved_agents.SavedAgent]:
    """The caller's own agents."""
    return saved_agents.list_agents(conn, caller)


@router.get("/agents/{name}", response_model=saved_agents.SavedAgent)
def read(
    name: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> saved_agents.SavedAgent:
    agent = saved_agents.get_agent(conn, caller, name)
    saved_agents.authorize(conn, caller, agent)
    return agent


@router.patch("/agents/{name}", response_model=saved_agents.SavedAgent)
def change(
    name: str,
    changes: dict[str, Any] = Body(...),  # noqa: B008
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> saved_agents.SavedAgent:
    return saved_agents.patch_agent(conn, caller, name, changes)


@router.delete("/agents/{name}", status_code=204)
def delete(
    name: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> None:
    saved_agents.delete_agent(conn, caller, name)


@router.post("/agents/{name}/run", response_model=RetrievalResponse)
def run(
    name: str,
    body: RunRequest,
    http: Request,
    conn: psycopg.Connection[Any] = Depends(read_connection),  # noqa: B008
    caller: Principal | None = Depends(read_principal),  # noqa: B008
) -> RetrievalResponse:
    """Run the agent as the POST /agents/retrieval request its parameters make (its own `input` when set,
    else the run's input), under the running caller's grants; the answer has that endpoint's shape."""
    return saved_agents.run_agent(
        conn,
        caller,
        name,
        body.input,
        http.app.state.settings,
        diagnostics=body.diagnostics,
        variables=body.vars,
    )
