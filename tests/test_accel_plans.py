"""The accelerator's kept statements (ext/agentdb_accel_plans.c): agentdb.retrieve executes its statement through
agentdb_accel.execute_cached, prepared once per backend, on every mode; its answers are those of the statement
planned each call (agentdb.plan_cache = 'off'), through everything a kept plan depends on: another principal's role
under row-level security, a policy changed, a source dropped and created again under its name, a column added, the
migrations run again, a search_path change, a rolled-back table; an error leaves no broken statement behind; and the
table of statements stays within its bound.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from agentdb.auth import create_principal, principal_scope
from agentdb.db.migrate import migrate
from agentdb.retrieval import retrieve
from agentdb.sources import create_document_source
from agentdb.sources.ddl import drop_source
from tests.test_accel import assert_same
from tests.test_blocks import DIM, FIELDS, WORDS, _copy, _rows

QUERY = " ".join(WORDS[:4])
MAX_PLANS = 64  # agentdb_accel_plans.c


def _cache(conn: psycopg.Connection[Any], on: bool) -> None:
    conn.execute("select set_config('agentdb.plan_cache', %s, false)", ("" if on else "off",))


def _executions(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("select coalesce(sum(executions), 0) from agentdb_accel.cached_plans()").fetchone()
    return int(row[0]) if row else 0


def _vector(rng: random.Random) -> np.ndarray:
    return np.array([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)


def _ask(conn: psycopg.Connection[Any], principal: Any, name: str, **ask: Any) -> list[Any]:
    with principal_scope(conn, principal) if principal else contextlib.nullcontext(conn) as c:
        return [(h.id, h.chunk, h.score, h.rank_sparse) for h in retrieve(c, name, QUERY, **ask).hits]


def both(conn: psycopg.Connection[Any], principal: Any, name: str, **ask: Any) -> list[Any]:
    """The answer with the kept statement, which must have served it, and the same answer planned afresh."""
    _cache(conn, True)
    before = _executions(conn)
    cached = _ask(conn, principal, name, **ask)
    assert _executions(conn) == before + 1, "the kept statement served the retrieve"
    _cache(conn, False)
    fresh = _ask(conn, principal, name, **ask)
    assert _executions(conn) == before + 1, "agentdb.plan_cache = 'off' plans the statement afresh"
    _cache(conn, True)
    assert_same(cached, fresh)
    return cached


ASKS: list[dict[str, Any]] = [
    {"mode": "lexical"},
    {"mode": "lexical", "filter": {"year": {"$gte": 3}}},
    {"mode": "dense", "threshold": 0.0},
    {"mode": "hybrid", "threshold": 0.0},
    {"mode": "hybrid", "threshold": 0.0, "fusion": "convex", "alpha": 0.3, "group_by_doc": True},
    {
        "mode": "hybrid",
        "threshold": 0.0,
        "top_k": 100,
        "filter": {"status": {"$in": ["alpha", "beta", "gamma"]}},
    },
]


@pytest.fixture
def source(conn: psycopg.Connection[Any]) -> random.Random:
    create_document_source(
        conn, "blk", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
    )
    rng = random.Random(40)
    for n in (300, 200):
        _copy(conn, _rows(rng, n), names=("blk",))
    return rng


def test_every_mode_executes_a_kept_statement(conn: psycopg.Connection[Any], source: random.Random) -> None:
    """Each shape of request is prepared once and executed again after (more than the five custom plans before
    PostgreSQL weighs a generic one for a filtered shape), with the answers of the statement planned each call."""
    v = _vector(source)
    for _ in range(8):
        for ask in ASKS:
            assert both(conn, None, "blk", query_embedding=v, **ask)
    kept = conn.execute("select statement, executions from agentdb_accel.cached_plans()").fetchall()
    assert len(kept) == len(ASKS)
    assert all(n == 8 for _, n in kept)
    # Unfiltered statements are planned once, generically; filtered ones (two of ASKS) as plan_cache_mode chooses,
    # which plans the first five executions for their values.
    plans = conn.execute(
        "select count(*) filter (where custom_plans = 0 and generic_plan),"
        " count(*) filter (where custom_plans >= 5) from agentdb_accel.cached_plans()"
    ).fetchone()
    assert plans == (len(ASKS) - 2, 2)


def test_the_sql_path_plans_afresh(conn: psycopg.Connection[Any], source: random.Random) -> None:
    """agentdb.lexical_path = 'sql' (AGENTDB_LEXICAL_PATH=sql) takes PL/pgSQL's EXECUTE, as on a server
    without the extension."""
    conn.execute("set agentdb.lexical_path = 'sql'")
    assert not conn.execute("select agentdb_internal.plans_cached()").fetchone()[0]  # type: ignore[index]
    retrieve(conn, "blk", QUERY, mode="lexical")
    assert _executions(conn) == 0


def test_principals_one_after_another_and_a_policy_added(
    conn: psycopg.Connection[Any], source: random.Random, drop_principals: None
) -> None:
    """Two principals with the same field grant share a statement's text; their row filters (row-level
    security) differ, so the kept plan is planned again for each role: each sees its own rows, as planned
    afresh. A policy changed on the table is in force at the next execution."""
    low, _ = create_principal(conn, "low", tables=["blk"], row_filter={"year": {"$lt": 3}})
    high, _ = create_principal(conn, "high", tables=["blk"], row_filter={"year": {"$gte": 3}})
    v = _vector(source)
    seen: dict[str, set[str]] = {"low": set(), "high": set()}
    for ask in ASKS:
        for principal in (low, high, low, high, None, low):
            got = both(conn, principal, "blk", query_embedding=v, **ask)
            if principal is not None:
                seen[principal.name] |= {h[0] for h in got}
    assert seen["low"] and seen["high"] and not seen["low"] & seen["high"]
    # one statement a shape for the application and one for both principals: they share it
    statements = conn.execute("select count(*) from agentdb_accel.cached_plans()").fetchone()
    assert statements == (2 * len(ASKS),)
    # The role's own policy on the table, narrowed to nothing and restored (the dense leg reads the table).
    dense = {"mode": "dense", "query_embedding": v, "threshold": 0.0, "top_k": 1000}
    visible = {h[0] for h in both(conn, high, "blk", **dense)}
    policy, qual = conn.execute(
        "select policyname, qual from pg_policies where schemaname = 'agentdb_docs' and tablename = 'blk'"
        " and roles = array[%s::name]",
        (high.role,),
    ).fetchone() or ("", "")
    alter = "alter policy {} on agentdb_docs.blk using ({})"
    conn.execute(sql.SQL(alter).format(sql.Identifier(policy), sql.SQL("false")))
    assert visible and both(conn, high, "blk", **dense) == []
    conn.execute(sql.SQL(alter).format(sql.Identifier(policy), sql.SQL(qual)))  # type: ignore[arg-type]
    assert {h[0] for h in both(conn, high, "blk", **dense)} == visible
    assert conn.execute("select count(*) from agentdb_accel.cached_plans()").fetchone() == statements


def test_a_source_created_again_a_column_added_and_migrations_run_again(
    conn: psycopg.Connection[Any], source: random.Random
) -> None:
    """The kept statement reads the source table of its name as it is now: dropped and created again with
    other chunks, with a column added, after the migrations replaced agentdb's functions."""
    v = _vector(source)
    first = {h[0] for h in both(conn, None, "blk", mode="hybrid", query_embedding=v, threshold=0.0)}
    drop_source(conn, "blk")
    create_document_source(
        conn, "blk", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
    )
    _copy(conn, _rows(source, 200), names=("blk",))
    second = {h[0] for h in both(conn, None, "blk", mode="hybrid", query_embedding=v, threshold=0.0)}
    assert second and not first & second
    conn.execute("alter table agentdb_docs.blk add column agentdb_test_extra int default 7")
    assert {h[0] for h in both(conn, None, "blk", mode="hybrid", query_embedding=v, threshold=0.0)} == second
    with psycopg.connect(conn.info.dsn) as other:
        migrate(other)
    assert {h[0] for h in both(conn, None, "blk", mode="hybrid", query_embedding=v, threshold=0.0)} == second


