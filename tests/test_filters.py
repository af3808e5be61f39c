"""Metadata filters: agentdb.compile_filter against a real PostgreSQL, checked with the Python oracle."""

from __future__ import annotations

import random
from typing import Any

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from agentdb.errors import InvalidParamValue
from agentdb.filters import compile_filter, validate_filter
from agentdb.sources import FieldSpec, Source, create_document_source
from tests.filter_oracle import filters, matches, sample_metadata

FIELDS = [
    FieldSpec(name="year", type="int"),
    FieldSpec(name="score", type="float"),
    FieldSpec(name="status", type="string"),
    FieldSpec(name="published", type="bool"),
    FieldSpec(name="tags", type="string_set"),
    FieldSpec(name="created", type="timestamp"),
    FieldSpec(name="rank", type="int", optional=False, default=3),
    FieldSpec(name="lang", type="string", optional=False, default="en"),
    FieldSpec(name="colors", type="string_set", optional=False, default=["red"]),
    FieldSpec(name="secret", type="string", filterable=False),
]
FIELD_DICTS = [f.model_dump() for f in FIELDS]
DOC_IDS = [f"d{i:03d}" for i in range(200)]
REF = "%(fp)s::jsonb"


def rows_matching(
    conn: psycopg.Connection[Any], table: str, id_column: str, predicate: str, params: list[Any]
) -> set[str]:
    query = sql.SQL("select {}::text from {} c where {}").format(
        sql.Identifier(id_column),
        sql.SQL(table),
        sql.SQL(predicate),
    )
    return {row[0] for row in conn.execute(query, {"fp": Jsonb(params)})}


@pytest.fixture
def docs(conn: psycopg.Connection[Any]) -> tuple[Source, dict[str, dict[str, Any]]]:
    """Source `t` with 200 rows of random metadata (some keys missing, some null), committed."""
    source = create_document_source(conn, "t", embedding_model="m", embedding_dim=3, fields=FIELDS)
    rng = random.Random(20240607)
    rows = {doc_id: sample_metadata(FIELD_DICTS, rng) for doc_id in DOC_IDS}
    with conn.cursor() as cur:
        cur.executemany(
            "insert into agentdb_docs.t (doc_id, chunk, title, text, metadata) values (%s, 0, '', %s, %s)",
            [(doc_id, f"text of {doc_id}", Jsonb(meta)) for doc_id, meta in rows.items()],
        )
    conn.commit()
    return source, rows


def expected(
    rows: dict[str, dict[str, Any]], filter: Any, fields: list[dict[str, Any]] = FIELD_DICTS
) -> set[str]:
    return {doc_id for doc_id, meta in rows.items() if matches(fields, filter, doc_id, meta)}


# Errors ---------------------------------------------------------------------------------------------

EQ = {"op": "eq", "lhs": {"knowledge": "year"}, "rhs": {"value": 1}}
# 15 nots around an eq: the eq sits at depth 16, the deepest allowed.
NOT_15: dict[str, Any] = EQ
for _ in range(15):
    NOT_15 = {"op": "not", "arg": NOT_15}
DEEP_CONDITION: dict[str, Any] = {"$eq": 1}
for _ in range(13):
    DEEP_CONDITION = {"$not": DEEP_CONDITION}

