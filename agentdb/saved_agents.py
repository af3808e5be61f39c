"""Saved agents: a named Retrieve step whose structural parameters are fixed and whose mutable ones
(filter, top_k, threshold, retrieval_mode, rrf_k, generation, navigation, max_internal_iterations) can be
changed; a filter that does not compile is
rejected and the previous one stays in force.

The step reads a source (`source_kind` "file", the default: `source`) or one of the caller's memory stores
by name (`source_kind` "name": `storage`, a store name that may use the run's
variables, `user_{var.user_id}`, and `schema`, the record schema name the store must have, 3011 otherwise).

An agent belongs to the principal that created it (None: created without keys, in local development).
Names are unique per owner: every lookup is by (owner, name), so another principal's agent is as absent
as one that does not exist, and a name collision (409) can only be with one's own agent. Creating,
changing and running an agent need the `search` tool and a grant on its source, and its filter is checked
against the caller's field grant at each of these steps (authorize), so a stored filter can never read a
field the caller could not filter on directly.

Running an agent is a POST /agents/retrieval request built from its parameters (`retrieval_request`), run
through the same pipeline and answered in the same shape (`run_agent`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentdb.agent import MAX_QUERY_CHARS, RetrievalRequest, RetrievalResponse, respond, run, validate
from agentdb.agent.navigation.options import NavigationOptions
from agentdb.auth import Principal, check_filter, check_table, check_tool, read_scope
from agentdb.config import RRF_K, Settings
from agentdb.errors import (
    AgentDBError,
    Conflict,
    InvalidAgentId,
    InvalidParamValue,
    ParamNotMutable,
    parse_params,
)
from agentdb.filters import validate_filter
from agentdb.generation import GenerationStep
from agentdb.indexes import check_index
from agentdb.memory import (
    STORE_NAME,
    StoreSpec,
    check_spec,
    find_store,
    resolve_store_name,
    template_variables,
)
from agentdb.sources import get_source

STRUCTURAL = ("name", "source_kind", "source", "storage", "schema", "input")
MUTABLE = (
    "filter",
    "top_k",
    "threshold",
    "retrieval_mode",
    "rrf_k",
    "generation",
    "navigation",
    "max_internal_iterations",
)


class RetrieveParams(BaseModel):
    """The mutable parameters, with the Retrieve step's defaults."""

    model_config = ConfigDict(extra="forbid")

    filter: dict[str, Any] | None = None
    top_k: int = Field(2, ge=1, le=1000)
    threshold: float = Field(0.5, ge=0, le=2)
    retrieval_mode: Literal["dense", "lexical", "hybrid"] = "dense"
    rrf_k: int = Field(RRF_K, ge=1, le=1000)
    # The generation step, as in a retrieval request's steps.generation (validated by GenerationStep).
    generation: dict[str, Any] | None = None
    # Navigation over the source's indexes, as a request's steps.retrieval.navigation (its one query is
    # query_index 0, the default here), and the model's turns for agentic navigation.
    navigation: dict[str, Any] | None = None
    max_internal_iterations: int = Field(0, ge=0, le=20)


class SavedAgentIn(RetrieveParams):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    source_kind: Literal["file", "name"] = "file"
    source: str | None = None
    storage: str | None = Field(None, min_length=1, max_length=200)
    schema_name: str | None = Field(None, alias="schema", pattern=STORE_NAME.pattern)
    input: str = Field("", max_length=MAX_QUERY_CHARS)

    @field_validator("name")
    @classmethod
    def _not_the_endpoint(cls, name: str) -> str:
        # /agents/retrieval is the retrieval endpoint: an agent of that name could not be read or changed.
        if name == "retrieval":
            raise ValueError("'retrieval' is the name of the endpoint POST /agents/retrieval; choose another")
        return name


class SavedAgent(SavedAgentIn):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, serialize_by_alias=True)

    @property
    def reads_memory(self) -> bool:
        return self.source_kind == "name"


def _owner_key(owner: Principal | None) -> int:
    """The owner as stored in the unique index: the principal's id, 0 for no principal."""
    return 0 if owner is None else owner.id


def authorize(conn: psycopg.Connection[Any], caller: Principal | None, agent: SavedAgentIn) -> None:
    """Check that `caller` may run `agent`'s Retrieve step with its filter. On a source: the `search` tool,
    the table grant (403 at `source`, before anything says whether the source exists) and the field grant
    (403 when the filter reads a hidden field); a filter that does not compile is 3007 at `filter...`. On a
    memory store: the `memory` tool, and, when the store's name needs no variables and it exists, its record
    schema (3011 at `schema`) and the filter compiled against it (a store filled later, or named by the run's
    variables, is checked when the agent runs)."""
    if agent.source_kind == "name":
        _authorize_store(conn, caller, agent)
        return
    if agent.source is None:
        raise InvalidParamValue("source kind 'file' reads the source named in `source`", path="source")
    for name, value in (("storage", agent.storage), ("schema", agent.schema_name)):
        if value is not None:
            raise InvalidParamValue(f"`{name}` goes with source_kind 'name' (a memory store)", path=name)
    if caller is None:
        validate_filter(conn, get_source(conn, agent.source), agent.filter)
        return
    check_tool(caller, "search")
    check_table(caller, agent.source, path="source")
    check_filter(conn, caller, get_source(conn, agent.source), agent.filter, path="filter")


