"""What one request, and one principal, may ask of the server: the work budget checked at validation, the
bounds of navigation that hold as stated, and a principal's share of the server under a flood."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from agentdb.api import create_app
from agentdb.auth import create_principal
from agentdb.config import Settings
from tests.fake_anthropic import API_KEY, reply_text, reply_tool
from tests.test_navigation import QUERY, ask, load_runbooks
from tests.test_security import fill, live

NAV = "steps.retrieval.navigation"


@pytest.fixture
def client(db_url: str, embedder: Any, fake: Any) -> Iterator[TestClient]:
    """The runbooks of tests/test_navigation.py with their indexes, on a keyless server."""
    settings = Settings(database_url=db_url, anthropic_api_key=API_KEY, anthropic_base_url=fake[1])
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as test_client:
        load_runbooks(test_client)
        yield test_client


def ranked(**fields: Any) -> dict[str, Any]:
    return {
        "steps": {
            "retrieval": {
                "navigation": {
                    "query_index": 0,
                    "index": "sections",
                    "strategy": "tree",
                    "selection": "ranked",
                    **fields,
                }
            }
        }
    }


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (
            {"queries": [{**QUERY, "limit": 1000}, {**QUERY, "limit": 1000}, {**QUERY, "limit": 1}]},
            "queries[2].limit",
        ),
        (
            {"queries": [{**QUERY, "limit": 200}], "steps": {"retrieval": {"expand_window": 51}}},
            "steps.retrieval.expand_window",
        ),
        ({"queries": [QUERY], **ranked(max_nodes=201)}, f"{NAV}.max_nodes"),
        (
            {"queries": [QUERY], **ranked(start_nodes=",".join(f"k{i}" for i in range(257)))},
            f"{NAV}.start_nodes",
        ),
    ],
)
def test_a_request_over_the_work_budget_is_3007_at_its_field(
    client: TestClient, body: dict[str, Any], path: str
) -> None:
    answer = ask(client, **body)
    error = answer.json()["error"]
    assert answer.status_code == 400 and (error["code"], error["path"]) == (3007, path), error
    assert "budget" in error["message"] and "AGENTDB_" in error["hint"]


def test_the_budget_is_the_operators_to_raise(db_url: str, client: TestClient) -> None:
    roomy = Settings(database_url=db_url, max_nodes_read=500, max_start_keys=300, max_results=3000)
    with TestClient(create_app(roomy), base_url="http://127.0.0.1") as wide:
        body = {"queries": [{**QUERY, "limit": 1000}] * 3, **ranked(max_nodes=500, start_nodes="pitr,backup")}
        answer = ask(wide, **body)
        assert answer.status_code == 200, answer.text
        many = ",".join(["pitr", *(f"k{i}" for i in range(299))])
        assert ask(wide, queries=[QUERY], **ranked(start_nodes=many)).status_code == 200


@pytest.mark.parametrize("limit", [255, 256])
def test_neighbor_limit_holds_as_the_model_states_it(client: TestClient, fake: Any, limit: int) -> None:
    api, _ = fake
    api.replies.extend([reply_tool("navigate", {"next_key": "recovery-target"}), reply_text("done")])
    navigation = {
        "query_index": 0,
        "strategy": "graph",
        "selection": "agentic",
        "index": "xref",
        "start_key": "pitr",
        "neighbor_limit": limit,
    }
    body = ask(
        client, queries=[QUERY], max_internal_iterations=3, steps={"retrieval": {"navigation": navigation}}
    ).json()
    assert body.get("status") == "completed", body
    refused = ask(
        client,
        queries=[QUERY],
        max_internal_iterations=3,
        steps={"retrieval": {"navigation": {**navigation, "neighbor_limit": 257}}},
    )
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["path"] == f"{NAV}.neighbor_limit", error
    assert error["message"].startswith(f"{NAV}.neighbor_limit")


def test_one_principals_flood_leaves_the_others_searches_alone(conn: Any, db_url: str) -> None:
    """16 requests at once by one principal: beyond its share some are 429 with Retry-After, for it only;
    another principal's searches meanwhile all succeed."""
    fill(conn, rows=200)
    flood_key = create_principal(conn, "ops", tables=["docs"])[1]
    other_key = create_principal(conn, "globex", tables=["docs"], row_filter={"tenant": "globex"})[1]
    heavy = {
        "query": "x",
        "queries": [{"table": "docs", "full_text_search": "backup restore wal", "limit": 200}] * 8,
    }
    light = {"query": "x", "queries": [{"table": "docs", "full_text_search": "backup", "limit": 3}]}
    settings = Settings(database_url=db_url, embed_interval_s=0, pool_max_size=6, principal_concurrency=2)
    with live(create_app(settings)) as port:
        base = f"http://127.0.0.1:{port}"
        flood: list[httpx.Response] = []

        def flooder() -> None:
            with httpx.Client(
                base_url=base, timeout=60, headers={"Authorization": f"Bearer {flood_key}"}
            ) as c:
                for _ in range(5):
                    flood.append(c.post("/agents/retrieval", json=heavy))

        threads = [threading.Thread(target=flooder) for _ in range(16)]
        for thread in threads:
            thread.start()
        others = []
        with httpx.Client(base_url=base, timeout=10, headers={"Authorization": f"Bearer {other_key}"}) as c:
            while any(t.is_alive() for t in threads):
                others.append(c.post("/agents/retrieval", json=light))
        for thread in threads:
            thread.join(60)
    assert others and all(r.status_code == 200 for r in others), [
        r.text for r in others if r.status_code != 200
    ]
    statuses = sorted({r.status_code for r in flood})
    assert statuses == [200, 429], statuses
    refused = next(r for r in flood if r.status_code == 429)
    assert refused.headers["retry-after"] == "1" and refused.json()["error"]["code"] == 1429
