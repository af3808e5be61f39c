"""Document uploads an attacker shapes: metadata keys that are no field name (over JSON, NDJSON and `agentdb
ingest`), and an upload that dies while it creates its source."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentdb.api import create_app
from agentdb.cli import main
from agentdb.config import Settings
from agentdb.sources import FIELD_NAME

LOCAL = "http://127.0.0.1"


@pytest.fixture
def client(db_url: str, embedder: Any) -> Iterator[TestClient]:
    settings = Settings(database_url=db_url, embed_interval_s=0)
    with TestClient(create_app(settings), base_url=LOCAL, raise_server_exceptions=False) as c:
        assert (
            c.post(
                "/sources/tenants/documents", json=[{"_id": "t0", "text": "x", "tenant": "acme"}]
            ).status_code
            == 200
        )
        yield c


def test_a_metadata_key_that_is_no_field_name_is_a_400_at_its_path(client: TestClient) -> None:
    answer = client.post(
        "/sources/tenants/documents", json=[{"_id": "fz2", "text": "x", "tenant": "globex", "bad-name": 1}]
    )
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["path"] == "body:0.bad-name", error
    assert "a field name is a letter or _, then letters, digits and _" in error["message"]
    ndjson = b'{"_id": "a", "text": "x"}\n{"_id": "fz3", "text": "x", "$where": 1}\n'
    answer = client.post(
        "/sources/tenants/documents", content=ndjson, headers={"content-type": "application/x-ndjson"}
    )
    assert answer.status_code == 400 and answer.json()["error"]["path"] == "body:2.$where", answer.text
    # skip_bad skips such a row like any bad row
    skipped = client.post(
        "/sources/tenants/documents?skip_bad=true",
        json=[{"_id": "ok", "text": "x"}, {"_id": "no", "text": "x", "a b": 1}],
    )
    assert skipped.status_code == 200 and skipped.json()["documents"] == 1, skipped.text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(min_size=1, max_size=70).filter(lambda k: k not in ("_id", "id", "text", "title")))
def test_any_metadata_key_is_stored_or_a_400_never_a_500(client: TestClient, key: str) -> None:
    if "\x00" in key or any(0xD800 <= ord(c) <= 0xDFFF for c in key):
        return  # refused by the request guard (tests/test_security.py)
    answer = client.post(
        "/sources/tenants/documents",
        content=orjson.dumps([{"_id": "k", "text": "x", key: 1}]),
        headers={"content-type": "application/json"},
    )
    assert answer.status_code in (200, 400), (key, answer.text)
    if answer.status_code == 400:
        assert answer.json()["error"]["path"] == f"body:0.{key}", (key, answer.text)
    else:
        assert FIELD_NAME.match(key), key


def test_agentdb_ingest_names_the_file_and_line_of_a_bad_key(
    db_url: str, embedder: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    data = tmp_path / "notes.jsonl"
    data.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": "x", "bad-name": 1}\n')
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert main(["ingest", "notes", str(data), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "notes.jsonl:2" in err and "bad-name" in err and "Traceback" not in err, err


def test_an_upload_that_dies_while_creating_its_source_leaves_no_source(
    client: TestClient, conn: Any, monkeypatch: Any
) -> None:
    """The source and its first documents are one transaction: a failure after the first batch was
    written (the process killed, here an error injected there) takes the source back too."""
    pipeline = importlib.import_module("agentdb.ingest.pipeline")  # `agentdb.ingest` is also a function
    real = pipeline.write_documents

    def dies_after_writing(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise RuntimeError("the server was killed here")

    monkeypatch.setattr(pipeline, "write_documents", dies_after_writing)
    docs = [{"_id": f"n{i}", "text": f"note {i}"} for i in range(3)]
    assert client.post("/sources/fresh/documents", json=docs).status_code == 500
    assert conn.execute("select count(*) from agentdb.sources where name = 'fresh'").fetchone()[0] == 0
    assert conn.execute("select to_regclass('agentdb_docs.fresh')").fetchone()[0] is None
    # into an existing source, batches commit as they go (as documented for uploads)
    assert client.post("/sources/tenants/documents", json=docs).status_code == 500
    monkeypatch.setattr(pipeline, "write_documents", real)
    assert client.post("/sources/fresh/documents", json=docs).json()["documents"] == 3


def test_kill_9_during_an_upload_that_creates_its_source_leaves_no_source(conn: Any, db_url: str) -> None:
    """`agentdb serve` killed (SIGKILL) while it writes the first documents of a source it creates."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DATABASE_URL": db_url, "AGENTDB_EMBED_INTERVAL_S": "0"}
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from agentdb.cli import main; sys.exit(main(sys.argv[1:]))"]
        + ["serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        until(lambda: _answers(f"{base}/healthz"))
        docs = [{"_id": f"n{i}", "text": f"note {i} " + "backup restore " * 40} for i in range(3000)]
        upload = threading.Thread(
            target=lambda: _post_quietly(f"{base}/sources/fresh/documents", docs), daemon=True
        )
        upload.start()
        # the server has copied its first documents into the new source: kill it there
        writer = until(lambda: _copying_backend(conn))
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        until(lambda: not _backend_alive(conn, writer))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    assert conn.execute("select count(*) from agentdb.sources where name = 'fresh'").fetchone()[0] == 0
    assert conn.execute("select to_regclass('agentdb_docs.fresh')").fetchone()[0] is None


def until(found: Callable[[], Any], seconds: float = 120) -> Any:
    """The first true value of `found()`, polled until `seconds` pass (then the test fails)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _post_quietly(url: str, docs: list[dict[str, Any]]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(url, json=docs, timeout=300)


def _copying_backend(conn: Any) -> int | None:
    """Another backend of this database whose latest statement copies chunks into a table."""
    row = conn.execute(
        "select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()"
        " and query ilike 'copy %%from stdin%%' limit 1"
    ).fetchone()
    return None if row is None else int(row[0])


def _backend_alive(conn: Any, pid: int) -> bool:
    return bool(
        conn.execute("select exists (select 1 from pg_stat_activity where pid = %s)", (pid,)).fetchone()[0]
    )
