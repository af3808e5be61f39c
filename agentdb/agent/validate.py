"""Validation of a retrieval request, and the Plan it yields: every check that can fail runs before any
query or model call (features and their models, tables, permissions, filters, projections)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from agentdb.agent.deepening import DeepeningOptions
from agentdb.agent.models import FullTextSearch, Legs, QuerySpec, RetrievalOptions, RetrievalRequest
from agentdb.agent.navigation.options import NavigationOptions
from agentdb.agent.navigation.sql import Scope
from agentdb.auth import Principal, check_fields, check_filter, check_table, check_tool
from agentdb.config import Settings
from agentdb.errors import AgentDBError, InvalidParamValue, parse_params
from agentdb.filters import validate_filter
from agentdb.generation import GenerationStep
from agentdb.indexes import check_index
from agentdb.llm import Usage, UsageMeter, resolve_model
from agentdb.memory import Store, StoreSpec, check_spec, get_store
from agentdb.sources import Source, get_source


@dataclass
class Plan:
    """What a validated request will do beyond retrieval, with its models resolved (no network yet)."""

    projections: list[list[str] | None]
    # The request's queries as they run: a memory store's query reads the source of its records (`table`).
    queries: list[QuerySpec] = field(default_factory=list)
    # Per query, the row filter its reads apply: the principal's, or none on the caller's own memory store.
    row_filters: list[dict[str, Any] | None] = field(default_factory=list)
    # Per query, what the client named: {"table": source} or {"store": the memory store's name}; hits and
    # steps show these, never the internal table of a store's records.
    targets: list[dict[str, str]] = field(default_factory=list)
    # Per query, its source as the catalog had it at validation (read once per request) and its legs.
    sources: list[Source] = field(default_factory=list)
    legs: list[Legs] = field(default_factory=list)
    expand_window: int = 1
    diagnostics: bool = False  # the request shows each query's diagnostics, output.results included
    deepening: DeepeningOptions | None = None
    judge: UsageMeter | None = None
    navigation: NavigationOptions | None = None
    navigator: UsageMeter | None = None
    generation: GenerationStep | None = None
    generator: UsageMeter | None = None
    meters: list[UsageMeter] = field(default_factory=list)

    def scope(self, conn: psycopg.Connection[Any], i: int) -> Scope:
        """Where query `i` reads: its source under its filters, the caller's row filter and projection."""
        spec = self.queries[i]
        return Scope(
            conn,
            spec.table,
            filter=spec.filter,
            filter_query=spec.filter_query,
            exclusion_query=spec.exclusion_query,
            row_filter=self.row_filters[i],
            fields=self.projections[i],
        )

    def usage(self) -> Usage:
        total = Usage()
        for meter in self.meters:
            total = total + meter.usage
        return total


def _features(request: RetrievalRequest, settings: Settings, plan: Plan) -> None:
    """Parse the optional steps and resolve their models; what is not supported is a clear 400, never a
    silent ignore."""
    options = (
        request.steps.retrieval
        if request.steps and request.steps.retrieval
        else RetrievalOptions.model_validate({})
    )
    if options.navigation is not None:
        plan.navigation = NavigationOptions.parse(
            options.navigation,
            "steps.retrieval.navigation",
            queries=len(request.queries),
            iterations=request.max_internal_iterations,
        )
        if plan.navigation.selection == "agentic":
            plan.navigator = UsageMeter(resolve_model(request.generator, settings, path="generator"))
            plan.meters.append(plan.navigator)
    elif request.max_internal_iterations:
        raise InvalidParamValue(
            "max_internal_iterations > 0 runs the model loop of agentic navigation: configure "
            "steps.retrieval.navigation with selection 'agentic', or use 0 for pipeline mode",
            path="max_internal_iterations",
        )
    plan.expand_window = options.expand_window
    if options.deepening is not None:
        plan.deepening = DeepeningOptions.parse(options.deepening, path="steps.retrieval.deepening")
        where = "steps.retrieval.deepening.generator" if plan.deepening.generator else "generator"
        plan.judge = UsageMeter(
            resolve_model(plan.deepening.generator or request.generator, settings, path=where)
        )
        plan.meters.append(plan.judge)
    if request.steps and request.steps.generation is not None:
        step = GenerationStep.parse(request.steps.generation, path="steps.generation")
        if step.enabled:
            step.check_query(request.query)
            where = "steps.generation.generator" if step.generator else "generator"
            plan.generation = step
            plan.generator = UsageMeter(
                resolve_model(step.generator or request.generator, settings, path=where)
            )
            plan.meters.append(plan.generator)