BAD_FILTERS: list[tuple[Any, str, str]] = [
    # type_mismatch
    (
        {"$or": [{"status": "a"}, {"year": "x"}]},
        "type_mismatch: at $or[1].year: cannot compare string with int",
        "filter.$or[1].year",
    ),
    (
        {"op": "and", "args": [EQ, {"op": "eq", "lhs": {"knowledge": "year"}, "rhs": {"value": "x"}}]},
        "type_mismatch: at args[1].rhs: cannot compare string with int",
        "filter.args[1].rhs",
    ),
    (
        {"conjuncts": [{"term": 1, "field": "status"}]},
        "type_mismatch: at conjuncts[0].term: cannot compare int with string",
        "filter.conjuncts[0].term",
    ),
    (
        {"year": {"$in": [1, True]}},
        "type_mismatch: at year.$in[1]: cannot compare bool with int",
        "filter.year.$in[1]",
    ),
    (
        {"created": "yesterday"},
        "type_mismatch: at created: cannot compare string with timestamp: expected an ISO 8601"
        " date-time such as 2020-01-01T00:00:00Z",
        "filter.created",
    ),
    (
        {"date_range": {"field": "created", "start": 5}},
        "type_mismatch: at date_range.start: cannot compare int with timestamp",
        "filter.date_range.start",
    ),
    (
        {"field": "status", "min": 1},
        'type_mismatch: at field: a numeric range needs an int or float field; "status" is string',
        "filter.field",
    ),
    (
        {"tags": {"$eq": 3}},
        "type_mismatch: at tags.$eq: cannot compare int with string_set",
        "filter.tags.$eq",
    ),
    ({"status": None}, "type_mismatch: at status: cannot compare null with string", "filter.status"),
    (
        {"ids": ["a", 1]},
        "type_mismatch: at ids[1]: cannot compare int with a document id (string)",
        "filter.ids[1]",
    ),
    # unknown_field / not_filterable
    ({"nope": 1}, 'unknown_field: at nope: unknown field "nope"', "filter.nope"),
    (
        {"conjuncts": [{"term": "a", "field": "nope"}]},
        'unknown_field: at conjuncts[0].field: unknown field "nope"',
        "filter.conjuncts[0].field",
    ),
    (
        {"op": "eq", "lhs": {"knowledge": "nope"}, "rhs": {"value": 1}},
        'unknown_field: at lhs: unknown field "nope"',
        "filter.lhs",
    ),
    ({"secret": "x"}, 'not_filterable: at secret: field "secret" is not filterable', "filter.secret"),
    (
        {"bool": {"must": [{"match_all": {}}, {"prefix": "x", "field": "secret"}]}},
        'not_filterable: at bool.must[1].field: field "secret" is not filterable',
        "filter.bool.must[1].field",
    ),
    (
        {"op": "in", "needle": {"knowledge": "secret"}, "haystack": {"value": ["x"]}},
        'not_filterable: at needle: field "secret" is not filterable',
        "filter.needle",
    ),
    # bad_operator
    ({"year": {"$foo": 1}}, 'bad_operator: at year.$foo: unknown operator "$foo"', "filter.year.$foo"),
    ({"$eq": 1}, 'bad_operator: at $eq: $eq needs a field: {"<field>": {"$eq": ...}}', "filter.$eq"),
    (
        {"op": "xor", "args": [EQ]},
        'bad_operator: at op: unknown op "xor": use and, or, not, eq, ne, lt, le, gt, ge or in',
        "filter.op",
    ),
    (
        {"term": "a", "field": "status", "boost": 2},
        'bad_operator: at boost: unexpected key "boost" in a term query',
        "filter.boost",
    ),
    (
        {"published": {"$gt": True}},
        'bad_operator: at published.$gt: $gt does not apply to bool field "published"',
        "filter.published.$gt",
    ),
    (
        {"op": "lt", "lhs": {"knowledge": "tags"}, "rhs": {"value": "a"}},
        'bad_operator: at op: lt does not apply to string_set field "tags"',
        "filter.op",
    ),
    (
        {"prefix": "a", "field": "year"},
        'bad_operator: at prefix: prefix does not apply to int field "year"',
        "filter.prefix",
    ),
    # bad_operand
    ({"year": {"$in": 3}}, "bad_operand: at year.$in: $in needs an array of values", "filter.year.$in"),
    (
        {"op": "eq", "lhs": {"knowledge": "year"}, "rhs": {"value": [1, 2]}},
        "bad_operand: at rhs: an array literal is only allowed as a list of values ($in, $nin, terms, ids or an in"
        " haystack)",
        "filter.rhs",
    ),
    (
        {"year": [1, 2]},
        "bad_operand: at year: an array literal is only allowed as the list of $in or $nin",
        "filter.year",
    ),
    (
        {"op": "in", "needle": {"knowledge": "year"}, "haystack": {"value": 3}},
        "bad_operand: at haystack: the haystack must be an array literal or a string_set field",
        "filter.haystack",
    ),
    (
        {"op": "eq", "lhs": {"knowledge": "year"}, "rhs": {"knowledge": "rank"}},
        "bad_operand: at rhs: compare a field with a value, not with another field",
        "filter.rhs",
    ),
    (
        {"op": "eq", "lhs": {"field": "year"}, "rhs": {"value": 1}},
        'bad_operand: at lhs: an operand is {"knowledge": "<field>"} or {"value": <literal>}',
        "filter.lhs",
    ),
    ({"op": "not"}, "bad_operand: at $: not needs arg", "filter"),
    (
        {"year": {"$exists": "yes"}},
        "bad_operand: at year.$exists: $exists takes true or false",
        "filter.year.$exists",
    ),
    (
        {"disjuncts": [{"match_all": {}}], "min": -1},
        "bad_operand: at min: min must be a non-negative integer",
        "filter.min",
    ),
    ([1, 2], "bad_operand: at $: expected a filter object, got array", "filter"),
    ("not json", "bad_operand: at $: not valid JSON", "filter"),
    ({"status": "a\x00b"}, "bad_operand: at $: unsupported Unicode escape sequence", "filter"),
    # empty
    ({"$and": []}, "empty: at $and: $and needs at least one filter", "filter.$and"),
    ({"op": "or", "args": []}, "empty: at args: or needs at least one filter", "filter.args"),
    (
        {"bool": {"must": {"conjuncts": []}}},
        "empty: at bool.must.conjuncts: conjuncts needs at least one filter",
        "filter.bool.must.conjuncts",
    ),
    ({"disjuncts": []}, "empty: at disjuncts: disjuncts needs at least one filter", "filter.disjuncts"),
    ({"year": {}}, "empty: at year: the condition has no operator", "filter.year"),
    # limits
    (
        {"op": "not", "arg": NOT_15},
        "too_deep: at " + ".".join(["arg"] * 16) + ": the filter is nested deeper than 16 levels",
        "filter." + ".".join(["arg"] * 16),
    ),
    # Operator syntax: objects, $and/$or elements, field conditions and field-level $not each nest one level.
    (
        {"$not": {"$and": [{"year": DEEP_CONDITION}]}},
        "too_deep: at $not.$and[0].year" + ".$not" * 13 + ": the filter is nested deeper than 16 levels",
        "filter.$not.$and[0].year" + ".$not" * 13,
    ),
    (
        {"op": "or", "args": [EQ] * 256},
        "too_many_nodes: at args[255]: the filter has more than 256 nodes",
        "filter.args[255]",
    ),
    (
        {"year": {"$in": list(range(1001))}},
        "too_many_items: at year.$in: $in has more than 1000 items",
        "filter.year.$in",
    ),
    (
        {"terms": ["a"] * 1001, "field": "status"},
        "too_many_items: at terms: terms has more than 1000 items",
        "filter.terms",
    ),
    (
        {"op": "in", "needle": {"knowledge": "year"}, "haystack": {"value": [1] * 1001}},
        "too_many_items: at haystack: in has more than 1000 items",
        "filter.haystack",
    ),
]


