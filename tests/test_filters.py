"""Metadata filters: agentdb_internal.compile_filter against a real PostgreSQL, checked with the Python oracle."""

from __future__ import annotations

import random
from collections.abc import Callable
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
from tests.filter_oracle import STRINGS, TIMESTAMPS, filters, matches, sample_metadata

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
IN_1000 = {"op": "in", "needle": {"knowledge": "year"}, "haystack": {"value": list(range(1000))}}
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
        {"op": "eq", "lhs": {"knowledge": "year"}, "rhs": {"value": 1}, "zz": 1, "aa": 2},
        'bad_operand: at aa: unexpected key "aa" in an eq node',
        "filter.aa",
    ),
    (
        {"op": "eq", "lhs": {"knowledge": "year", "value": 1}, "rhs": {"value": 1}},
        'bad_operand: at lhs: an operand is {"knowledge": "<field>"} or {"value": <literal>}',
        "filter.lhs",
    ),
    (
        {"op": "in", "needle": {"knowledge": "year"}, "haystack": {}},
        'bad_operand: at haystack: an operand is {"knowledge": "<field>"} or {"value": <literal>}',
        "filter.haystack",
    ),
    (
        {"op": "eq", "lhs": ["year"], "rhs": {"value": 1}},
        'bad_operand: at lhs: an operand is {"knowledge": "<field>"} or {"value": <literal>}',
        "filter.lhs",
    ),
    (
        {"year": {"$gt": 1, "x": 2}},
        'bad_operand: at year: an object value must hold operators such as {"$eq": ...}',
        "filter.year",
    ),
    (
        {"numeric_range": {"field": "year", "min": 1, "maximum": 2}},
        'bad_operator: at numeric_range.maximum: unexpected key "maximum" in a numeric range query',
        "filter.numeric_range.maximum",
    ),
    (
        {"bool": {"must": {"match_all": {}}, "should_not": []}},
        'bad_operator: at bool.should_not: unexpected key "should_not" in a bool query',
        "filter.bool.should_not",
    ),
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
    # The total of list items (10,000), reported at the list that crosses it, in every syntax.
    (
        {"$or": [{"year": {"$in": list(range(1000))}}] * 10 + [{"status": {"$nin": ["a"]}}]},
        "too_many_values: at $or[10].status.$nin: the filter has more than 10000 list items",
        "filter.$or[10].status.$nin",
    ),
    (
        {"conjuncts": [{"ids": DOC_IDS * 5}] * 10 + [{"terms": ["a"], "field": "status"}]},
        "too_many_values: at conjuncts[10].terms: the filter has more than 10000 list items",
        "filter.conjuncts[10].terms",
    ),
    (
        {
            "op": "or",
            "args": [IN_1000] * 9 + [{"op": "not", "arg": {"doc_id": {"ids": ["a"] * 1000}}}, IN_1000],
        },
        "too_many_values: at args[10].haystack: the filter has more than 10000 list items",
        "filter.args[10].haystack",
    ),
    # The size of the whole filter (1 MiB as jsonb; this one is 1,048,577 bytes).
    (
        {"status": "x" * (1048576 - 22 + 1)},
        "too_large: at $: the filter is larger than 1048576 bytes",
        "filter",
    ),
    # Bad items of a list are found by one set-based check, then named exactly as a single value is.
    (
        {"created": {"$in": ["2020-01-01", "2020-01-02T10:00:00+02:00", "2020-02-30", "x"]}},
        "type_mismatch: at created.$in[2]: cannot compare string with timestamp: expected an ISO 8601"
        " date-time such as 2020-01-01T00:00:00Z",
        "filter.created.$in[2]",
    ),
    (
        {"created": {"$nin": ["2020-01-01", 20200101]}},
        "type_mismatch: at created.$nin[1]: cannot compare int with timestamp",
        "filter.created.$nin[1]",
    ),
    (
        {"year": {"$in": [1, 2.5, 1e308]}},
        "type_mismatch: at year.$in[2]: the number is out of range for int",
        "filter.year.$in[2]",
    ),
    (
        {"score": {"$nin": [0.5, 0, -1e-301]}},
        "type_mismatch: at score.$nin[2]: the number is out of range for float",
        "filter.score.$nin[2]",
    ),
    (
        {"published": {"$in": [True, False, "x"]}},
        "type_mismatch: at published.$in[2]: cannot compare string with bool",
        "filter.published.$in[2]",
    ),
    (
        {"terms": ["a", None], "field": "tags"},
        "type_mismatch: at terms[1]: cannot compare null with string_set",
        "filter.terms[1]",
    ),
    (
        {"year": {"$in": [1, {"$eq": 2}]}},
        "bad_operand: at year.$in[1]: an object is not a value",
        "filter.year.$in[1]",
    ),
    # Integers beyond 64 bits cannot be sent as JSON by the driver: 3007 at their path, before SQL.
    ({"level": 10**30}, "bad_operand: at level: the integer does not fit in 64 bits", "filter.level"),
    (
        {"$or": [{"status": "a"}, {"year": -(2**63) - 1}]},
        "bad_operand: at $or[1].year: the integer does not fit in 64 bits",
        "filter.$or[1].year",
    ),
    (
        {"year": {"$in": [1, 2**64]}},
        "bad_operand: at year.$in[1]: the integer does not fit in 64 bits",
        "filter.year.$in[1]",
    ),
    (
        {"status": {"$in": {1, 2}}},
        "bad_operand: at $: not serialisable as JSON: Type is not JSON serializable: set",
        "filter",
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
    validate_filter(conn, source, {"$or": [{"year": {"$in": list(range(1000))}}] * 10})
    validate_filter(conn, source, {"status": "x" * (1048576 - 22)})  # 1,048,576 bytes as jsonb
    # The integers the driver can send (orjson's range); the compiler compares them as numbers.
    for big in (2**64 - 1, -(2**63)):
        validate_filter(conn, source, {"year": big, "score": {"$in": [big]}})


def test_integer_beyond_64_bits_is_reported_with_the_path_prefix(conn: psycopg.Connection[Any]) -> None:
    source = create_document_source(conn, "t", embedding_model="m", embedding_dim=3, fields=FIELDS)
    with pytest.raises(InvalidParamValue) as info:
        compile_filter(
            conn, source, {"bool": {"must": [{"term": 10**20, "field": "year"}]}}, REF, "queries[0].filter"
        )
    assert (info.value.code, info.value.path) == (3007, "queries[0].filter.bool.must[0].term")
    assert (
        info.value.message == "filter.bad_operand: at bool.must[0].term: the integer does not fit in 64 bits"
    )
    # As JSON text (Tryll's string filters) such a number is read as a float and compared as a number.
    assert compile_filter(conn, source, '{"year": 100000000000000000000}', REF)[1] == [{"year": 1e20}]


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
            "select * from agentdb_internal.compile_filter(%s, %s, '$1', 'c.doc_id')",
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
    row = conn.execute(
        "select * from agentdb_internal.compile_filter('[]', 'null', '$1', 'c.doc_id')"
    ).fetchone()
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
            from agentdb_internal.compile_filter((select fields from agentdb.sources where name = 't'), f, '$1', 'c.doc_id');
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


# The value a filter fixes (tenant routing) -------------------------------------------------------------------


def _fixed_value(conn: psycopg.Connection[Any], filter: Any, field: str = "status") -> str | None:
    row = conn.execute(
        "select agentdb_internal.filter_fixed_value(s.fields, %s, %s) from agentdb.sources s where s.name = 't'",
        (Jsonb(filter), field),
    ).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize(
    ("filter", "fixed"),
    [
        ({"status": "a"}, "a"),
        ({"status": {"$eq": "a"}}, "a"),
        ({"status": {"$in": ["a"]}}, "a"),
        ({"status": {"$in": ["a", "a"]}}, "a"),
        ({"status": "a", "year": 1}, "a"),
        ({"$and": [{"year": 1}, {"$and": [{"status": {"$in": ["a"]}}]}]}, "a"),
        ({"$or": [{"status": "a"}, {"$and": [{"status": {"$in": ["a"]}}, {"year": 2}]}]}, "a"),
        ({"status": {"$in": ["a", "b"]}}, None),
        ({"status": {"$nin": ["a"]}}, None),
        ({"status": {"$ne": "a"}}, None),
        ({"$not": {"status": "a"}}, None),
        ({"$or": [{"status": "a"}, {"status": "b"}]}, None),
        ({"$or": [{"status": "a"}, {"year": 1}]}, None),
        ({"lang": "a"}, None),  # another field
        ({"year": 1}, None),
    ],
)
def test_the_value_a_filter_fixes(conn: psycopg.Connection[Any], filter: Any, fixed: str | None) -> None:
    """An equality on the field, an `$in` of one value, a conjunction holding one, or a disjunction whose every
    term fixes the same value fix it; a negation, two values or another field do not."""
    create_document_source(conn, "t", embedding_model="m", embedding_dim=3, fields=FIELDS)
    assert _fixed_value(conn, filter) == fixed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_fixed_value_holds_on_every_row_the_filter_keeps(
    docs: tuple[Source, dict[str, dict[str, Any]]], conn: psycopg.Connection[Any], data: st.DataObject
) -> None:
    """Whatever value a random filter is said to fix, every row it keeps has that value (a read routed by it to
    one tenant's shard misses no row); with an equality ANDed before it, or a disjunction of that and an `$in`
    of the same value, a value is always fixed."""
    _, rows = docs
    inner = data.draw(filters(FIELD_DICTS, DOC_IDS), label="filter")
    value = data.draw(st.sampled_from(STRINGS), label="value")
    shape = data.draw(st.sampled_from(["alone", "and", "or"]), label="shape")
    filter = {
        "alone": inner,
        "and": {"$and": [{"status": value}, inner]},
        "or": {"$or": [{"$and": [{"status": value}, inner]}, {"status": {"$in": [value, value]}}]},
    }[shape]
    fixed = _fixed_value(conn, filter)
    assert all(rows[doc_id].get("status") == fixed for doc_id in expected(rows, filter)) or fixed is None
    if shape != "alone":
        assert fixed is not None


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


# The largest filter, and the cost of compiling -------------------------------------------------------------


def _padded(pool: list[Any], filler: Callable[[int], Any], n: int = 1000) -> list[Any]:
    """`pool` (values the rows hold) followed by fillers that match nothing, `n` items in all."""
    return pool + [filler(i) for i in range(n - len(pool))]


def largest_filter(*, extra_node: bool = False, extra_item: bool = False, extra_level: bool = False) -> Any:
    """A filter at every limit at once, in the three syntaxes nested in each other: 256 nodes, 10,000 list
    items, depth 16; each `extra_*` goes one over one limit."""
    chain: dict[str, Any] = {
        "op": "in",
        "needle": {"knowledge": "year"},
        "haystack": {"value": _padded([0, 2, 4, 6], lambda i: 1000 + i)},
    }
    for _ in range(15 if extra_level else 14):  # an even number keeps the leaf's sense; it sits at depth 16
        chain = {"op": "not", "arg": chain}
    lists: list[Any] = [  # 15 nodes, 9,000 items
        {"terms": _padded(["alpha", "émile", 'say "hi"', ""], lambda i: f"none {i}"), "field": "status"},
        {"ids": _padded(DOC_IDS[:40], lambda i: f"x{i}")},
        {"tags": {"$in": _padded(["x'y"], lambda i: f"t{i}")}, "score": {"$nin": _padded([0.25], float)}},
        {
            "bool": {
                "must": [
                    {"created": {"$in": _padded(TIMESTAMPS[:3], lambda i: f"2019-01-01T00:00:{i % 60:02d}Z")}}
                ],
                "must_not": {"lang": {"$in": _padded(["fr"], lambda i: f"l{i}")}},
            }
        },
        {"op": "in", "needle": {"knowledge": "rank"}, "haystack": {"value": _padded([7], lambda i: -1 - i)}},
        {"colors": {"$nin": _padded(["red"], lambda i: f"c{i}")}},
        {"published": {"$in": [True] * 1000}},
    ]
    fillers: list[Any] = [{"term": 1000 + i, "field": "year"} for i in range(224 + extra_node)]
    if extra_item:
        fillers[7] = {"terms": ["one more"], "field": "status"}
    # root, chain (15), disjuncts (1), lists (15), fillers (224): 256 nodes
    return {"op": "and", "args": [chain, {"disjuncts": lists + fillers}]}


def test_the_largest_filter_compiles_and_matches_the_oracle(
    docs: tuple[Source, dict[str, dict[str, Any]]], conn: psycopg.Connection[Any]
) -> None:
    source, rows = docs
    filter = largest_filter()
    predicate, params = compile_filter(conn, source, filter, REF)
    want = expected(rows, filter)
    assert 0 < len(want) < len(rows)
    assert rows_matching(conn, "agentdb_docs.t", "doc_id", predicate, params) == want
    # It is at every limit: one more node, list item or level is rejected.
    for over, kind, path in (
        ({"extra_node": True}, "too_many_nodes", "filter.args[1].disjuncts[231]"),
        ({"extra_item": True}, "too_many_values", "filter.args[1].disjuncts[14].terms"),
        ({"extra_level": True}, "too_deep", "filter.args[0]" + ".arg" * 15),
    ):
        with pytest.raises(InvalidParamValue) as info:
            validate_filter(conn, source, largest_filter(**over))
        assert info.value.message.startswith(f"filter.{kind}: "), info.value.message
        assert info.value.path == path


def _plpgsql_calls(conn: psycopg.Connection[Any], filter: Any) -> int:
    """The PL/pgSQL function calls one compile makes (deterministic, unlike time): counted by the statistics
    collector within one transaction, before and after."""
    count = "select coalesce(sum(calls), 0) from pg_stat_xact_user_functions where schemaname = 'agentdb'"
    with conn.transaction():
        conn.execute("set local track_functions = 'pl'")
        before = conn.execute(count).fetchone()
        conn.execute(
            "select * from agentdb_internal.compile_filter(%s, %s, '$1', 'c.doc_id')",
            (Jsonb(FIELD_DICTS), Jsonb(filter)),
        ).fetchone()
        after = conn.execute(count).fetchone()
    assert before is not None and after is not None
    return int(after[0] - before[0])


def test_compile_work_is_linear(conn: psycopg.Connection[Any]) -> None:
    """A deterministic stand-in for time: value lists of every type cost no function call per item, and each
    node costs the same number of calls however many there are. (Copying is the other way to go quadratic;
    bench/filter_compile.py times the largest filters and the growth curves.)"""
    if conn.execute("select rolsuper from pg_roles where rolname = current_user").fetchone() != (True,):
        pytest.skip("track_functions needs a superuser")

    def lists(n: int) -> dict[str, Any]:
        return {
            "year": {"$in": list(range(n))},
            "status": {"$nin": [f"s{i}" for i in range(n)]},
            "created": {"$in": [f"2020-01-01T00:00:{i % 60:02d}Z" for i in range(n)]},
            "tags": {"$in": [f"t{i}" for i in range(n)]},
            "published": {"$in": [i % 2 == 0 for i in range(n)]},
            "rank": {"$in": list(range(5, 5 + n))},
            "$or": [{"ids": [f"d{i}" for i in range(n)]}, {"terms": list(range(n)), "field": "score"}],
        }

    assert _plpgsql_calls(conn, lists(1000)) == _plpgsql_calls(conn, lists(1))

    def nodes(n: int) -> dict[str, Any]:
        return {
            "$and": [
                {"op": "or", "args": [EQ] * n},
                {"disjuncts": [{"term": "a", "field": "status"}] * n},
                {"$or": [{"year": {"$gt": 1}}] * n},
            ]
        }

    calls = [_plpgsql_calls(conn, nodes(n)) for n in (5, 10, 20, 40)]
    steps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert steps == [steps[0], 2 * steps[0], 4 * steps[0]], calls


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
        assert "Bitmap Index Scan on big_metadata_idx" in plan, (filter, plan)
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
        "select predicate, params from agentdb_internal.compile_filter(%s, %s, %s, %s)",
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
        "select predicate, params from agentdb_internal.compile_filter(%s, %s, %s, %s)",
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


def test_fields_named_like_query_keys(conn: psycopg.Connection[Any]) -> None:
    """A key that is also a field name is a field (operator syntax), unless another query key is present."""
    fields = [
        {"name": "filter", "type": "string", "filterable": True, "column": None},
        {"name": "must", "type": "int", "filterable": True, "column": None},
    ]
    conn.execute("create table named (doc_id text, metadata jsonb not null)")
    conn.execute(
        "insert into named values ('a', %s), ('b', %s)",
        (Jsonb({"filter": "x", "must": 1}), Jsonb({"filter": "y", "must": 2})),
    )

    def run(filter: Any) -> set[str]:
        row = conn.execute(
            "select predicate, params from agentdb_internal.compile_filter(%s, %s, %s, 'c.doc_id')",
            (Jsonb(fields), Jsonb(filter), REF),
        ).fetchone()
        assert row is not None
        return rows_matching(conn, "named", "doc_id", row[0], row[1])

    assert run({"filter": "x"}) == {"a"}
    assert run({"must": {"$gt": 1}, "filter": {"$ne": "z"}}) == {"b"}
    assert run({"term": "y", "field": "filter"}) == {"b"}
    assert run({"bool": {"must": {"must": 1}}}) == {"a"}
    with pytest.raises(psycopg.Error) as info:
        run({"filter": "x", "nope": 1})  # an operator object: the unknown key is an unknown field
    assert info.value.diag.message_primary == 'filter.unknown_field: at nope: unknown field "nope"'
    conn.rollback()


def test_hostile_names_in_the_schema_are_quoted(conn: psycopg.Connection[Any]) -> None:
    """The schema is trusted, but even odd field and column names are quoted, never spliced."""
    key = "we'ird\"key; --"
    fields = [{"name": key, "type": "string", "filterable": True, "column": None}]
    conn.execute("create table odd (doc_id text, metadata jsonb not null)")
    conn.execute("insert into odd values ('a', %s), ('b', %s)", (Jsonb({key: "v"}), Jsonb({key: "w"})))
    row = conn.execute(
        "select predicate, params from agentdb_internal.compile_filter(%s, %s, %s, 'c.doc_id')",
        (Jsonb(fields), Jsonb({"$or": [{key: "v"}, {key: {"$gt": "v", "$ne": "x"}}]}), REF),
    ).fetchone()
    assert row is not None
    assert rows_matching(conn, "odd", "doc_id", row[0], row[1]) == {"a", "b"}
