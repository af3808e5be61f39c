"""Saved agents: a named Retrieve step whose structural parameters are fixed and whose mutable ones
(filter, top_k, threshold, retrieval_mode, rrf_k) can be changed; a filter that does not compile is
rejected and the previous one stays in force."""

from __future__ import annotations

from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field

from agentdb.errors import Conflict, InvalidAgentId, InvalidParamValue, ParamNotMutable, parse_params
from agentdb.filters import validate_filter
from agentdb.generation import GenerationStep
from agentdb.sources import get_source

STRUCTURAL = ("name", "source", "input", "storage", "schema")
MUTABLE = ("filter", "top_k", "threshold", "retrieval_mode", "rrf_k", "generation")


class RetrieveParams(BaseModel):
    """The mutable parameters, with the Retrieve step's defaults (REFERENCE.md section 1)."""

    model_config = ConfigDict(extra="forbid")

    filter: dict[str, Any] | None = None
    top_k: int = Field(2, ge=1, le=1000)
    threshold: float = Field(0.5, ge=0, le=2)
    retrieval_mode: Literal["dense", "lexical", "hybrid"] = "dense"
    rrf_k: int = Field(60, ge=1, le=1000)
    # The generation step, as in a retrieval request's steps.generation (validated by GenerationStep).
    generation: dict[str, Any] | None = None


class SavedAgentIn(RetrieveParams):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    source: str
    input: str = ""


class SavedAgent(SavedAgentIn):
    model_config = ConfigDict(extra="ignore")


def _row(conn: psycopg.Connection[Any], name: str) -> SavedAgent:
    row = conn.execute(
        "select name, source, input, params from agentdb.saved_agents where name = %s", (name,)
    ).fetchone()
    if row is None:
        raise InvalidAgentId(f"unknown agent {name!r}", path="name")
    return SavedAgent(name=row[0], source=row[1], input=row[2], **row[3])


def create_agent(conn: psycopg.Connection[Any], spec: SavedAgentIn) -> SavedAgent:
    source = get_source(conn, spec.source)
    validate_filter(conn, source, spec.filter)
    GenerationStep.parse(spec.generation, path="generation")
    params = RetrieveParams(**spec.model_dump(include=set(MUTABLE)))
    with conn.transaction():
        done = conn.execute(
            "insert into agentdb.saved_agents (name, source, input, params) values (%s, %s, %s, %s)"
            " on conflict (name) do nothing returning name",
            (spec.name, spec.source, spec.input, Jsonb(params.model_dump())),
        ).fetchone()
    if done is None:
        raise Conflict(f"agent {spec.name!r} already exists", path="name")
    return get_agent(conn, spec.name)


def get_agent(conn: psycopg.Connection[Any], name: str) -> SavedAgent:
    return _row(conn, name)


def list_agents(conn: psycopg.Connection[Any]) -> list[SavedAgent]:
    rows = conn.execute("select name from agentdb.saved_agents order by name").fetchall()
    return [_row(conn, r[0]) for r in rows]


def patch_agent(conn: psycopg.Connection[Any], name: str, changes: dict[str, Any]) -> SavedAgent:
    """Change mutable parameters; structural ones are 3006, a bad value (or filter) 3007 and nothing changes."""
    current = _row(conn, name)
    for key in changes:
        if key in STRUCTURAL:
            raise ParamNotMutable(f"{key!r} is structural: it is fixed when the agent is created", path=key)
        if key not in MUTABLE:
            raise InvalidParamValue(
                f"unknown parameter {key!r}; mutable ones: {', '.join(MUTABLE)}", path=key
            )
    merged = {**current.model_dump(include=set(MUTABLE)), **changes}
    params = parse_params(RetrieveParams, merged, path="")
    if "filter" in changes:
        validate_filter(conn, get_source(conn, current.source), params.filter)
    if "generation" in changes:
        GenerationStep.parse(params.generation, path="generation")
    with conn.transaction():
        conn.execute(
            "update agentdb.saved_agents set params = %s, updated_at = now() where name = %s",
            (Jsonb(params.model_dump()), name),
        )
    return _row(conn, name)


def delete_agent(conn: psycopg.Connection[Any], name: str) -> None:
    if (
        conn.execute("delete from agentdb.saved_agents where name = %s returning name", (name,)).fetchone()
        is None
    ):
        raise InvalidAgentId(f"unknown agent {name!r}", path="name")