def _authorize_store(conn: psycopg.Connection[Any], caller: Principal | None, agent: SavedAgentIn) -> None:
    if agent.source is not None:
        raise InvalidParamValue(
            "source kind 'name' reads the memory store named in `storage`, not a source", path="source"
        )
    if agent.storage is None:
        raise InvalidParamValue(
            "source kind 'name' needs the memory store's name in `storage`", path="storage"
        )
    if agent.schema_name is None:
        raise InvalidParamValue(
            "source kind 'name' needs the store's record schema name in `schema`", path="schema"
        )
    if caller is not None:
        check_tool(caller, "memory", path="storage")
    # A name template is checked with every variable standing for a letter: what a run's variables can
    # never repair (a bad character outside the placeholders) is refused now.
    placeholders = dict.fromkeys(template_variables(agent.storage), "v")
    resolve_store_name(agent.storage, placeholders, path="storage")
    if placeholders:
        return
    with read_scope(conn, caller):
        store = find_store(conn, agent.storage)
    if store is not None:
        check_spec(store, StoreSpec(schema=agent.schema_name))
        validate_filter(conn, store.source, agent.filter)


def _agent(row: tuple[Any, ...]) -> SavedAgent:
    name, kind, source, storage, schema, text, params = row
    return SavedAgent(
        name=name, source_kind=kind, source=source, storage=storage, schema=schema, input=text, **params
    )


def get_agent(conn: psycopg.Connection[Any], owner: Principal | None, name: str) -> SavedAgent:
    """`owner`'s agent `name`; 3001 when it has none of that name (whoever else might)."""
    row = conn.execute(
        "select name, source_kind, source, storage, schema_name, input, params from agentdb.saved_agents"
        " where coalesce(owner_id, 0) = %s and name = %s",
        (_owner_key(owner), name),
    ).fetchone()
    if row is None:
        raise InvalidAgentId(f"unknown agent {name!r}", path="name")
    return _agent(row)


def _navigation(agent: RetrieveParams) -> dict[str, Any] | None:
    return None if agent.navigation is None else {"query_index": 0, **agent.navigation}


def check_steps(
    conn: psycopg.Connection[Any], owner: Principal | None, agent: SavedAgentIn, params: RetrieveParams
) -> None:
    """The generation and navigation steps as a run will need them: valid, with the tool and index they
    use (3007 at their path, 403 without the tool, 3010 for an unknown index), before anything is stored."""
    GenerationStep.parse(params.generation, path="generation")
    navigation = _navigation(params)
    if navigation is not None and agent.source is None:
        raise InvalidParamValue("a memory store has no indexes to navigate", path="navigation")
    if navigation is None:
        if params.max_internal_iterations:
            raise InvalidParamValue(
                "max_internal_iterations > 0 needs agentic navigation (navigation.selection 'agentic')",
                path="max_internal_iterations",
            )
        return
    options = NavigationOptions.parse(
        navigation, "navigation", queries=1, iterations=params.max_internal_iterations
    )
    if owner is not None:
        check_tool(owner, options.tool, path="navigation.strategy")
    assert agent.source is not None
    check_index(
        conn,
        agent.source,
        options.index,
        options.strategy,
        path="navigation.index",
        fields=owner.fields if owner is not None else None,
    )
    if options.links_index is not None:
        check_index(
            conn,
            agent.source,
            options.links_index,
            path="navigation.links_index",
            fields=owner.fields if owner is not None else None,
        )


def create_agent(conn: psycopg.Connection[Any], owner: Principal | None, spec: SavedAgentIn) -> SavedAgent:
    authorize(conn, owner, spec)
    params = RetrieveParams(**spec.model_dump(include=set(MUTABLE)))
    check_steps(conn, owner, spec, params)
    with conn.transaction():
        done = conn.execute(
            "insert into agentdb.saved_agents"
            " (owner_id, name, source_kind, source, storage, schema_name, input, params)"
            " values (%s, %s, %s, %s, %s, %s, %s, %s)"
            " on conflict ((coalesce(owner_id, 0)), name) do nothing returning name",
            (
                None if owner is None else owner.id,
                spec.name,
                spec.source_kind,
                spec.source,
                spec.storage,
                spec.schema_name,
                spec.input,
                Jsonb(params.model_dump()),
            ),
        ).fetchone()
    if done is None:
        raise Conflict(f"you already have an agent named {spec.name!r}", path="name")
    return get_agent(conn, owner, spec.name)


def list_agents(conn: psycopg.Connection[Any], owner: Principal | None) -> list[SavedAgent]:
    """`owner`'s agents, by name (only those it may still run: on sources it may read, or on its memory
    stores while it has the `memory` tool)."""
    rows = conn.execute(
        "select name, source_kind, source, storage, schema_name, input, params from agentdb.saved_agents"
        " where coalesce(owner_id, 0) = %s order by name",
        (_owner_key(owner),),
    ).fetchall()
    agents = [_agent(r) for r in rows]
    return [a for a in agents if owner is None or _may_run(owner, a)]


