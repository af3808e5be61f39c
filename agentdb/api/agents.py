"""Saved agents: create, read, change (mutable parameters only), run and delete."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, Field

from agentdb import saved_agents
from agentdb.agent import MAX_QUERY_CHARS, read_scope
from agentdb.api.deps import connection, principal
from agentdb.auth import Principal, check_fields
from agentdb.generation import GenerationStep, generate
from agentdb.llm import UsageMeter, resolve_model
from agentdb.retrieval import retrieve

router = APIRouter(tags=["agents"])


class RunRequest(BaseModel):
    input: str = Field("", max_length=MAX_QUERY_CHARS)


class RunResponse(BaseModel):
    route: str
    hits: list[dict[str, Any]]
    diagnostics: dict[str, Any]
    generation: dict[str, Any] | None = None
    usage: dict[str, int]


@router.post("/agents", response_model=saved_agents.SavedAgent, status_code=201)
def create(
    spec: saved_agents.SavedAgentIn,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> saved_agents.SavedAgent:
    """Create an agent owned by the caller (needs the `search` tool and a grant on its source)."""
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
    saved_agents.authorize(conn, caller, agent.source, agent.filter)
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


@router.post("/agents/{name}/run", response_model=RunResponse)
def run(
    name: str,
    body: RunRequest,
    http: Request,
    conn: psycopg.Connection[Any] = Depends(connection),  # noqa: B008
    caller: Principal | None = Depends(principal),  # noqa: B008
) -> RunResponse:
    """Run the agent's Retrieve step: its own `input` when set, else the run's input (seed 001)."""
    agent = saved_agents.get_agent(conn, caller, name)
    # The running caller's grant applies, checked again now (it is also what the run reads under).
    saved_agents.authorize(conn, caller, agent.source, agent.filter)
    fields = check_fields(caller, None) if caller is not None else None
    text = agent.input or body.input
    step = GenerationStep.parse(agent.generation, path="generation")
    model = None
    if step.enabled:  # resolved before retrieval: a missing key is a clear 400, not a half-run
        step.check_query(text, path="input")
        model = UsageMeter(
            resolve_model(step.generator, http.app.state.settings, path="generation.generator")
        )
    with read_scope(conn, caller):
        result = retrieve(
            conn,
            agent.source,
            text,
            mode=agent.retrieval_mode,
            top_k=agent.top_k,
            rrf_k=agent.rrf_k,
            threshold=agent.threshold,
            filter=agent.filter,
            row_filter=caller.row_filter if caller else None,
            fields=fields,
        )
    answer = None
    if model is not None:
        answer = generate(
            model,
            text,
            {agent.source: result.hits},
            system_prompt=step.system_prompt,
            template=step.template,
            placement=step.placement,
            max_tokens=step.max_tokens,
        ).to_dict()
    usage = (
        model.usage.to_dict()
        if model is not None
        else {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0}
    )
    return RunResponse(
        route=result.route,
        hits=[h.__dict__ for h in result.hits],
        diagnostics=result.diagnostics,
        generation=answer,
        usage={k: usage[k] for k in ("input_tokens", "output_tokens", "llm_calls")},
    )
