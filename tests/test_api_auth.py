"""Principals over real HTTP: 401/403 before any query, and no hit, field or count outside the row filter
for search, document fetch and saved-agent runs."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentdb.api import create_app
from agentdb.auth import create_principal
from agentdb.config import Settings
from agentdb.sources import FieldSpec, create_document_source

WORDS = ["backup", "restore", "wal", "vacuum", "index", "replica", "failover", "archive"]
FIELDS = [
    FieldSpec(name="team", type="string"),
    FieldSpec(name="level", type="int"),
    FieldSpec(name="secret", type="string"),
]


@pytest.fixture
def served(conn: Any, db_url: str) -> Iterator[tuple[TestClient, dict[str, Any], Any]]:
    """Two sources with 60 rows of random words and unit vectors; principal keys for several grants."""
    rng = random.Random(3)
    np_rng = np.random.default_rng(3)
    docs = {}
    for source in ("ops", "hr"):
        create_document_source(
            conn, source, embedding_model="all-MiniLM-L6-v2", embedding_dim=384, fields=FIELDS
        )
        with conn.cursor() as cur:
            for i in range(60):
                meta = {
                    "team": rng.choice(["red", "blue", "green"]),
                    "level": rng.randint(1, 5),
                    "secret": f"s{i}",
                }
                vector = np_rng.normal(size=384).astype(np.float32)
                vector /= np.linalg.norm(vector)
                text = " ".join(rng.choices(WORDS, k=8))
                cur.execute(
                    f"insert into agentdb_docs.{source} (doc_id, chunk, title, text, metadata, agentdb_embedding)"  # noqa: S608
                    " values (%s, 0, %s, %s, %s, %s)",
                    (f"{source}{i}", f"doc {i}", text, __import__("psycopg").types.json.Jsonb(meta), vector),
                )
                docs[f"{source}{i}"] = meta
    keys = {
        "red": create_principal(
            conn,
            "red",
            tables=["ops"],
            row_filter={"team": "red"},
            fields=["title", "text", "team", "level"],
            tools=["search"],
        )[1],
        "searchless": create_principal(conn, "searchless", tables=["ops"], tools=["tree_search"])[1],
    }
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        yield client, keys, docs


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def search(table: str, text: str = "backup", **extra: Any) -> dict[str, Any]:
    return {
        "query": text,
        "queries": [{"table": table, "full_text_search": text, "limit": 50, **extra}],
        "diagnostics": True,
    }


def test_401_and_403_come_before_any_query(served: Any) -> None:
    client, keys, _ = served
    assert client.post("/agents/retrieval", json=search("ops")).status_code == 401
    assert client.post("/agents/retrieval", json=search("ops"), headers=auth("adb_wrong")).status_code == 401
    assert (
        client.post("/agents/retrieval", json=search("ops"), headers={"Authorization": "Basic x"}).status_code
        == 401
    )
    denied = client.post("/agents/retrieval", json=search("hr"), headers=auth(keys["red"]))
    assert denied.status_code == 403 and denied.json()["error"]["path"] == "queries[0].table"
    hidden = client.post(
        "/agents/retrieval", json=search("ops", fields=["secret"]), headers=auth(keys["red"])
    )
    assert hidden.status_code == 403 and hidden.json()["error"]["code"] == 1403
    by_hidden = client.post(
        "/agents/retrieval", json=search("ops", filter={"secret": "s1"}), headers=auth(keys["red"])
    )
    assert by_hidden.status_code == 403
    no_tool = client.post("/agents/retrieval", json=search("ops"), headers=auth(keys["searchless"]))
    assert no_tool.status_code == 403
    assert client.get("/sources/hr", headers=auth(keys["red"])).status_code == 403
    assert [s["name"] for s in client.get("/sources", headers=auth(keys["red"])).json()] == ["ops"]


def test_refuses_to_serve_openly_on_a_public_address(db_url: str) -> None:
    with pytest.raises(Exception, match="refusing to serve on 0.0.0.0 without principals"):
        with TestClient(
            create_app(Settings(database_url=db_url, host="0.0.0.0")), base_url="http://127.0.0.1"
        ):  # noqa: S104
            pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
    mode=st.sampled_from(["lexical", "hybrid"]),
    level=st.integers(1, 5),
)
def test_no_hit_field_or_count_leaks(served: Any, words: list[str], mode: str, level: int) -> None:
    client, keys, docs = served
    allowed = {d for d, m in docs.items() if d.startswith("ops") and m["team"] == "red"}
    text = " ".join(words)
    extra: dict[str, Any] = {"filter": {"level": {"$gte": level}}}
    if mode == "hybrid":
        extra["semantic_search"] = text
        extra["threshold"] = 0
    body = client.post(
        "/agents/retrieval", json=search("ops", text, **extra), headers=auth(keys["red"])
    ).json()
    ids = {h["_id"] for h in body["hits"]}
    assert ids <= allowed
    assert all("secret" not in h["_source"] for h in body["hits"])
    params = body["debug_info"]["queries"][0]["parameters"]
    # the diagnostics' repeat of the hits (asked for here) holds the same rows and no field beyond the hits'
    results = body["debug_info"]["queries"][0]["output"]["results"]
    assert {r["id"] for r in results} <= allowed
    assert all(
        set(r) == {"id", "chunk", "distance", "bm25_score", "rank_dense", "rank_sparse", "text"}
        for r in results
    )
    visible = {d for d in allowed if docs[d]["level"] >= level}
    for key in ("sparse_raw_count", "dense_raw_count", "fused_candidate_count", "result_count"):
        assert params[key] <= len(visible)
    # document fetches: visible rows come back without hidden fields; others are 404 as if absent
    for doc_id in sorted(docs)[::17]:
        response = client.get(f"/sources/ops/documents/{doc_id}", headers=auth(keys["red"]))
        if doc_id in allowed:
            assert response.status_code == 200 and "secret" not in response.json()["metadata"]
        elif doc_id.startswith("ops"):
            assert response.status_code == 404
    # saved-agent runs apply the principal's row filter too
    client.post(
        "/agents",
        json={"name": "ops-agent", "source": "ops", "retrieval_mode": "lexical", "top_k": 50},
        headers=auth(keys["red"]),
    )
    run = client.post("/agents/ops-agent/run", json={"input": text}, headers=auth(keys["red"])).json()
    assert {h["_id"] for h in run["hits"]} <= allowed
    assert all("secret" not in h["_source"] for h in run["hits"])