def _run(conn: psycopg.Connection[Any], statement: str, *args: Any) -> Any:
    """The one value of `statement` run by execute_cached with `args` ((type, value) pairs, one or more)."""
    marks = sql.SQL("").join(sql.SQL(", %s::{}").format(sql.Identifier(t)) for t, _ in args)
    row = conn.execute(
        sql.SQL("select * from agentdb_accel.execute_cached(%s, false{}) as t(x text)").format(marks),
        (statement, *(v for _, v in args)),
    ).fetchone()
    return row[0] if row else None


def _kept(conn: psycopg.Connection[Any], statement: str) -> Any:
    return conn.execute(
        "select executions, valid from agentdb_accel.cached_plans() where statement = %s", (statement,)
    ).fetchone()


def test_errors_leave_no_broken_statement(conn: psycopg.Connection[Any]) -> None:
    """A statement that fails to prepare is not kept; one that fails while executing stays kept and runs next
    time; a statement kept for a table created in a transaction that rolled back reads the table created
    after under that name; the result's columns must be the statement's."""
    missing = "select count(*)::text from agentdb_test_t where $1"
    with pytest.raises(psycopg.errors.UndefinedTable):
        _run(conn, missing, ("bool", True))
    assert _kept(conn, missing) is None
    with pytest.raises(psycopg.errors.SyntaxError):
        _run(conn, "selec $1", ("int4", 1))
    divide = "select (10 / $1)::text"
    with pytest.raises(psycopg.errors.DivisionByZero):
        _run(conn, divide, ("int4", 0))
    assert _kept(conn, divide) is not None
    assert _run(conn, divide, ("int4", 5)) == "2"

    with conn.transaction():
        conn.execute("create table agentdb_test_t (a int)")
        conn.execute("insert into agentdb_test_t select generate_series(1, 3)")
        assert _run(conn, missing, ("bool", True)) == "3"
        raise psycopg.Rollback()
    with pytest.raises(psycopg.errors.UndefinedTable):
        _run(conn, missing, ("bool", True))
    conn.execute("create table agentdb_test_t (a text)")
    conn.execute("insert into agentdb_test_t values ('x')")
    assert _run(conn, missing, ("bool", True)) == "1"

    with pytest.raises(psycopg.errors.DatatypeMismatch):
        conn.execute("select * from agentdb_accel.execute_cached('select $1', false, 1) as t(x text)")
    with pytest.raises(psycopg.errors.CardinalityViolation):
        conn.execute(
            "select * from agentdb_accel.execute_cached('select $1 where false', false, 'x'::text) as t(x text)"
        )