def _budget(request: RetrievalRequest, plan: Plan, settings: Settings) -> None:
    """The work budget of one request (config.Settings: max_results, max_expanded_chunks, max_nodes_read,
    max_start_keys): 3007 at the field that takes the request over it, with the setting that raises it."""

    def refuse(what: str, budget: int, path: str, setting: str) -> None:
        raise InvalidParamValue(
            f"{what}: over this server's budget of {budget} per request",
            path=path,
            hint=f"ask for less; an operator may raise {setting}",
        )

    total = 0
    for i, spec in enumerate(request.queries):
        total += spec.limit
        if total > settings.max_results:
            refuse(
                f"the queries ask for {total} results in all",
                settings.max_results,
                f"queries[{i}].limit",
                "AGENTDB_MAX_RESULTS",
            )
    if total * plan.expand_window > settings.max_expanded_chunks:
        refuse(
            f"expanding {total} results by {plan.expand_window} chunks reads {total * plan.expand_window}",
            settings.max_expanded_chunks,
            "steps.retrieval.expand_window",
            "AGENTDB_MAX_EXPANDED_CHUNKS",
        )
    navigation = plan.navigation
    if navigation is None or navigation.selection != "ranked":
        return
    where = "steps.retrieval.navigation"
    if navigation.max_nodes > settings.max_nodes_read:
        refuse(
            f"max_nodes {navigation.max_nodes}",
            settings.max_nodes_read,
            f"{where}.max_nodes",
            "AGENTDB_MAX_NODES_READ",
        )
    if navigation.start_nodes not in (None, "$roots", "$hits"):
        keys = len({k.strip() for k in navigation.start_nodes.split(",") if k.strip()})
        if keys > settings.max_start_keys:
            refuse(
                f"start_nodes names {keys} keys",
                settings.max_start_keys,
                f"{where}.start_nodes",
                "AGENTDB_MAX_START_KEYS",
            )


