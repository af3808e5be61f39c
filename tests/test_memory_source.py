"""A Retrieve step that reads a memory store by name (the source kind "name"): in a retrieval request
(`queries[i].store` with `schema` and `vars`) and in a saved agent (`source_kind: "name"`, `storage`,
`schema`), with the store's record schema checked, the store's own fields filterable, and another owner's
store as absent as one that does not exist."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from agentdb.api import create_app
from agentdb.auth import create_principal, delete_principal, list_principals
from agentdb.config import Settings
from agentdb.memory import StoreSpec, write_records
from agentdb.sources import FieldSpec

PREFS = StoreSpec(schema="prefs", fields=[FieldSpec(name="topic", type="string", optional=True)])
ALICE = [
    {"text": "Alice is allergic to peanuts.", "importance": 9, "metadata": {"topic": "food"}},
    {
        "text": "Alice prefers a window seat on long flights.",
        "importance": 3,
        "metadata": {"topic": "travel"},
    },
    {"text": "Alice likes grilled fish with lemon.", "importance": 5, "metadata": {"topic": "food"}},
]
AGENT = {
    "name": "recall",
    "source_kind": "name",
    "storage": "user_{var.user}",
    "schema": "prefs",
    "retrieval_mode": "hybrid",
    "top_k": 3,
    "threshold": 0,
}


@pytest.fixture
def client(db_url: str, embedder: Any) -> Iterator[TestClient]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        write_records(
            conn, "user_{var.user}", ALICE, variables={"user": "alice"}, embedder=embedder, spec=PREFS
        )
        write_records(
            conn,
            "user_{var.user}",
            [{"text": "Bob keeps a travel diary."}],
            variables={"user": "bob"},
            embedder=embedder,
            spec=StoreSpec(schema="notes"),
        )
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as test_client:
        yield test_client
    with psycopg.connect(db_url, autocommit=True) as conn:
        for p in list_principals(conn):
            delete_principal(conn, p.name)


def error(response: Any) -> tuple[int, int, str]:
    body = response.json()
    return response.status_code, body["error"]["code"], body["error"]["path"]


def test_a_retrieval_query_reads_a_memory_store_by_name(client: TestClient) -> None:
    query = {"store": "user_{var.user}", "schema": "prefs", "vars": {"user": "alice"}, "threshold": 0}
    body = client.post("/agents/retrieval", json={"query": "peanut allergy", "queries": [query]}).json()
    assert body["status"] == "completed", body
    texts = [h["_source"]["text"] for h in body["hits"]]
    assert texts[0] == "Alice is allergic to peanuts." and set(texts) <= {r["text"] for r in ALICE}
    # Hits and steps name the store as the query did (its resolved name), not the table of its records.
    assert {h["_table"] for h in body["hits"]} == {"user_alice"}
    assert body["steps"][0]["details"]["store"] == "user_alice" and "table" not in body["steps"][0]["details"]
    # The store's own record schema is filterable, as a source's fields are.
    only_travel = client.post(
        "/agents/retrieval",
        json={
            "query": "what does Alice like",
            "queries": [
                {**query, "filter": {"op": "eq", "lhs": {"knowledge": "topic"}, "rhs": {"value": "travel"}}}
            ],
        },
    ).json()
    assert [h["_source"]["text"] for h in only_travel["hits"]] == [ALICE[1]["text"]]
    # A store is listed as a memory store (to its owner), not among the sources.
    assert client.get("/sources").json() == []
    assert {s["name"] for s in client.get("/memory").json()} == {"user_alice", "user_bob"}


def test_a_store_query_is_checked_before_anything_runs(client: TestClient) -> None:
    base = {"query": "peanuts"}
    store = {"store": "user_{var.user}", "schema": "prefs", "vars": {"user": "alice"}}
    cases = [
        ({**store, "table": "kitchen"}, (400, 3007, "queries[0].store")),
        ({"store": "user_alice"}, (400, 3007, "queries[0].schema")),
        ({**store, "schema": "notes"}, (409, 3011, "queries[0].schema")),
        ({**store, "vars": {"user": "bob"}}, (409, 3011, "queries[0].schema")),
        ({**store, "vars": {}}, (400, 3007, "queries[0].vars.user")),
        ({**store, "vars": {"user": "Nobody Here"}}, (400, 3007, "queries[0].store")),
        ({**store, "vars": {"user": "carol"}}, (404, 3010, "queries[0].store")),
        ({"table": "kitchen", "schema": "prefs"}, (400, 3007, "queries[0].schema")),
        ({"retrieval_mode": "lexical"}, (400, 3007, "queries[0].table")),
        (
            {**store, "filter": {"op": "eq", "lhs": {"knowledge": "secret"}, "rhs": {"value": 1}}},
            (400, 3007, "queries[0].filter.lhs"),
        ),
    ]
    for query, expected in cases:
        assert error(client.post("/agents/retrieval", json={**base, "queries": [query]})) == expected, query


def test_a_saved_agent_reads_the_store_its_run_names(client: TestClient) -> None:
    created = client.post("/agents", json=AGENT)
    assert created.status_code == 201, created.json()
    assert {k: created.json()[k] for k in ("source_kind", "storage", "schema", "source")} == {
        "source_kind": "name",
        "storage": "user_{var.user}",
        "schema": "prefs",
        "source": None,
    }
    run = client.post(
        "/agents/recall/run", json={"input": "peanut allergy", "vars": {"user": "alice"}}
    ).json()
    assert run["status"] == "completed", run
    assert run["hits"][0]["_source"]["text"] == "Alice is allergic to peanuts."
    # Bob's store has another record schema: 3011 at the agent's own field, and nothing ran.
    assert error(client.post("/agents/recall/run", json={"input": "diary", "vars": {"user": "bob"}})) == (
        409,
        3011,
        "schema",
    )
    assert error(client.post("/agents/recall/run", json={"input": "x"})) == (400, 3007, "vars.user")
    assert error(client.post("/agents/recall/run", json={"input": "x", "vars": {"user": "carol"}})) == (
        404,
        3010,
        "storage",
    )
    # The mutable parameters change as on any agent; the store's fields are checked when the agent runs.
    patched = client.patch(
        "/agents/recall",
        json={"filter": {"op": "eq", "lhs": {"knowledge": "topic"}, "rhs": {"value": "travel"}}},
    )
    assert patched.status_code == 200, patched.json()
    travel = client.post("/agents/recall/run", json={"input": "Alice", "vars": {"user": "alice"}}).json()
    assert [h["_source"]["text"] for h in travel["hits"]] == [ALICE[1]["text"]]
    for key, value in (
        ("storage", "user_bob"),
        ("schema", "notes"),
        ("source_kind", "file"),
        ("source", "x"),
    ):
        assert error(client.patch("/agents/recall", json={key: value})) == (400, 3006, key)


def test_a_saved_agent_on_a_store_is_checked_when_created(client: TestClient) -> None:
    cases = [
        ({"source": "kitchen"}, (400, 3007, "source")),
        ({"schema": None}, (400, 3007, "schema")),
        ({"storage": None}, (400, 3007, "storage")),
        ({"storage": "User-{var.user}"}, (400, 3007, "storage")),
        ({"storage": "user_alice", "schema": "notes"}, (409, 3011, "schema")),
        (
            {
                "storage": "user_alice",
                "filter": {"op": "eq", "lhs": {"knowledge": "nope"}, "rhs": {"value": 1}},
            },
            (400, 3007, "filter.lhs"),
        ),
        (
            {"navigation": {"strategy": "tree", "index": "sections", "start_key": "a"}},
            (400, 3007, "navigation"),
        ),
        ({"source_kind": "file", "storage": "user_alice", "source": "kitchen"}, (400, 3007, "storage")),
        ({"source_kind": "file", "storage": None, "schema": None}, (400, 3007, "source")),
    ]
    for change, expected in cases:
        assert error(client.post("/agents", json={**AGENT, **change})) == expected, change
    assert client.get("/agents").json() == []


def test_a_principals_agent_reads_only_its_own_store(client: TestClient, db_url: str, embedder: Any) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        alice, alice_key = create_principal(conn, "alice", tables=[], tools=["memory"])
        _, mallory_key = create_principal(conn, "mallory", tables=[], tools=["memory"])
        _, searcher_key = create_principal(conn, "searcher", tables=[], tools=["search"])
        write_records(conn, "diary", ALICE[:1], principal=alice, embedder=embedder, spec=PREFS)
    as_alice = {"Authorization": f"Bearer {alice_key}"}
    as_mallory = {"Authorization": f"Bearer {mallory_key}"}
    agent = {**AGENT, "name": "mine", "storage": "diary"}
    assert client.post("/agents", json=agent, headers=as_alice).status_code == 201
    run = client.post("/agents/mine/run", json={"input": "peanuts"}, headers=as_alice).json()
    assert [h["_source"]["text"] for h in run["hits"]] == [ALICE[0]["text"]]
    assert [a["name"] for a in client.get("/agents", headers=as_alice).json()] == ["mine"]
    # Mallory's agent of the same store name reads Mallory's own store: none, so 3010 as for any unknown
    # store; the application's stores (user_alice) are not Mallory's either.
    assert client.post("/agents", json=agent, headers=as_mallory).status_code == 201
    assert error(client.post("/agents/mine/run", json={"input": "peanuts"}, headers=as_mallory)) == (
        404,
        3010,
        "storage",
    )
    query = {"store": "user_alice", "schema": "prefs"}
    assert error(
        client.post("/agents/retrieval", json={"query": "peanuts", "queries": [query]}, headers=as_mallory)
    ) == (404, 3010, "queries[0].store")
    # Without the memory tool: 403 before anything is read.
    searcher = {"Authorization": f"Bearer {searcher_key}"}
    assert error(client.post("/agents", json={**agent, "name": "s"}, headers=searcher)) == (
        403,
        1403,
        "storage",
    )
    assert error(
        client.post("/agents/retrieval", json={"query": "peanuts", "queries": [query]}, headers=searcher)
    ) == (403, 1403, "queries[0].store")