@pytest.mark.parametrize(
    ("filter", "message", "path"),
    BAD_FILTERS,
    ids=[m.split(":")[0] + "-" + str(i) for i, (_, m, _) in enumerate(BAD_FILTERS)],
)
def test_bad_filters_are_rejected_with_kind_path_and_message(
    conn: psycopg.Connection[Any], filter: Any, message: str, path: str
) -> None:
    source = create_document_source(conn, "t", embedding_model="m", embedding_dim=3, fields=FIELDS)
    with pytest.raises(InvalidParamValue) as info:
        validate_filter(conn, source, filter)
    error = info.value
    assert (error.code, error.name) == (3007, "InvalidParamValue")
    if message.endswith("not valid JSON"):
        assert error.message.startswith("filter." + message)
    else:
        assert error.message == "filter." + message
    assert error.path == path
    # The connection stays usable after a rejected filter.
    assert conn.execute("select 1").fetchone() == (1,)


def test_limits_are_inclusive(conn: psycopg.Connection[Any]) -> None:
    source = create_document_source(conn, "t", embedding_model="m", embedding_dim=3, fields=FIELDS)
    validate_filter(conn, source, NOT_15)
    validate_filter(conn, source, {"op": "or", "args": [EQ] * 255})
    validate_filter(conn, source, {"year": {"$in": list(range(1000))}})


