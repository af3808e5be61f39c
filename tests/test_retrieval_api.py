"""POST /agents/retrieval, saved agents and documents over real HTTP (FastAPI's client) on a real database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from agentdb.agent import AgentHit, merge
from agentdb.api import create_app
from agentdb.config import Settings
from agentdb.retrieval import Hit
from agentdb.saved_agents import agent_path

RUNBOOKS = [
    {
        "_id": "deploy",
        "title": "Deployment guide",
        "text": "Roll out a release with blue green deployment and a rollback plan.",
        "status": "published",
        "year": 2024,
    },
    {
        "_id": "backup",
        "title": "Backups",
        "text": "Take base backups and archive the write-ahead log for point in time recovery.",
        "status": "published",
        "year": 2022,
    },
    {
        "_id": "restore",
        "title": "Restore drill",
        "text": "Recovery drill: restore the latest backup to a scratch server and replay WAL.",
        "status": "draft",
        "year": 2023,
    },
    {
        "_id": "oncall",
        "title": "On-call",
        "text": "Page the on-call engineer when the error budget burns too fast.",
        "status": "published",
        "year": 2021,
    },
]
NOTES = [
    {
        "_id": "n1",
        "title": "Recovery notes",
        "text": "Point in time recovery needs every WAL segment since the base backup.",
    },
    {"_id": "n2", "title": "Lunch", "text": "The canteen serves soup on Fridays."},
]


@pytest.fixture
def client(db_url: str, embedder: Any) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as test_client:
        assert test_client.post("/sources/runbooks/documents", json=RUNBOOKS).status_code == 200
        ndjson = b"\n".join(orjson.dumps(n) for n in NOTES)
        response = test_client.post(
            "/sources/notes/documents", content=ndjson, headers={"content-type": "application/x-ndjson"}
        )
        assert response.json()["documents"] == 2
        yield test_client


def ask(client: TestClient, **body: Any) -> Any:
    response = client.post("/agents/retrieval", json={"query": "how do I recover?", **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_response_schema_and_inferred_modes(client: TestClient) -> None:
    body = ask(
        client,
        queries=[
            {
                "table": "runbooks",
                "semantic_search": "recover from a backup",
                "full_text_search": "backup recovery",
                "limit": 3,
            }
        ],
        diagnostics=True,
    )
    assert set(body) >= {"hits", "status", "steps", "route", "usage", "debug_info"}
    assert body["status"] == "completed" and body["route"] == "found"
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0, "llm_calls": 0}
    assert body["tool_calls_made"] == 0  # no step gave a model a tool
    [step] = body["steps"]
    assert (
        step["status"] == "completed"
        and step["duration_ms"] > 0
        and step["details"]["retrieval_mode"] == "hybrid"
    )
    hit = body["hits"][0]
    assert set(hit) == {"_id", "_score", "_source", "_table", "_chunk", "_chunks", "_index_scores"}
    assert hit["_chunks"] == [0]  # expand_window 3 by default; these documents have one chunk
    assert hit["_table"] == "runbooks" and hit["_id"] in {"backup", "restore"}
    assert set(hit["_index_scores"]) == {"distance", "bm25", "rank_dense", "rank_sparse"}
    params = body["debug_info"]["queries"][0]["parameters"]
    assert params["retrieval_mode"] == "hybrid" and params["result_count"] == len(body["hits"])
    # Asked for diagnostics, the funnel ends with every hit again (id, scores, text), in the hits' order.
    results = body["debug_info"]["queries"][0]["output"]["results"]
    assert [r["id"] for r in results] == [h["_id"] for h in body["hits"]] and all(r["text"] for r in results)
    lexical = ask(client, queries=[{"table": "runbooks", "full_text_search": {"match": "rollback"}}])
    assert (
        lexical["steps"][0]["details"]["retrieval_mode"] == "lexical"
        and lexical["hits"][0]["_id"] == "deploy"
    )
    assert lexical["hits"][0]["_index_scores"]["distance"] is None
    dense = ask(client, queries=[{"table": "runbooks", "semantic_search": "who gets paged", "threshold": 0}])
    assert dense["steps"][0]["details"]["retrieval_mode"] == "dense" and dense["hits"][0]["_id"] == "oncall"


def test_filters_projection_and_exclusion(client: TestClient) -> None:
    body = ask(
        client,
        queries=[
            {
                "table": "runbooks",
                "full_text_search": "backup recovery restore deployment",
                "filter_query": {"term": "published", "field": "status"},
                "exclusion_query": {"min": 2024, "field": "year", "inclusive_min": True},
                "fields": ["title", "year"],
            }
        ],
    )
    assert [h["_id"] for h in body["hits"]] == ["backup"]
    assert body["hits"][0]["_source"] == {"title": "Backups", "year": 2022}
    bad = client.post(
        "/agents/retrieval",
        json={
            "query": "x",
            "queries": [
                {
                    "table": "runbooks",
                    "full_text_search": "x",
                    "filter": {"$or": [{"year": 1}, {"year": "new"}]},
                }
            ],
        },
    )
    assert bad.status_code == 400
    assert (
        bad.json()["error"]["code"] == 3007 and bad.json()["error"]["path"] == "queries[0].filter.$or[1].year"
    )
    unknown = client.post(
        "/agents/retrieval",
        json={
            "query": "x",
            "queries": [{"table": "runbooks", "full_text_search": "x", "fields": ["secret"]}],
        },
    )
    assert unknown.status_code == 400 and unknown.json()["error"]["path"] == "queries[0].fields[0]"


def test_queries_merge_by_rrf_and_deduplicate(client: TestClient) -> None:
    single = [
        ask(client, queries=[q])["hits"]
        for q in (
            {"table": "runbooks", "full_text_search": "recovery backup WAL", "limit": 5},
            {"table": "notes", "full_text_search": "recovery backup WAL", "limit": 5},
            {"table": "runbooks", "semantic_search": "point in time recovery", "limit": 5},
        )
    ]
    merged = ask(
        client,
        queries=[
            {"table": "runbooks", "full_text_search": "recovery backup WAL", "limit": 5},
            {"table": "notes", "full_text_search": "recovery backup WAL", "limit": 5},
            {"table": "runbooks", "semantic_search": "point in time recovery", "limit": 5},
        ],
    )["hits"]
    expected: dict[tuple[str, str], float] = {}
    for hits in single:
        for rank, hit in enumerate(hits, start=1):
            key = (hit["_table"], hit["_id"])
            expected[key] = expected.get(key, 0.0) + 1 / (60 + rank)
    keys = [(h["_table"], h["_id"]) for h in merged]
    assert len(keys) == len(set(keys))
    assert keys == sorted(expected, key=lambda k: (-expected[k], k))[:5]
    for hit in merged:
        assert hit["_score"] == pytest.approx(expected[(hit["_table"], hit["_id"])])


def _events(text: str) -> list[tuple[str, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], orjson.loads(lines["data"])))
    return events


def test_stream_event_order(client: TestClient) -> None:
    response = client.post(
        "/agents/retrieval",
        json={
            "query": "recover",
            "stream": True,
            "queries": [
                {"table": "runbooks", "full_text_search": "backup", "limit": 2},
                {"table": "notes", "full_text_search": "backup", "limit": 2},
            ],
        },
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    kinds = [k for k, _ in _events(response.text)]
    assert kinds[:4] == ["step_started", "step_completed", "step_started", "step_completed"]
    assert kinds[-1] == "done" and set(kinds[4:-1]) == {"hit"} and len(kinds[4:-1]) >= 1
    assert _events(response.text)[-1][1]["status"] == "completed"
    # Streamed hits are the JSON response's hits, in the same shape.
    as_json = ask(
        client,
        query="recover",
        queries=[
            {"table": "runbooks", "full_text_search": "backup", "limit": 2},
            {"table": "notes", "full_text_search": "backup", "limit": 2},
        ],
    )
    assert [p for k, p in _events(response.text) if k == "hit"] == as_json["hits"]


def test_stream_reports_errors_then_done(client: TestClient) -> None:
    response = client.post(
        "/agents/retrieval",
        json={
            "query": "recover",
            "stream": True,
            "queries": [
                {"table": "runbooks", "full_text_search": "backup"},
                {"table": "runbooks", "full_text_search": "backup", "fields": ["nope"]},
            ],
        },
    )
    events = _events(response.text)
    kinds = [k for k, _ in events]
    assert kinds[-2:] == ["error", "done"] and "step_completed" in kinds
    assert events[-2][1]["error"]["code"] == 3007 and events[-1][1]["status"] == "failed"
    assert events[-2][1]["error"]["path"] == "queries[1].fields[0]"
    # a filter that does not compile is found before the stream starts: a plain 400 with its full path
    early = client.post(
        "/agents/retrieval",
        json={"query": "q", "stream": True, "queries": [{"table": "runbooks", "filter": {"nope": 1}}]},
    )
    assert early.status_code == 400 and early.json()["error"]["path"] == "queries[0].filter.nope"


def test_unsupported_features_and_limits_are_clear_400s(client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_internal_iterations": 3}, "max_internal_iterations"),
        ({"steps": {"generation": {"enabled": True}}}, "generator.provider"),  # no ANTHROPIC_API_KEY here
        # navigation is checked field by field (tests/test_navigation.py has every rule)
        (
            {"steps": {"retrieval": {"navigation": {"strategy": "tree"}}}},
            "steps.retrieval.navigation.query_index",
        ),
    ]
    for extra, path in cases:
        response = client.post(
            "/agents/retrieval", json={"query": "x", "queries": [{"table": "runbooks"}], **extra}
        )
        assert response.status_code == 400 and response.json()["error"]["path"] == path
    too_many = client.post("/agents/retrieval", json={"query": "x", "queries": [{"table": "runbooks"}] * 9})
    assert too_many.status_code == 400 and too_many.json()["error"]["path"] == "queries"
    big_limit = client.post(
        "/agents/retrieval", json={"query": "x", "queries": [{"table": "runbooks", "limit": 1001}]}
    )
    assert big_limit.status_code == 400 and big_limit.json()["error"]["path"] == "queries[0].limit"
    missing = client.post("/agents/retrieval", json={"queries": [{"table": "runbooks"}]})
    assert missing.status_code == 400 and missing.json()["error"]["path"] == "query"
    unknown_table = client.post("/agents/retrieval", json={"query": "x", "queries": [{"table": "nope"}]})
    assert unknown_table.status_code == 404 and unknown_table.json()["error"]["path"] == "queries[0].table"


def test_body_size_limit_is_413(db_url: str) -> None:
    with TestClient(
        create_app(Settings(database_url=db_url, max_body_bytes=1000)), base_url="http://127.0.0.1"
    ) as small:
        response = small.post(
            "/agents/retrieval", content=b"x" * 5000, headers={"content-type": "application/json"}
        )
        assert response.status_code == 413 and response.json()["error"]["code"] == 1413


def test_statement_timeout_is_a_clear_error(db_url: str, client: TestClient) -> None:
    with TestClient(
        create_app(Settings(database_url=db_url, statement_timeout_ms=1)), base_url="http://127.0.0.1"
    ) as hasty:
        response = hasty.post(
            "/agents/retrieval",
            json={
                "query": "x",
                "queries": [{"table": "runbooks", "semantic_search": "backup", "full_text_search": "backup"}],
            },
        )
        assert response.status_code == 400 and response.json()["error"]["name"] == "StatementTimeout"


def test_saved_agent_lifecycle(client: TestClient) -> None:
    created = client.post("/agents", json={"name": "recovery", "source": "runbooks"})
    assert created.status_code == 201
    assert {
        k: created.json()[k] for k in ("retrieval_mode", "top_k", "threshold", "rrf_k", "filter", "input")
    } == {"retrieval_mode": "dense", "top_k": 2, "threshold": 0.5, "rrf_k": 60, "filter": None, "input": ""}
    assert client.post("/agents", json={"name": "recovery", "source": "runbooks"}).status_code == 409
    ok = client.patch(
        "/agents/recovery", json={"filter": {"status": "draft"}, "retrieval_mode": "lexical", "top_k": 5}
    )
    assert ok.status_code == 200 and ok.json()["filter"] == {"status": "draft"}
    structural = client.patch("/agents/recovery", json={"source": "notes"})
    assert structural.status_code == 400 and structural.json()["error"]["code"] == 3006
    bad = client.patch("/agents/recovery", json={"filter": {"status": {"$gt": 3}}, "top_k": 7})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 3007
    assert bad.json()["error"]["path"].startswith("filter")
    run = client.post("/agents/recovery/run", json={"input": "restore backup recovery"})
    assert run.status_code == 200
    body = run.json()
    assert body["route"] == "found" and [h["_id"] for h in body["hits"]] == [
        "restore"
    ]  # the draft filter held
    assert client.get("/agents/recovery").json()["top_k"] == 5  # the rejected patch changed nothing
    empty = client.post("/agents/recovery/run", json={"input": "", "diagnostics": True}).json()
    assert empty["route"] == "not_found" and empty["hits"] == []
    assert empty["debug_info"]["queries"][0]["output"]["results"] == []
    assert client.delete("/agents/recovery").status_code == 204
    gone = client.get("/agents/recovery")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == 3001


def test_documents_are_transactional_over_http(client: TestClient) -> None:
    before = client.get("/sources/runbooks").json()
    bad = client.post(
        "/sources/runbooks/documents", json=[{"_id": "x", "text": "fine"}, {"_id": "y", "text": 3}]
    )
    assert bad.status_code == 400 and bad.json()["error"]["path"] == "body:1.text"
    assert "?skip_bad=true" in bad.json()["error"]["hint"] and "--skip-bad" not in bad.json()["error"]["hint"]
    assert client.get("/sources/runbooks").json() == before
    assert client.delete("/sources/runbooks/documents/oncall").status_code == 204
    assert client.get("/sources/runbooks").json()["documents"] == before["documents"] - 1
    assert client.delete("/sources/runbooks/documents/oncall").status_code == 404


def test_hits_dropped_by_the_threshold_are_counted(client: TestClient) -> None:
    """A strict threshold drops dense candidates: the step says how many instead of dropping them silently."""
    loose = ask(client, queries=[{"table": "runbooks", "semantic_search": "who gets paged", "threshold": 0}])
    strict = ask(
        client, queries=[{"table": "runbooks", "semantic_search": "who gets paged", "threshold": 0.01}]
    )
    assert loose["steps"][0]["details"]["dropped_by_threshold"] == 0
    dropped = strict["steps"][0]["details"]["dropped_by_threshold"]
    assert dropped > 0 and dropped + len(strict["hits"]) == len(loose["hits"])


def _hit(doc: str, chunk: int, table: str = "t") -> Hit:
    return Hit(doc, chunk, 1, 0.5, None, None, None, None, None, f"{doc}:{chunk}", {}, table=table)


def test_merge_keeps_one_hit_per_document_and_table() -> None:
    """One query: its own scores, the first chunk of each document; several: RRF by (table, id), and the
    merged list's rank in `rank`."""
    single = merge([[_hit("a", 2), _hit("b", 0), _hit("a", 5), _hit("c", 1)]], limit=2)
    assert [(h.id, h.chunk, h.rank, h.score) for h in single] == [("a", 2, 1, 0.5), ("b", 0, 2, 0.5)]
    fused = merge(
        [
            [_hit("a", 1, "t"), _hit("b", 0, "t"), _hit("a", 3, "t")],
            [_hit("b", 0, "t"), _hit("a", 0, "u")],
        ],
        limit=10,
    )
    b, a_t, a_u = 1 / 62 + 1 / 61, 1 / 61, 1 / 62
    assert [(h.table, h.id, h.chunk, h.rank) for h in fused] == [
        ("t", "b", 0, 1),
        ("t", "a", 1, 2),
        ("u", "a", 0, 3),
    ]
    assert [h.score for h in fused] == pytest.approx([b, a_t, a_u])


