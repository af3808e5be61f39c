"""Generated hostile requests against every kind of route (real app, real database, real embedder): huge
integers, lone surrogates, NUL characters, deep nesting and big arrays, placed anywhere in a request, sent
with any Content-Type, and work budgets from nothing to far beyond the server's. None may produce a 500;
every refusal is the error envelope with a code and a name; a body whose type a browser may post across
sites is a 415 wherever it goes."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentdb.api import create_app
from agentdb.config import Settings

CASES = 2000

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
hostile_text = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.one_of(surrogates, st.just("\x00"), st.characters()), max_size=20),
    st.sampled_from(["backup", "wal", "acme", "level", "tenant", "$and", "\x00", "\ud800", "\udfff"]),
)
hostile_int = st.one_of(
    st.integers(-5, 5),
    st.integers(min_value=2**63 - 2, max_value=2**200),
    st.integers(min_value=-(2**200), max_value=-(2**63) + 2),
)
leaf = st.one_of(hostile_text, hostile_int, st.floats(), st.booleans(), st.none())
deep = st.integers(20, 700).flatmap(lambda depth: leaf.map(lambda value: _nest(depth, value)))
big_array = st.integers(500, 12_000).map(lambda n: list(range(n)))
# Work budgets (limits, windows, nodes read) around and far beyond the server's defaults.
budget = st.one_of(st.integers(0, 3000), st.sampled_from([10, 101, 200, 201, 255, 256, 257, 1000, 1001]))
key_list = st.integers(0, 400).map(lambda n: ",".join(f"k{i}" for i in range(n)))
value = st.one_of(leaf, deep, big_array, st.lists(leaf, max_size=5))
field = st.one_of(st.sampled_from(["level", "tenant", "tags", "title"]), hostile_text)
filters = st.recursive(
    st.dictionaries(field, value, max_size=3),
    lambda inner: st.one_of(
        st.dictionaries(st.sampled_from(["$and", "$or"]), st.lists(inner, max_size=3), min_size=1),
        st.dictionaries(
            field, st.dictionaries(st.sampled_from(["$in", "$gte", "$ne", "$not"]), value), max_size=2
        ),
        st.fixed_dictionaries(
            {"op": st.sampled_from(["and", "eq", "in"]), "args": st.lists(inner, max_size=2)}
        ),
    ),
    max_leaves=8,
)
query = st.fixed_dictionaries(
    {},
    optional={
        "table": st.one_of(st.just("docs"), hostile_text),
        "store": st.one_of(st.just("m1"), st.just("m_{var.u}"), hostile_text, value),
        "schema": st.one_of(st.just("prefs"), hostile_text, value),
        "vars": st.one_of(st.fixed_dictionaries({"u": value}), value),
        "full_text_search": value,
        "semantic_search": value,
        "filter": st.one_of(filters, value),
        "filter_query": st.one_of(filters, value),
        "fields": st.one_of(st.lists(field, max_size=3), value),
        "limit": st.one_of(budget, value),
        "threshold": value,
    },
)
navigation = st.fixed_dictionaries(
    {},
    optional={
        "query_index": value,
        "strategy": st.one_of(st.sampled_from(["tree", "graph"]), value),
        "selection": st.one_of(st.sampled_from(["ranked", "agentic"]), value),
        "index": st.one_of(st.just("links"), hostile_text),
        "start_key": st.one_of(st.just("a"), value),
        "start_nodes": st.one_of(st.just("$roots"), key_list, value),
        "max_depth": st.one_of(budget, value),
        "beam_width": st.one_of(budget, value),
        "max_nodes": st.one_of(budget, value),
        "neighbor_limit": st.one_of(budget, value),
        "links_index": st.one_of(st.just("links"), value),
        "edge_types": value,
        "scoring": value,
    },
)
retrieval = st.fixed_dictionaries(
    {"query": st.one_of(hostile_text, value), "queries": st.lists(query, min_size=1, max_size=3)},
    optional={
        "diagnostics": value,
        "min_lsn": st.one_of(st.just("0/16B3748"), hostile_text, value),
        "consistency": st.one_of(st.sampled_from(["primary", "any"]), hostile_text, value),
        "max_internal_iterations": value,
        "steps": st.one_of(
            st.dictionaries(hostile_text, value, max_size=2),
            st.fixed_dictionaries(
                {
                    "retrieval": st.fixed_dictionaries(
                        {}, optional={"navigation": navigation, "expand_window": st.one_of(budget, value)}
                    )
                }
            ),
        ),
        "memory": st.fixed_dictionaries(
            {"stores": st.one_of(st.lists(st.one_of(st.just("m1"), hostile_text), max_size=2), value)},
            optional={"top_k": value, "max_tokens": value, "vars": value},
        ),
    },
)
index = st.fixed_dictionaries(
    {"name": st.one_of(st.just("fz"), hostile_text), "kind": st.one_of(st.just("graph"), value)},
    optional={"field": st.one_of(st.just("tags"), hostile_text), "edge_type": value},
)
edges = st.lists(
    st.fixed_dictionaries(
        {"from": st.one_of(st.just("a"), value), "to": st.one_of(st.just("b"), value)},
        optional={"type": value, "weight": value, "metadata": value},
    ),
    max_size=3,
)
memory_records = st.lists(
    st.fixed_dictionaries(
        {"text": st.one_of(hostile_text, value)},
        optional={"id": value, "importance": value, "metadata": value, "entities": value},
    ),
    max_size=3,
)
relations = st.lists(
    st.fixed_dictionaries(
        {"subject": value, "predicate": value, "object": value}, optional={"single_valued": value}
    ),
    max_size=2,
)
saved_agent = st.fixed_dictionaries(
    {"name": st.one_of(st.just("fz"), hostile_text)},
    optional={
        "source": st.one_of(st.just("docs"), hostile_text),
        "source_kind": st.one_of(st.sampled_from(["file", "name"]), value),
        "storage": st.one_of(st.just("m1"), st.just("m_{var.u}"), hostile_text, value),
        "schema": st.one_of(st.just("prefs"), hostile_text, value),
        "filter": st.one_of(filters, value),
        "top_k": value,
        "input": value,
        "retrieval_mode": value,
    },
)
documents = st.lists(
    st.fixed_dictionaries(
        {"_id": st.one_of(st.just("f1"), hostile_text)},
        optional={"text": value, "title": value, "level": value, "tenant": value, "embedding": value},
    ),
    max_size=3,
)
path_part = st.one_of(
    st.just("a1"),
    st.lists(st.sampled_from(["a", "%00", "d", "/", "%ed%a0%80", "%ff", "%"]), max_size=6).map("".join),
)
requests = st.one_of(
    st.tuples(st.just("POST"), st.just("/agents/retrieval"), retrieval),
    st.tuples(st.just("POST"), st.just("/agents"), saved_agent),
    st.tuples(
        st.just("PATCH"),
        st.just("/agents/a1"),
        st.dictionaries(st.sampled_from(["filter", "top_k", "rrf_k"]), st.one_of(filters, value), max_size=2),
    ),
    st.tuples(
        st.just("POST"),
        st.just("/agents/a1/run"),
        st.fixed_dictionaries(
            {"input": value}, optional={"vars": st.one_of(st.fixed_dictionaries({"u": value}), value)}
        ),
    ),
    st.tuples(st.just("POST"), st.just("/sources/docs/documents"), documents),
    st.tuples(st.sampled_from(["GET", "DELETE"]), path_part.map(lambda p: f"/agents/{p}"), st.none()),
    st.tuples(
        st.sampled_from(["GET", "DELETE"]), path_part.map(lambda p: f"/sources/docs/documents/{p}"), st.none()
    ),
    st.tuples(st.just("POST"), st.just("/sources/docs/indexes"), index),
    st.tuples(st.just("POST"), st.just("/sources/docs/indexes/explicit/edges"), edges),
    st.tuples(
        st.sampled_from(["GET", "DELETE"]),
        path_part.map(lambda p: f"/sources/docs/indexes/{p}"),
        st.none(),
    ),
    st.tuples(
        st.just("GET"), path_part.map(lambda p: f"/sources/docs/indexes/links/neighbors?key={p}"), st.none()
    ),
    st.tuples(st.just("POST"), path_part.map(lambda p: f"/memory/{p or 'm1'}/records"), memory_records),
    st.tuples(st.just("POST"), st.just("/memory/m1/relations"), relations),
    st.tuples(st.just("GET"), path_part.map(lambda p: f"/memory/m1?query={p}"), st.none()),
    st.tuples(
        st.sampled_from(["GET", "DELETE"]), path_part.map(lambda p: f"/memory/m1/records/{p}"), st.none()
    ),
)


# What a client may declare its body to be: the JSON types the routes read, and those a browser posts across
# sites without a preflight (which must be 415).
JSON_TYPES = ("application/json", "application/json; charset=utf-8")
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x")
content_types = st.one_of(
    st.sampled_from(JSON_TYPES), st.sampled_from([*SIMPLE_TYPES, "application/x-ndjson", "application/xml"])
)


def _nest(depth: int, value: Any) -> Any:
    for i in range(depth):
        value = [value] if i % 2 else {"$and": value}
    return value


def test_no_generated_hostile_request_is_a_500(db_url: str, embedder: Any) -> None:
    statuses: Counter[int] = Counter()
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        seeded = client.post(
            "/sources/docs/documents",
            json=[
                {
                    "_id": "a",
                    "title": "Backups",
                    "text": "Archive the write-ahead log.",
                    "tenant": "acme",
                    "level": 2,
                    "tags": ["x"],
                },
                {
                    "_id": "b",
                    "title": "Vacuum",
                    "text": "Reclaim dead tuples.",
                    "tenant": "globex",
                    "level": 4,
                    "tags": ["y"],
                },
            ],
        )
        assert seeded.status_code == 200, seeded.text
        assert (
            client.post(
                "/agents", json={"name": "a1", "source": "docs", "retrieval_mode": "lexical"}
            ).status_code
            == 201
        )
        for index in (
            {"name": "links", "kind": "graph", "field": "tags"},
            {"name": "explicit", "kind": "graph"},
        ):
            assert client.post("/sources/docs/indexes", json=index).status_code == 201
        assert (
            client.post("/memory/m1/records", json=[{"text": "Alice is allergic to peanuts."}]).status_code
            == 201
        )

        @given(request=requests, content_type=content_types)
        @settings(
            max_examples=CASES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(request: tuple[str, str, Any], content_type: str) -> None:
            method, path, body = request
            # the standard encoder writes lone surrogates as \ud800 escapes and keeps big integers exact
            content = None if body is None else json.dumps(body)
            response = client.request(method, path, content=content, headers={"content-type": content_type})
            statuses[response.status_code] += 1
            assert response.status_code < 500, (method, path, response.text)
            if content is not None and content_type in SIMPLE_TYPES:
                assert response.status_code == 415, (method, path, content_type, response.text)
            if response.status_code >= 400:
                error = response.json()["error"]
                assert isinstance(error["code"], int) and error["name"] and error["message"]

        check()
    assert sum(statuses.values()) >= CASES
    assert statuses[400] > CASES // 4 and sum(n for s, n in statuses.items() if s < 300) > 20, statuses