def test_error_path_prefix_and_sql_error_shape(conn: psycopg.Connection[Any]) -> None:
    source = create_document_source(conn, "t", embedding_model="m", embedding_dim=3, fields=FIELDS)
    with pytest.raises(InvalidParamValue) as info:
        validate_filter(
            conn,
            source,
            {"conjuncts": [{"term": "a", "field": "nope"}]},
            path_prefix="queries[0].filter_query",
        )
    assert info.value.path == "queries[0].filter_query.conjuncts[0].field"
    with pytest.raises(InvalidParamValue) as info:
        validate_filter(conn, source, "[]", path_prefix="exclusion_query")
    assert info.value.path == "exclusion_query"
    assert info.value.message == "filter.bad_operand: at $: expected a filter object, got array"
    # From SQL: SQLSTATE ADB00 with the code, name and path as JSON detail.
    with pytest.raises(psycopg.Error) as raw:
        conn.execute(
            "select * from agentdb.compile_filter(%s, %s, '$1', 'c.doc_id')",
            (Jsonb(FIELD_DICTS), Jsonb({"year": "x"})),
        )
    assert raw.value.sqlstate == "ADB00"
    assert raw.value.diag.message_detail is not None
    assert orjson.loads(raw.value.diag.message_detail) == {
        "code": 3007,
        "name": "InvalidParamValue",
        "path": "filter.year",
    }
    conn.rollback()


# Compilation and semantics ----------------------------------------------------------------------------


@pytest.mark.parametrize("empty", [None, {}, "", "  "])
def test_empty_filters_compile_to_true(conn: psycopg.Connection[Any], empty: Any) -> None:
    source = create_document_source(conn, "t", embedding_model="m", embedding_dim=3, fields=FIELDS)
    assert compile_filter(conn, source, empty, REF) == ("true", [])
    row = conn.execute("select * from agentdb.compile_filter('[]', 'null', '$1', 'c.doc_id')").fetchone()
    assert row == ("true", [])


def test_semantics_on_known_rows(conn: psycopg.Connection[Any]) -> None:
    """Missing fields are false under comparison and true under negation; defaults; bool and range rules."""
    source = create_document_source(conn, "s", embedding_model="m", embedding_dim=3, fields=FIELDS)
    rows: dict[str, dict[str, Any]] = {
        "full": {"year": 5, "tags": ["red"], "status": "x"},
        "none": {},
        "null": {"year": None, "tags": None},
        "wrong": {"year": "5", "tags": "red"},
    }
    for doc_id, meta in rows.items():
        conn.execute(
            "insert into agentdb_docs.s (doc_id, chunk, text, metadata) values (%s, 0, 'x', %s)",
            (doc_id, Jsonb(meta)),
        )
    cases: list[tuple[Any, set[str]]] = [
        ({"year": 5}, {"full"}),
        ({"year": {"$ne": 4}}, {"full"}),
        ({"year": {"$nin": [4]}}, {"full"}),
        ({"$not": {"year": 4}}, set(rows)),
        ({"$not": {"year": 5}}, {"none", "null", "wrong"}),
        ({"year": {"$not": {"$gt": 9}}}, set(rows)),
        (
            {"op": "not", "arg": {"op": "lt", "lhs": {"knowledge": "year"}, "rhs": {"value": 100}}},
            {"none", "null", "wrong"},
        ),
        ({"bool": {"must_not": {"term": "red", "field": "tags"}}}, {"none", "null", "wrong"}),
        ({"year": {"$exists": False}}, {"none", "null", "wrong"}),
        ({"rank": 3}, set(rows)),  # the default stands in for a missing field
        ({"rank": {"$exists": False}}, set()),
        ({"colors": "red", "lang": {"$in": ["en"]}}, set(rows)),
        ({"year": 5.0}, {"full"}),  # int and float promote
        (
            {"op": "gt", "lhs": {"value": 6}, "rhs": {"knowledge": "year"}},
            {"full"},
        ),  # value op field is mirrored
        # should is optional beside must/filter, required (one) alone, unless minimum_should_match says otherwise
        (
            {"bool": {"must": {"term": 5, "field": "year"}, "should": {"term": "blue", "field": "tags"}}},
            {"full"},
        ),
        ({"filter": {"term": 5, "field": "year"}, "should": {"term": "blue", "field": "tags"}}, {"full"}),
        ({"should": [{"term": 4, "field": "year"}], "must_not": {"match_none": {}}}, set()),
        ({"should": [{"term": 5, "field": "year"}, {"term": "blue", "field": "tags"}]}, {"full"}),
        (
            {
                "bool": {
                    "must": {"match_all": {}},
                    "should": [{"term": 4, "field": "year"}],
                    "minimum_should_match": 1,
                }
            },
            set(),
        ),
        ({"bool": {"should": [{"term": 4, "field": "year"}], "minimum_should_match": 0}}, set(rows)),
        (
            {
                "disjuncts": [
                    {"term": 5, "field": "year"},
                    {"term": "x", "field": "status"},
                    {"term": "red", "field": "tags"},
                ],
                "min": 3,
            },
            {"full"},
        ),
        (
            {
                "disjuncts": [
                    {"term": 5, "field": "year"},
                    {"term": "y", "field": "status"},
                    {"term": "red", "field": "tags"},
                ],
                "min": 3,
            },
            set(),
        ),
        # Bleve defaults: inclusive_min true, inclusive_max false
        ({"field": "year", "min": 5, "max": 6}, {"full"}),
        ({"numeric_range": {"field": "year", "min": 4, "max": 5}}, set()),
        ({"numeric_range": {"field": "year", "min": 4, "max": 5, "inclusive_max": True}}, {"full"}),
        ({"field": "year", "min": 5, "inclusive_min": False}, set()),
        ({"ids": ["none", "nope"]}, {"none"}),
        (
            {
                "doc_id": {"ids": ["full"]},
            },
            {"full"},
        ),
    ]
    for filter, want in cases:
        predicate, params = compile_filter(conn, source, filter, REF)
        assert rows_matching(conn, "agentdb_docs.s", "doc_id", predicate, params) == want, filter
        assert expected(rows, filter) == want, filter


