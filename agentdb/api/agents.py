"""Saved agents: create, read, change (mutable parameters only), run and delete."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import APIRouter, Body, Depends
from pydantic import BaseModel

from agentdb import saved_agents
from agentdb.agent import read_scope
from agentdb.api.deps import connection, principal
from agentdb.auth import Principal, check_table, check_tool
from agentdb.retrieval import retrieve

router = APIRouter(tags=["agents"])


class RunRequest(BaseModel):
    input: str = ""


class RunResponse(BaseModel):
    route: str
    hits: list[dict[str, Any]]
    diagnostics: dict[str, Any]


def _allowed(caller: Principal | None, agent: saved_agents.SavedAgent) -> None:
    if caller is not None:
        check_tool(caller, "search")
        check_table(caller, agent.source, path="source")


@router.post("/agents", response_model=saved_agents.SavedAgent, status_code=201)
def create(
    spec: saved_agents.SavedAgentIn,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> saved_agents.SavedAgent:
    _allowed(caller, saved_agents.SavedAgent(**spec.model_dump()))
    return saved_agents.create_agent(conn, spec)


@router.get("/agents", response_model=list[saved_agents.SavedAgent])
def list_all(
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> list[saved_agents.SavedAgent]:
    agents = saved_agents.list_agents(conn)
    return [a for a in agents if caller is None or a.source in caller.tables]


@router.get("/agents/{name}", response_model=saved_agents.SavedAgent)
def read(
    name: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> saved_agents.SavedAgent:
    agent = saved_agents.get_agent(conn, name)
    _allowed(caller, agent)
    return agent


@router.patch("/agents/{name}", response_model=saved_agents.SavedAgent)
def change(
    name: str,
    changes: dict[str, Any] = Body(...),  # noqa: B008
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> saved_agents.SavedAgent:
    _allowed(caller, saved_agents.get_agent(conn, name))
    return saved_agents.patch_agent(conn, name, changes)


@router.delete("/agents/{name}", status_code=204)
def delete(
    name: str,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> None:
    _allowed(caller, saved_agents.get_agent(conn, name))
    saved_agents.delete_agent(conn, name)


@router.post("/agents/{name}/run", response_model=RunResponse)
def run(
    name: str,
    body: RunRequest,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> RunResponse:
    """Run the agent's Retrieve step: its own `input` when set, else the run's input (seed 001)."""
    agent = saved_agents.get_agent(conn, name)
    _allowed(caller, agent)
    text = agent.input or body.input
    with read_scope(conn, caller):
        result = retrieve(
            conn, agent.source, text, mode=agent.retrieval_mode, top_k=agent.top_k, rrf_k=agent.rrf_k,
            threshold=agent.threshold, filter=agent.filter, row_filter=caller.row_filter if caller else None,
            fields=list(caller.fields) if caller and caller.fields is not None else None,
        )
    return RunResponse(route=result.route, hits=[h.__dict__ for h in result.hits], diagnostics=result.diagnostics)
