"""Schemathesis against the OpenAPI document of the running app (real database): generated requests for
every route must never produce a 500, responses must match their documented schemas and status codes,
and invalid requests must be rejected. The generated caller is a principal with every tool: it never
creates or drops an index (an administrator's act)."""

from __future__ import annotations

from typing import Any

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from agentdb.api import create_app
from agentdb.auth import TOOLS, create_principal
from agentdb.config import Settings


def test_every_operation_survives_generated_requests(db_url: str, embedder: Any) -> None:
    app = create_app(Settings(database_url=db_url))
    with TestClient(app, base_url="http://127.0.0.1") as client:  # runs the lifespan: pool, migrations
        client.post(
            "/sources/docs/documents",
            json=[
                {"_id": "a", "title": "Backups", "text": "Archive the write-ahead log.", "team": "red"},
                {"_id": "b", "title": "Vacuum", "text": "Reclaim dead tuples.", "team": "blue"},
            ],
        )
        # Requests carry a key with every tool, so generation reaches past authentication; schemathesis also
        # sends generated (wrong) keys, which must be 401.
        with app.state.pool.connection() as conn:
            key = create_principal(conn, "fuzz", tables=["docs"], tools=sorted(TOOLS))[1]
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 10
        statuses: list[int] = []
        by_operation: dict[str, set[int]] = {}
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def check(case: Any) -> None:
                # Schema-valid requests may still be rejected for what a schema cannot say (an unknown
                # source, a filter on an unknown field): those are documented 4xx answers, not failures.
                status = case.call_and_validate(
                    base_url="http://127.0.0.1",
                    headers={"Authorization": f"Bearer {key}"},
                    excluded_checks=[positive_data_acceptance],
                ).status_code
                statuses.append(status)
                by_operation.setdefault(case.operation.label, set()).add(status)

            check()
        assert len(statuses) >= 10 * len(operations) and max(statuses) < 500
        assert {200, 400, 404} <= set(statuses)
        for label in ("POST /sources/{name}/indexes", "DELETE /sources/{name}/indexes/{index}"):
            assert 403 in by_operation[label] and max(by_operation[label]) < 500, (label, by_operation[label])
            assert not any(200 <= s < 300 for s in by_operation[label]), (label, by_operation[label])
