"""What a first user of the HTTP API meets, over the real app, a real database and the real embedder: the
threshold's toll on the dense leg said at the top of the response, a query with no search text said too, and
`/agents/retrieval` answering other methods with 405 rather than as a saved agent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_navigation import load_runbooks

from agentdb.api import create_app
from agentdb.config import Settings


@pytest.fixture
def client(db_url: str, embedder: Any) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as test_client:
        load_runbooks(test_client)
        yield test_client


def ask(client: TestClient, **query: Any) -> dict[str, Any]:
    body = {"query": "restore the database from a backup", "queries": [{"table": "runbooks", **query}]}
    response = client.post("/agents/retrieval", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_the_threshold_says_what_it_removed_at_the_top_of_the_response(client: TestClient) -> None:
    text = "restore the database from a backup"
    body = ask(client, semantic_search=text, full_text_search=text, threshold=0.5)
    (step,) = [s for s in body["steps"] if s["id"] == "retrieval_0"]
    dropped = step["details"]["dropped_by_threshold"]
    assert dropped > 0, step  # MiniLM puts most of these runbooks beyond distance 0.5 of the question
    (notice,) = body["notices"]
    assert f"removed {dropped} of " in notice and "threshold 0.5" in notice and "set it to 0" in notice
    assert ask(client, semantic_search=text, full_text_search=text, threshold=0)["notices"] == []


def test_a_query_without_search_text_is_told_what_it_searched(client: TestClient) -> None:
    body = ask(client, retrieval_mode="lexical")
    assert body["notices"] == [
        "queries[0] has neither semantic_search nor full_text_search: it searched the request's `query` text "
        "(lexical)"
    ]
    assert body["hits"]


def test_other_methods_on_the_retrieval_endpoint_are_405(client: TestClient) -> None:
    for method in ("GET", "PATCH", "DELETE"):
        response = client.request(method, "/agents/retrieval")
        assert response.status_code == 405, (method, response.text)
        assert response.headers["allow"] == "POST" and response.json()["error"]["code"] == 1405
    refused = client.post("/agents", json={"name": "retrieval", "source": "runbooks"})
    assert (
        refused.status_code == 400 and "endpoint POST /agents/retrieval" in refused.json()["error"]["message"]
    )