def validate(
    conn: psycopg.Connection[Any], request: RetrievalRequest, principal: Principal | None, settings: Settings
) -> Plan:
    """Every check that can fail before any query runs or any model is called: features and their models,
    tables, permissions, projections (a field grant narrows an unrestricted request)."""
    plan = Plan(projections=[], diagnostics=request.diagnostics)
    _features(request, settings, plan)
    _budget(request, plan, settings)
    projections = plan.projections
    for i, spec in enumerate(request.queries):
        if isinstance(spec.full_text_search, FullTextSearch) and spec.full_text_search.field not in (
            None,
            "text",
        ):
            raise InvalidParamValue(
                "a field-scoped full_text_search is not supported: the lexical index covers title and text together",
                path=f"queries[{i}].full_text_search.field",
            )
        fields = spec.fields
        own_store = spec.store is not None
        if own_store:
            named = _memory_store(conn, spec, principal, f"queries[{i}]")
            source = named.source
            plan.targets.append({"store": named.name})
        else:
            source = _source(conn, spec, principal, f"queries[{i}]")
            plan.targets.append({"table": source.name})
            if principal is not None:
                fields = check_fields(principal, spec.fields, path=f"queries[{i}].fields")
        for name in ("filter", "filter_query", "exclusion_query"):
            where = f"queries[{i}].{name}"
            if principal is not None and not own_store:
                check_filter(conn, principal, source, getattr(spec, name), path=where)
            elif request.stream or own_store:
                # Once a stream has started its errors are events; the plain answer gets the same error
                # from retrieval itself (with the same path), so only a stream compiles the filter twice.
                validate_filter(conn, source, getattr(spec, name), where)
        plan.queries.append(spec.model_copy(update={"table": source.name}) if own_store else spec)
        plan.sources.append(source)
        plan.legs.append(spec.legs(request.query))
        plan.row_filters.append(principal.row_filter if principal is not None and not own_store else None)
        navigation = plan.navigation
        if navigation is not None and navigation.query_index == i:
            where = "steps.retrieval.navigation"
            if principal is not None:
                check_tool(principal, navigation.tool, path=f"{where}.strategy")
            check_index(
                conn,
                source,
                navigation.index,
                navigation.strategy,
                path=f"{where}.index",
                fields=fields if principal is not None else None,
            )
            if navigation.links_index is not None:
                check_index(
                    conn,
                    source,
                    navigation.links_index,
                    path=f"{where}.links_index",
                    fields=fields if principal is not None else None,
                )
            if navigation.instruction_field is not None and not (
                fields is None or navigation.instruction_field in fields
            ):
                raise InvalidParamValue(
                    f"instruction_field {navigation.instruction_field!r} must be in queries[{i}].fields",
                    path=f"{where}.instruction_field",
                )
        projections.append(fields)
    if request.memory is not None:
        if principal is not None:
            check_tool(principal, "memory", path="memory")
        for i, store in enumerate(request.memory.stores):
            try:
                get_store(conn, store, principal=principal, variables=request.memory.vars)
            except AgentDBError as exc:
                exc.path = f"memory.stores[{i}]"
                raise
    return plan


def _source(
    conn: psycopg.Connection[Any], spec: QuerySpec, principal: Principal | None, where: str
) -> Source:
    """The source a query names in `table`, after the `search` tool and the table grant (403 at `table`,
    whether or not it exists)."""
    if not spec.table:
        raise InvalidParamValue(
            "give the source to search in `table` (or one of your memory stores in `store`)",
            path=f"{where}.table",
        )
    for name, value in (("schema", spec.schema_name), ("vars", spec.vars)):
        if value is not None:
            raise InvalidParamValue(
                f"`{name}` goes with `store` (a memory store), not `table`", path=f"{where}.{name}"
            )
    if principal is not None:
        check_tool(principal, "search")
        check_table(principal, spec.table, path=f"{where}.table")
    try:
        return get_source(conn, spec.table)
    except AgentDBError as exc:
        exc.path = f"{where}.table"
        raise


def _memory_store(
    conn: psycopg.Connection[Any], spec: QuerySpec, principal: Principal | None, where: str
) -> Store:
    """The caller's memory store that a query names in `store` (a name template over its `vars`), after the
    `memory` tool; its record schema must be the query's `schema` (3011 at `schema`). The plan's copy of the
    query names the source of its records in `table`: the pipeline reads it as any source, under the caller's
    role, which owns the store (no table grant or row filter: they are about sources)."""
    assert spec.store is not None
    if spec.table:
        raise InvalidParamValue(
            "give either `table` (a source) or `store` (a memory store), not both", path=f"{where}.store"
        )
    if spec.schema_name is None:
        raise InvalidParamValue(
            "a query over a memory store needs its record schema name", path=f"{where}.schema"
        )
    if principal is not None:
        check_tool(principal, "memory", path=f"{where}.store")
    expected = parse_params(StoreSpec, {"schema": spec.schema_name}, where)
    try:
        store = get_store(conn, spec.store, principal=principal, variables=spec.vars)
        check_spec(store, expected)  # 3011 at `schema`
    except AgentDBError as exc:
        exc.path = f"{where}.{exc.path or 'store'}"
        raise
    return store


__all__ = ["Plan", "validate"]