def test_search_path_chooses_the_table(conn: psycopg.Connection[Any]) -> None:
    """The same text under another search_path reads the table that search_path finds."""
    for schema, n in (("agentdb_test_a", 1), ("agentdb_test_b", 2)):
        conn.execute(sql.SQL("create schema {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL("create table {}.t as select generate_series(1, %s) as a").format(sql.Identifier(schema)),
            (n,),
        )
    statement = "select count(*)::text from t where $1"
    for schema, n in (("agentdb_test_a", 1), ("agentdb_test_b", 2), ("agentdb_test_a", 1)):
        conn.execute(sql.SQL("set search_path = {}, public").format(sql.Identifier(schema)))
        assert _run(conn, statement, ("bool", True)) == str(n)
    conn.execute("reset search_path")


def test_the_table_is_bounded(conn: psycopg.Connection[Any]) -> None:
    """Beyond MAX_PLANS statements the least recently executed ones are dropped."""
    first = "select 'first' || $1"
    _run(conn, first, ("text", ""))
    for i in range(MAX_PLANS + 10):
        assert _run(conn, f"select '{i}' || $1", ("text", "")) == str(i)
        if i % 8 == 0:
            _run(conn, first, ("text", ""))  # recently executed: kept
    kept = [s for (s,) in conn.execute("select statement from agentdb_accel.cached_plans()").fetchall()]
    assert len(kept) == MAX_PLANS
    assert first in kept and "select '0' || $1" not in kept
    assert kept[0] == f"select '{MAX_PLANS + 9}' || $1"