def test_predicate_runs_inside_plpgsql_with_a_bound_parameter(
    docs: tuple[Source, dict[str, dict[str, Any]]], conn: psycopg.Connection[Any]
) -> None:
    _, rows = docs
    conn.execute("""
        create function pg_temp.count_matching(f jsonb) returns bigint language plpgsql as $$
        declare pred text; prm jsonb; n bigint;
        begin
            select predicate, params into pred, prm
            from agentdb.compile_filter((select fields from agentdb.sources where name = 't'), f, '$1', 'c.doc_id');
            execute format('select count(*) from agentdb_docs.t c where %s', pred) into n using prm;
            return n;
        end $$""")
    for filter in (
        {"status": "alpha"},
        {"year": {"$gte": 5}, "tags": {"$in": ["red", "blue"]}},
        {"op": "not", "arg": {"op": "eq", "lhs": {"knowledge": "published"}, "rhs": {"value": True}}},
    ):
        count = conn.execute("select pg_temp.count_matching(%s)", (Jsonb(filter),)).fetchone()
        assert count == (len(expected(rows, filter)),)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_filters_match_the_oracle(
    docs: tuple[Source, dict[str, dict[str, Any]]], conn: psycopg.Connection[Any], data: st.DataObject
) -> None:
    source, rows = docs
    filter = data.draw(filters(FIELD_DICTS, DOC_IDS), label="filter")
    predicate, params = compile_filter(conn, source, filter, REF)
    got = rows_matching(conn, "agentdb_docs.t", "doc_id", predicate, params)
    assert got == expected(rows, filter), predicate


def test_random_filters_hit_a_meaningful_fraction_of_rows() -> None:
    """The generator draws values from the row pools: filters neither all match nothing nor everything."""
    rng = random.Random(7)
    rows = {doc_id: sample_metadata(FIELD_DICTS, rng) for doc_id in DOC_IDS}
    fractions = []

    @settings(max_examples=150, deadline=None, database=None)
    @given(filters(FIELD_DICTS, DOC_IDS))
    def collect(filter: dict[str, Any]) -> None:
        fractions.append(len(expected(rows, filter)) / len(rows))

    collect()
    some = [f for f in fractions if 0 < f < 1]
    assert len(some) > len(fractions) / 3


def test_equality_and_in_can_use_the_gin_index(conn: psycopg.Connection[Any]) -> None:
    source = create_document_source(conn, "big", embedding_model="m", embedding_dim=3, fields=FIELDS)
    conn.execute(
        "insert into agentdb_docs.big (doc_id, chunk, text, metadata)"
        " select 'd' || i, 0, 'x', jsonb_build_object('status', 's' || (i % 500), 'year', 2000 + i % 50,"
        " 'tags', jsonb_build_array('t' || (i % 300))) from generate_series(1, 5000) i"
    )
    conn.commit()
    conn.autocommit = True
    conn.execute("vacuum analyze agentdb_docs.big")  # also flushes the GIN pending list
    conn.execute("set enable_seqscan = off")
    for filter in (
        {"status": "s7"},
        {"year": 2003.0},
        {"tags": "t5"},
        {"status": {"$in": ["s1", "s2"]}},
        {"term": "s3", "field": "status"},
    ):
        predicate, params = compile_filter(conn, source, filter, REF)
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                sql.SQL("explain select doc_id from agentdb_docs.big c where {}").format(sql.SQL(predicate)),
                {"fp": Jsonb(params)},
            )
        )
        assert "Bitmap Index Scan on big_agentdb_meta" in plan, (filter, plan)
        count = conn.execute(
            sql.SQL("select count(*) from agentdb_docs.big c where {}").format(sql.SQL(predicate)),
            {"fp": Jsonb(params)},
        ).fetchone()
        assert count is not None and count[0] > 0


