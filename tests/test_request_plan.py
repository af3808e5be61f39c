"""One way through a request: validation resolves each query once (its source, its legs) and execution only
reads the plan. Counted in statements sent to the database, not in time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from agentdb import agent
from agentdb.api import create_app
from agentdb.config import Settings
from agentdb.db.pool import configure
from agentdb.embed import load_embedder

DOCS = [
    {"_id": "manual", "title": "Manual", "text": "Operations manual for the cluster.", "parent": None},
    {
        "_id": "backup",
        "title": "Backup",
        "text": "How to back up and restore the cluster.",
        "parent": "manual",
    },
    {
        "_id": "pitr",
        "title": "Point-in-time recovery",
        "text": "Replay archived WAL to a moment.",
        "parent": "backup",
    },
    {"_id": "dump", "title": "SQL dump", "text": "pg_dump writes a logical dump.", "parent": "backup"},
    {
        "_id": "replication",
        "title": "Replication",
        "text": "Standby servers follow the WAL.",
        "parent": "manual",
    },
]


class CountingCursor(psycopg.Cursor[Any]):
    """A cursor that keeps the text of every statement its connection sends."""

    sent: list[str] = []

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str | bytes) else query.as_string(self.connection)
        CountingCursor.sent.append(text.decode() if isinstance(text, bytes) else text)
        return super().execute(query, *args, **kwargs)


@pytest.fixture
def runbooks(db_url: str, embedder: Any) -> Iterator[str]:
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        assert client.post("/sources/plan_runbooks/documents", json=DOCS).status_code == 200
        index = {"name": "sections", "kind": "tree", "field": "parent"}
        assert client.post("/sources/plan_runbooks/indexes", json=index).status_code == 201
    yield db_url


def test_a_ranked_navigation_request_reads_the_source_catalog_once(runbooks: str) -> None:
    request = agent.RetrievalRequest.model_validate(
        {
            "query": "restore the cluster to a point in time",
            "queries": [
                {
                    "table": "plan_runbooks",
                    "semantic_search": "restore to a point in time",
                    "full_text_search": "restore WAL replay",
                    "limit": 3,
                    "threshold": 0,
                }
            ],
            "steps": {
                "retrieval": {
                    "navigation": {
                        "query_index": 0,
                        "index": "sections",
                        "strategy": "tree",
                        "selection": "ranked",
                    }
                }
            },
        }
    )
    with psycopg.connect(runbooks, autocommit=True, cursor_factory=CountingCursor) as conn:
        configure(conn)  # as the server's pool prepares each connection
        CountingCursor.sent.clear()
        plan = agent.validate(conn, request, None, Settings(database_url=runbooks))
        response = agent.respond(
            agent.run(conn, request, None, Settings(), plan=plan, embedder_for=load_embedder)
        )
    assert response.hits, "the walk found nothing: the count below would prove nothing"
    assert any(s.kind == "navigation" for s in response.steps)
    catalog_reads = [s for s in CountingCursor.sent if "from agentdb.sources" in s]
    assert len(catalog_reads) == 1, catalog_reads