def _may_run(owner: Principal, agent: SavedAgent) -> bool:
    if agent.reads_memory:
        return "memory" in owner.tools
    return "search" in owner.tools and agent.source in owner.tables


def patch_agent(
    conn: psycopg.Connection[Any], owner: Principal | None, name: str, changes: dict[str, Any]
) -> SavedAgent:
    """Change mutable parameters; structural ones are 3006, a bad value (or filter) 3007, a filter on a
    field outside the owner's grant 403, and nothing changes."""
    current = get_agent(conn, owner, name)
    authorize(conn, owner, current.model_copy(update={"filter": None}))
    for key in changes:
        if key in STRUCTURAL:
            raise ParamNotMutable(f"{key!r} is structural: it is fixed when the agent is created", path=key)
        if key not in MUTABLE:
            raise InvalidParamValue(
                f"unknown parameter {key!r}; mutable ones: {', '.join(MUTABLE)}", path=key
            )
    merged = {**current.model_dump(include=set(MUTABLE)), **changes}
    params = parse_params(RetrieveParams, merged, path="")
    authorize(conn, owner, current.model_copy(update={"filter": params.filter}))
    check_steps(conn, owner, current, params)
    with conn.transaction():
        conn.execute(
            "update agentdb.saved_agents set params = %s, updated_at = now()"
            " where coalesce(owner_id, 0) = %s and name = %s",
            (Jsonb(params.model_dump()), _owner_key(owner), name),
        )
    return get_agent(conn, owner, name)


def delete_agent(conn: psycopg.Connection[Any], owner: Principal | None, name: str) -> None:
    gone = conn.execute(
        "delete from agentdb.saved_agents where coalesce(owner_id, 0) = %s and name = %s returning name",
        (_owner_key(owner), name),
    ).fetchone()
    if gone is None:
        raise InvalidAgentId(f"unknown agent {name!r}", path="name")


def retrieval_request(
    agent: SavedAgent,
    text: str,
    *,
    diagnostics: bool = False,
    variables: dict[str, str | int] | None = None,
) -> RetrievalRequest:
    """The POST /agents/retrieval request that running `agent` on `text` is: one query over its source (or
    its memory store, named with the run's `variables`) with its stored parameters (top_k is the limit), its
    generation step, and `text` as the query."""
    where: dict[str, Any] = (
        {"store": agent.storage, "schema": agent.schema_name, "vars": variables}
        if agent.reads_memory
        else {"table": agent.source}
    )
    query: dict[str, Any] = {
        **where,
        "retrieval_mode": agent.retrieval_mode,
        "filter": agent.filter,
        "limit": agent.top_k,
        "threshold": agent.threshold,
        "rrf_k": agent.rrf_k,
    }
    steps: dict[str, Any] = {}
    if agent.generation is not None:
        steps["generation"] = agent.generation
    navigation = _navigation(agent)
    if navigation is not None:
        steps["retrieval"] = {"navigation": navigation}
    return RetrievalRequest.model_validate(
        {
            "query": text,
            "queries": [query],
            "diagnostics": diagnostics,
            "steps": steps or None,
            "max_internal_iterations": agent.max_internal_iterations,
        }
    )


def agent_path(path: str) -> str:
    """A path in the equivalent retrieval request, as the path of the saved agent's field it came from."""
    path = path.removeprefix("queries[0].")
    for request_path, own in (
        ("table", "source"),
        ("store", "storage"),
        ("steps.generation", "generation"),
        ("steps.retrieval.navigation", "navigation"),
        ("generator", "generation.generator"),
        ("query", "input"),
    ):
        if path == request_path or path.startswith((request_path + ".", request_path + "[")):
            return own + path[len(request_path) :]
    return path


@contextmanager
def _agent_paths() -> Iterator[None]:
    try:
        yield
    except AgentDBError as exc:
        if exc.path:
            exc.path = agent_path(exc.path)
        raise


def run_agent(
    conn: psycopg.Connection[Any],
    caller: Principal | None,
    name: str,
    text: str,
    settings: Settings,
    *,
    diagnostics: bool = False,
    variables: dict[str, str | int] | None = None,
) -> RetrievalResponse:
    """Run `caller`'s agent `name` on `text` (its own `input` wins when set) through the retrieval
    pipeline, under the running caller's grants: its tool and table grant and the stored filter against
    its field grant are checked again now (authorize), and the pipeline reads with its field grant and row
    filter in its database role. An agent on a memory store reads the caller's store its `storage` names
    with `variables` (the store's record schema and the filter are checked against it now)."""
    agent = get_agent(conn, caller, name)
    authorize(conn, caller, agent)
    request = retrieval_request(agent, agent.input or text, diagnostics=diagnostics, variables=variables)
    with _agent_paths():
        plan = validate(conn, request, caller, settings)
        return respond(run(conn, request, caller, settings, plan=plan))