# Registered tables (fields that are columns) ------------------------------------------------------------

COLUMN_FIELDS = [
    {"name": "size", "type": "int", "optional": True, "default": None, "filterable": True, "column": "n"},
    {"name": "weight", "type": "float", "optional": True, "default": None, "filterable": True, "column": "x"},
    {
        "name": "status",
        "type": "string",
        "optional": True,
        "default": None,
        "filterable": True,
        "column": "s",
    },
    {
        "name": "published",
        "type": "bool",
        "optional": True,
        "default": None,
        "filterable": True,
        "column": "flag",
    },
    {
        "name": "tags",
        "type": "string_set",
        "optional": True,
        "default": None,
        "filterable": True,
        "column": "tags",
    },
    {
        "name": "created",
        "type": "timestamp",
        "optional": True,
        "default": None,
        "filterable": True,
        "column": "at",
    },
    {
        "name": "rank",
        "type": "int",
        "optional": False,
        "default": 3,
        "filterable": True,
        "column": 'we"ird col',
    },
]


@pytest.fixture
def items(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    """A plain table with typed columns (and one hostile column name), 80 random rows with NULLs."""
    conn.execute(
        "create table items (id int primary key, n bigint, x float8, s text, flag boolean, tags text[],"
        ' at timestamptz, "we""ird col" int, note text)'
    )
    rng = random.Random(11)
    rows: dict[str, dict[str, Any]] = {}
    for i in range(80):
        meta = sample_metadata(COLUMN_FIELDS, rng)
        if isinstance(meta.get("weight"), int):
            meta["weight"] = float(meta["weight"])
        rows[str(i)] = meta
        conn.execute(
            'insert into items (id, n, x, s, flag, tags, at, "we""ird col", note) values (%s, %s, %s, %s, %s, %s,'
            " %s::timestamptz, %s, 'n')",
            (
                i,
                meta.get("size"),
                meta.get("weight"),
                meta.get("status"),
                meta.get("published"),
                meta.get("tags"),
                meta.get("created"),
                meta.get("rank"),
            ),
        )
    conn.commit()
    return rows


def column_rows(conn: psycopg.Connection[Any], filter: Any) -> set[str]:
    row = conn.execute(
        "select predicate, params from agentdb.compile_filter(%s, %s, %s, %s)",
        (Jsonb(COLUMN_FIELDS), Jsonb(filter), REF, 'c."id"::text'),
    ).fetchone()
    assert row is not None
    return rows_matching(conn, "items", "id", row[0], row[1])


COLUMN_CASES: list[Any] = [
    {"size": 3},
    {"size": {"$gte": 2.5, "$lt": 7}},
    {"size": {"$in": [1, 2, 3]}, "status": {"$ne": "alpha"}},
    {"weight": {"$gt": 1}},
    {"status": {"$gt": "beta"}},
    {"prefix": "al", "field": "status"},
    {"status": {"$contains": "ph"}},
    {"published": False},
    {"$not": {"published": True}},
    {"tags": "red"},
    {"tags": {"$nin": ["red", "blue"]}},
    {"prefix": "g", "field": "tags"},
    {
        "date_range": {
            "field": "created",
            "start": "2020-01-02",
            "end": "2020-01-03T12:00:00+02:00",
            "inclusive_end": True,
        }
    },
    {"created": {"$in": ["2020-01-01T10:00:00Z"]}},
    {"rank": 3},
    {"rank": {"$exists": False}},
    {"size": {"$exists": False}},
    {"ids": ["1", "2", "79", "x"]},
    {
        "op": "or",
        "args": [
            {"op": "eq", "lhs": {"knowledge": "size"}, "rhs": {"value": 1}},
            {"op": "in", "needle": {"value": "green"}, "haystack": {"knowledge": "tags"}},
        ],
    },
    {
        "disjuncts": [
            {"term": 1, "field": "size"},
            {"term": True, "field": "published"},
            {"term": "red", "field": "tags"},
        ],
        "min": 2,
    },
]


@pytest.mark.parametrize("filter", COLUMN_CASES)
def test_column_fields_match_the_oracle(
    conn: psycopg.Connection[Any], items: dict[str, dict[str, Any]], filter: Any
) -> None:
    assert column_rows(conn, filter) == expected(items, filter, COLUMN_FIELDS)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_filters_on_columns_match_the_oracle(
    conn: psycopg.Connection[Any], items: dict[str, dict[str, Any]], data: st.DataObject
) -> None:
    filter = data.draw(filters(COLUMN_FIELDS, list(items)), label="filter")
    assert column_rows(conn, filter) == expected(items, filter, COLUMN_FIELDS)


def test_column_equality_stays_indexable(
    conn: psycopg.Connection[Any], items: dict[str, dict[str, Any]]
) -> None:
    conn.execute("create index on items (n)")
    conn.execute("set enable_seqscan = off")
    row = conn.execute(
        "select predicate, params from agentdb.compile_filter(%s, %s, %s, %s)",
        (Jsonb(COLUMN_FIELDS), Jsonb({"size": 4}), REF, 'c."id"::text'),
    ).fetchone()
    assert row is not None
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            sql.SQL("explain select id from items c where {}").format(sql.SQL(row[0])), {"fp": Jsonb(row[1])}
        )
    )
    assert "items_n_idx" in plan, plan