def test_a_hit_read_from_its_row_is_the_same_hit() -> None:
    """Hit.from_row passes the JSON's fields by position: each lands in its own field (distinct values)."""
    hit = Hit("d1", 2, 3, 0.75, 0.2, 1.5, 4, 5, "Title", "Body", {"year": 2020}, table="docs")
    assert Hit.from_row(hit.row(), table="docs") == hit
    assert Hit.from_row({**hit.row(), "chunks": (1, 2), "hit_chunks": (2,)}, table="docs") == Hit(
        "d1", 2, 3, 0.75, 0.2, 1.5, 4, 5, "Title", "Body", {"year": 2020}, "docs", [1, 2], [2]
    )


def test_the_one_place_hits_become_json() -> None:
    hit = Hit(
        "d1", 2, 1, 0.75, 0.2, 1.5, 1, 3, "Title", "Body", {"year": 2020}, table="docs", chunks=[1, 2, 3]
    )
    assert AgentHit.of(hit).to_json() == {
        "_id": "d1",
        "_score": 0.75,
        "_source": {"year": 2020, "title": "Title", "text": "Body"},
        "_table": "docs",
        "_chunk": 2,
        "_chunks": [1, 2, 3],
        "_index_scores": {"distance": 0.2, "bm25": 1.5, "rank_dense": 1, "rank_sparse": 3},
    }
    projected = AgentHit.of(Hit("d2", 0, 1, 0.5, None, None, None, None, None, None, {}, table="docs"))
    assert projected.to_json()["_source"] == {} and projected.to_json()["_chunks"] is None