# Injection ----------------------------------------------------------------------------------------------

HOSTILE = [
    "'; drop table agentdb.sources; --",
    "$1",
    "%s",
    "%(fp)s",
    "\\",
    '" or 1=1 --',
    "é\u200b日本",
    "')) or ((true",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_field_names_are_unknown(conn: psycopg.Connection[Any], name: str) -> None:
    source = create_document_source(conn, "t", embedding_model="m", embedding_dim=3, fields=FIELDS)
    for filter in (
        {name: 1},
        {"term": "x", "field": name},
        {"op": "eq", "lhs": {"knowledge": name}, "rhs": {"value": 1}},
    ):
        with pytest.raises(InvalidParamValue) as info:
            validate_filter(conn, source, filter)
        kind = "bad_operator" if name.startswith("$") and filter == {name: 1} else "unknown_field"
        assert info.value.message.startswith(f"filter.{kind}: at ")


def test_hostile_values_match_nothing_and_break_nothing(
    docs: tuple[Source, dict[str, dict[str, Any]]], conn: psycopg.Connection[Any]
) -> None:
    source, _ = docs
    for value in HOSTILE:
        for filter in (
            {"status": value},
            {"status": {"$in": [value, value + "x"]}},
            {"prefix": value, "field": "status"},
            {"tags": {"$contains": value}},
            {"status": {"$gt": value, "$lt": value}},
            {"ids": [value]},
            {"op": "in", "needle": {"value": value}, "haystack": {"knowledge": "tags"}},
        ):
            predicate, params = compile_filter(conn, source, filter, REF)
            assert value not in predicate or value in REF
            assert rows_matching(conn, "agentdb_docs.t", "doc_id", predicate, params) == set(), filter
    assert conn.execute("select count(*) from agentdb.sources").fetchone() == (1,)


def test_hostile_names_in_the_schema_are_quoted(conn: psycopg.Connection[Any]) -> None:
    """The schema is trusted, but even odd field and column names are quoted, never spliced."""
    key = "we'ird\"key; --"
    fields = [{"name": key, "type": "string", "filterable": True, "column": None}]
    conn.execute("create table odd (doc_id text, metadata jsonb not null)")
    conn.execute("insert into odd values ('a', %s), ('b', %s)", (Jsonb({key: "v"}), Jsonb({key: "w"})))
    row = conn.execute(
        "select predicate, params from agentdb.compile_filter(%s, %s, %s, 'c.doc_id')",
        (Jsonb(fields), Jsonb({"$or": [{key: "v"}, {key: {"$gt": "v", "$ne": "x"}}]}), REF),
    ).fetchone()
    assert row is not None
    assert rows_matching(conn, "odd", "doc_id", row[0], row[1]) == {"a", "b"}