MANUALS = [
    {
        "_id": f"manual{m}",
        "title": f"Manual {m}",
        "text": " ".join(f"part{i} of manual{m}: checkpoint tuning and wal settings." for i in range(90)),
    }
    for m in range(3)
]


def test_saved_agent_runs_are_retrieval_requests(client: TestClient) -> None:
    """A run is the /agents/retrieval request its parameters make: documents (not chunks, so no document
    twice), the same hits, the same response shape."""
    assert client.post("/sources/manuals/documents", json=MANUALS).status_code == 200
    for name, params, text in (
        ("tuner", {"retrieval_mode": "lexical", "top_k": 3}, "checkpoint tuning"),
        (
            "pager",
            {},
            "page the on-call engineer when the error budget burns",
        ),  # dense, top_k 2, threshold 0.5
    ):
        source = "manuals" if name == "tuner" else "runbooks"
        assert client.post("/agents", json={"name": name, "source": source, **params}).status_code == 201
        agent = client.get(f"/agents/{name}").json()
        run = client.post(f"/agents/{name}/run", json={"input": text})
        assert run.status_code == 200, run.text
        body = run.json()
        same = ask(
            client,
            query=text,
            queries=[
                {
                    "table": source,
                    "retrieval_mode": agent["retrieval_mode"],
                    "limit": agent["top_k"],
                    "threshold": agent["threshold"],
                    "rrf_k": agent["rrf_k"],
                }
            ],
        )
        assert body["hits"] and body["hits"] == same["hits"], (name, body, same)
        assert set(body) == set(same) and body["status"] == "completed" and body["route"] == "found"
        assert [s["kind"] for s in body["steps"]] == ["retrieval"]
        ids = [h["_id"] for h in body["hits"]]
        assert len(ids) == len(set(ids)) <= agent["top_k"]
    tuned = client.post("/agents/tuner/run", json={"input": "checkpoint tuning"}).json()
    assert len(tuned["hits"]) == 3  # three documents, each widened by the default expand_window
    assert all(len(h["_chunks"]) > 1 and h["_source"]["title"].startswith("Manual") for h in tuned["hits"])


def test_saved_agent_run_errors_name_the_agents_fields(client: TestClient) -> None:
    """Errors of a run point at the saved agent's fields, not at the request it is run as."""
    generating = {"name": "writer", "source": "runbooks", "generation": {"enabled": True}}
    assert client.post("/agents", json=generating).status_code == 201
    keyless = client.post("/agents/writer/run", json={"input": "restore"})  # no ANTHROPIC_API_KEY here
    assert keyless.status_code == 400
    assert keyless.json()["error"]["path"] == "generation.generator.provider"
    in_place = {"enabled": True, "placement": "in_place", "generator": {"provider": "scripted"}}
    assert client.patch("/agents/writer", json={"generation": in_place}).status_code == 200
    unmarked = client.post("/agents/writer/run", json={"input": "restore"})
    assert unmarked.status_code == 400 and unmarked.json()["error"]["path"] == "input"
    assert agent_path("queries[0].filter.$or[1].year") == "filter.$or[1].year"
    assert agent_path("queries[0].table") == "source" and agent_path("steps.generation.x") == "generation.x"
