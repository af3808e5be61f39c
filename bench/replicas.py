"""Read replicas: correctness, read-your-writes waits, failover and throughput.

    .venv/bin/python bench/replicas.py
    .venv/bin/python bench/replicas.py --seconds 10 --queries 200

On the demo corpus (the PostgreSQL manual, 9,182 chunks, loaded once from its knowledge pack into
bench/.cache/replicas) with two local streaming standbys made by `agentdb start --replicas 2`'s helper:

  * correctness: the same `agentdb.retrieve` statement (hybrid, top 10, group by document; query vectors
    computed beforehand) on the primary and on each replica for `--queries` queries (the runbook questions,
    then chunk titles): identical hits and scores expected;
  * read-your-writes: `agentdb serve` reading from both replicas; a write (PATCH of a saved agent) then at once
    a retrieval sending the write's X-Agentdb-LSN as X-Agentdb-Min-LSN: the server's wait for a replica to
    replay it (Server-Timing lsn-wait), p50/p99, and who served the read;
  * failover: 8 clients read for 12 s while replica 1 is stopped (t=3 s), started (t=6 s), both are stopped
    (t=9 s) and started again (t=11 s): failed requests, and how long until the rotation follows each change;
  * repoint (also alone: `--only repoint`): a primary of its own crashes under 8 readers and a writer, a
    standby is promoted and DATABASE_URL_FILE rewritten: failed reads (target 0), failed writes (only between
    the crash and the move) and the outage of writes, all through one `agentdb serve` process;
  * throughput: 32 clients for `--seconds` with lexical retrievals against a server on the primary alone and
    one reading from the primary's two replicas, with the CPU time spent per request by the server process
    and by each PostgreSQL (primary, replicas).

Everything runs on this one machine (2 cores shared by the three servers, the HTTP server and the clients), so
more servers cannot mean more throughput here; the table says what the per-request CPU costs imply for
separate machines. Prints the tables and writes bench/results/replicas.json. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from _common import (
    CACHE,
    RESULTS,
    ROOT,
    connect,
    embedded_url,
    format_table,
    free_port,
    load_test,
    machine_facts,
    percentile,
    serve,
    versions,
)

QUESTIONS = ROOT / "examples" / "pgdocs" / "questions.jsonl"
SOURCE = "pgdocs"
TOP_K = 10


def start_server(
    url: str, port: int, replicas: list[str], url_file: Path | None = None
) -> subprocess.Popen[bytes]:
    """`agentdb serve` (this tree's) on 127.0.0.1:`port` reading from `replicas`, its primary named by `url`
    or, when given, by the file `url_file` (DATABASE_URL_FILE); waits until it answers."""
    env: dict[str, str | None] = {
        "DATABASE_URL": None if url_file is not None else url,
        "DATABASE_URL_FILE": str(url_file) if url_file is not None else None,
        "AGENTDB_REPLICA_URLS": ",".join(replicas),
        "AGENTDB_EMBED_INTERVAL_S": "0",
    }
    CACHE.mkdir(parents=True, exist_ok=True)
    return serve(  # the server's log, for a run that goes wrong
        port,
        env,
        log=CACHE / "replicas-serve.log",
        ready=lambda health: sum(r["in_rotation"] for r in health.json()["replicas"]) == len(replicas),
    )


def stop_server(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    server.wait(timeout=30)


def lexical(question: str) -> dict[str, Any]:
    return {
        "query": question,
        "queries": [{"table": SOURCE, "retrieval_mode": "lexical", "limit": TOP_K}],
        "steps": {"retrieval": {"expand_window": 1}},
    }


def load(data_dir: Path) -> str:
    """The primary's URL, with the demo corpus loaded (once)."""
    from agentdb.pack import import_pack
    from agentdb.sources import list_sources

    url = embedded_url(data_dir)
    with connect(url) as conn:
        if SOURCE not in {s.name for s in list_sources(conn)}:
            print("loading the demo corpus from its knowledge pack (once)", file=sys.stderr)
            pack = ROOT / "examples" / "pgdocs" / "pgdocs.pack.parquet"
            import_pack(conn, pack, embedding_model="all-MiniLM-L6-v2", source_name=SOURCE, progress=False)
    return url


def queries(url: str, count: int) -> list[str]:
    from agentdb.evaluation import load_questions

    found = [q.question for q in load_questions(QUESTIONS)]
    with connect(url) as conn:
        titles = conn.execute(
            "select distinct title from agentdb_docs.pgdocs where length(title) > 12 order by title limit %s",
            (count,),
        ).fetchall()
    return (found + [t[0] for t in titles])[:count]


def correctness(urls: dict[str, str], texts: list[str], vectors: np.ndarray) -> dict[str, Any]:
    """The same retrieve statement on every server: how many queries give identical hits (ids, ranks,
    scores) on each replica as on the primary."""
    statement = (
        "select agentdb.retrieve(source => %(source)s, query => %(query)s, query_embedding => %(vector)s,"
        " mode => 'hybrid', top_k => %(top_k)s, group_by_doc => true) -> 'hits'"
    )
    answers: dict[str, list[Any]] = {}
    for name, url in urls.items():
        with connect(url) if name == "primary" else _reader(url) as conn:
            answers[name] = [
                conn.execute(
                    statement, {"source": SOURCE, "query": text, "vector": vectors[i], "top_k": TOP_K}
                ).fetchone()
                for i, text in enumerate(texts)
            ]
    primary = answers.pop("primary")
    return {
        name: {
            "queries": len(texts),
            "identical": sum(a == b for a, b in zip(primary, got, strict=True)),
            "hits_compared": sum(len(a[0] or []) for a in primary),
        }
        for name, got in answers.items()
    }


def _reader(url: str) -> Any:
    import psycopg

    from agentdb.db.pool import configure

    conn = psycopg.connect(url, autocommit=True)
    configure(conn)
    return conn


def read_your_writes(port: int, texts: list[str], rounds: int) -> dict[str, Any]:
    import httpx

    waits: list[float] = []
    served: dict[str, int] = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        client.delete("/agents/ryw")
        created = client.post("/agents", json={"name": "ryw", "source": SOURCE, "retrieval_mode": "lexical"})
        assert created.status_code == 201, created.text
        for i in range(rounds):
            write = client.patch("/agents/ryw", json={"top_k": 1 + i % 10})
            assert write.status_code == 200, write.text
            read = client.post(
                "/agents/retrieval",
                json=lexical(texts[i % len(texts)]),
                headers={"X-Agentdb-Min-LSN": write.headers["X-Agentdb-LSN"]},
            )
            assert read.status_code == 200, read.text
            timing = read.headers.get("Server-Timing", "")
            waits.append(float(timing.split("dur=")[1]) if "dur=" in timing else 0.0)
            who = read.headers["X-Agentdb-Served-By"]
            served[who] = served.get(who, 0) + 1
        client.delete("/agents/ryw")
    return {
        "rounds": rounds,
        "wait_p50_ms": percentile(waits, 50),
        "wait_p99_ms": percentile(waits, 99),
        "wait_max_ms": max(waits),
        "waited": sum(w > 0 for w in waits),
        "served_by": served,
    }


def failover(port: int, data_dir: Path, texts: list[str], clients: int = 8) -> dict[str, Any]:
    """Readers keep reading while standbys stop and start; every response's server is recorded with its time."""
    import httpx

    from agentdb.db.standbys import list_standbys, start_standby, stop_standby

    log: list[tuple[float, str, int]] = []
    stop = threading.Event()
    begin = time.monotonic()

    def reader(offset: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            i = offset
            while not stop.is_set():
                try:
                    response = client.post("/agents/retrieval", json=lexical(texts[i % len(texts)]))
                    status, who = response.status_code, response.headers.get("X-Agentdb-Served-By", "?")
                except httpx.HTTPError:
                    status, who = 0, "?"
                log.append((time.monotonic() - begin, who, status))
                i += clients

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    events: dict[str, float] = {}
    standbys = {s.number: s for s in list_standbys(data_dir)}

    def at(second: float) -> None:
        time.sleep(max(0.0, begin + second - time.monotonic()))

    at(3)
    events["stop replica1"] = time.monotonic() - begin
    stop_standby(standbys[1])
    events["stopped replica1"] = time.monotonic() - begin
    at(6)
    events["start replica1"] = time.monotonic() - begin
    start_standby(data_dir, 1)
    events["started replica1"] = time.monotonic() - begin
    at(9)
    events["stop both"] = time.monotonic() - begin
    for number in (1, 2):
        stop_standby(list_standbys(data_dir)[number - 1])
    events["stopped both"] = time.monotonic() - begin
    at(11)
    events["start both"] = time.monotonic() - begin
    for number in (1, 2):
        start_standby(data_dir, number)
    events["started both"] = time.monotonic() - begin
    at(14)
    stop.set()
    for thread in threads:
        thread.join()

    def first(after: float, test: Any) -> float | None:
        return next((t - after for t, who, _ in sorted(log) if t >= after and test(who)), None)

    def last(after: float, before: float, who_is: str) -> float | None:
        times = [t for t, who, _ in log if after <= t < before and who == who_is]
        return max(times) - after if times else None

    return {
        "requests": len(log),
        "failed": sum(status != 200 for _, _, status in log),
        "events_s": {k: round(v, 3) for k, v in events.items()},
        # Counted from each command: replica 1's last answer after its stop began; the first answer by
        # replica 1 after its start began (the start itself takes about a second); the first by the primary
        # once both had stopped; the first by a replica after their start began.
        "replica1_last_answer_after_stop_s": last(
            events["stop replica1"], events["start replica1"], "replica1"
        ),
        "replica1_back_after_start_s": first(events["start replica1"], lambda who: who == "replica1"),
        "primary_serves_after_both_stopped_s": first(events["stopped both"], lambda who: who == "primary"),
        "replicas_back_after_start_s": first(events["start both"], lambda who: who.startswith("replica")),
        "served_by": {who: sum(1 for _, w, _ in log if w == who) for who in sorted({w for _, w, _ in log})},
    }


REPOINT_DOCS = 400


def repoint(clients: int = 8, seconds: float = 10.0) -> dict[str, Any]:
    """Failover end to end, with a primary of its own (a temporary data directory with a small synthetic source,
    so that the demo corpus's cluster stays intact) and two standbys; `agentdb serve` names its primary by
    DATABASE_URL_FILE. `clients` readers and one writer (a PATCH every 20 ms) run throughout; at 2 s the primary
    crashes (`pg_ctl stop -m immediate`, once both standbys have replayed everything), at 3 s a standby is
    promoted and the other made to follow it, at 3.5 s the file is rewritten. Counts failed reads and writes and
    times the outage of writes."""
    import random
    import shutil
    import tempfile

    import httpx
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    from agentdb.db.server import run_binary, start_embedded, stop_embedded
    from agentdb.db.standbys import start_standbys, stop_standbys
    from agentdb.sources import create_document_source

    words = ["backup", "restore", "wal", "vacuum", "index", "replica", "failover", "archive", "lock", "slot"]
    data_dir = Path(tempfile.mkdtemp(prefix="agentdb-bench-failover-"))
    server = None
    try:
        primary = start_embedded(data_dir)
        with connect(primary) as conn:
            create_document_source(conn, "ops", embedding_model="all-MiniLM-L6-v2", embedding_dim=384)
            rng = random.Random(3)
            with conn.cursor() as cur:
                cur.executemany(
                    "insert into agentdb_docs.ops (doc_id, chunk, title, text) values (%s, 0, %s, %s)",
                    [(f"d{i}", f"doc {i}", " ".join(rng.choices(words, k=12))) for i in range(REPOINT_DOCS)],
                )
        standbys = start_standbys(data_dir, 2)
        url_file = data_dir / "primary-url"
        url_file.write_text(primary + "\n")
        port = free_port()
        server = start_server(primary, port, [s.url() for s in standbys], url_file=url_file)
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as client:
            created = client.post("/agents", json={"name": "w", "source": "ops", "retrieval_mode": "lexical"})
            assert created.status_code == 201, created.text
        reads: list[tuple[float, str, int]] = []
        writes: list[tuple[float, float, int]] = []  # started, answered (s from the beginning), status
        stop = threading.Event()
        begin = time.monotonic()

        def reader(offset: int) -> None:
            with httpx.Client(base_url=base, timeout=60) as http:
                i = offset
                while not stop.is_set():
                    text = f"{words[i % len(words)]} {words[(i * 7) % len(words)]}"
                    body = {
                        "query": text,
                        "queries": [{"table": "ops", "full_text_search": text, "limit": 10}],
                    }
                    try:
                        response = http.post("/agents/retrieval", json=body)
                        status, who = response.status_code, response.headers.get("X-Agentdb-Served-By", "?")
                    except httpx.HTTPError:
                        status, who = 0, "?"
                    reads.append((time.monotonic() - begin, who, status))
                    i += clients

        def writer() -> None:
            with httpx.Client(base_url=base, timeout=60) as http:
                i = 0
                while not stop.is_set():
                    started = time.monotonic() - begin
                    try:
                        status = http.patch("/agents/w", json={"top_k": 1 + i % 10}).status_code
                    except httpx.HTTPError:
                        status = 0
                    writes.append((started, time.monotonic() - begin, status))
                    i += 1
                    stop.wait(0.02)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(clients)]
        threads.append(threading.Thread(target=writer))
        for thread in threads:
            thread.start()

        def at(second: float) -> None:
            time.sleep(max(0.0, begin + second - time.monotonic()))

        def lsn(url: str, function: str) -> int:
            with connect_plain(url) as conn:
                row = conn.execute(f"select {function}() - '0/0'::pg_lsn").fetchone()  # noqa: S608
            return int(row[0]) if row and row[0] is not None else 0

        events: dict[str, float] = {}
        at(2)
        end = lsn(primary, "pg_current_wal_lsn")
        for standby in standbys:
            while lsn(standby.url(), "pg_last_wal_replay_lsn") < end:
                time.sleep(0.01)
        events["crash"] = time.monotonic() - begin
        run_binary("pg_ctl", ("-w", "-D", str(data_dir / "pg"), "stop", "-m", "immediate"))
        at(3)
        leader, follower = sorted(standbys, key=lambda s: -lsn(s.url(), "pg_last_wal_receive_lsn"))
        events["promote"] = time.monotonic() - begin
        with connect_plain(leader.url()) as conn:
            conn.execute("select pg_promote()")
            conn.execute("select pg_create_physical_replication_slot(%s)", (follower.slot,))
        socket = conninfo_to_dict(leader.url())
        with connect_plain(follower.url()) as conn:
            conninfo = (
                f"host={socket['host']} port={socket['port']} user=postgres application_name={follower.name}"
            )
            conn.execute(sql.SQL("alter system set primary_conninfo = {}").format(sql.Literal(conninfo)))
            conn.execute("select pg_reload_conf()")
        at(3.5)
        events["file rewritten"] = time.monotonic() - begin
        tmp = url_file.with_suffix(".tmp")
        tmp.write_text(leader.url() + "\n")
        os.replace(tmp, url_file)
        at(seconds)
        stop.set()
        for thread in threads:
            thread.join()
    finally:
        if server is not None:
            stop_server(server)
        stop_standbys(data_dir)
        stop_embedded(data_dir, force=True)
        shutil.rmtree(data_dir, ignore_errors=True)

    def first_ok_write(after: float) -> float | None:
        """From `after` to the answer of the first successful write sent after it."""
        return next((end - after for t, end, status in sorted(writes) if t >= after and status == 200), None)

    failed_writes = [t for t, _, status in writes if status != 200]
    moved_after = first_ok_write(events["file rewritten"])
    moved_at = events["file rewritten"] + (moved_after if moved_after is not None else float("inf"))
    return {
        "reads": len(reads),
        "reads_failed": sum(status != 200 for _, _, status in reads),
        "writes": len(writes),
        "writes_failed": len(failed_writes),
        # Writes fail (503, Retry-After) only while no primary accepts them: from the crash to the move (the
        # first write answered after the file changed); none sent after that may fail.
        "writes_failed_after_move": sum(1 for t in failed_writes if t >= moved_at),
        "events_s": {k: round(v, 3) for k, v in events.items()},
        "write_outage_s": first_ok_write(events["crash"]),
        "first_write_after_file_s": moved_after,
        "reads_served_by": {
            w: sum(1 for _, who, _ in reads if who == w) for w in sorted({w for _, w, _ in reads})
        },
        # The promoted standby leaves the rotation: its last read counted from the promotion (reads under way
        # then may finish on it; none starts there once the monitor has seen it, within a check or two).
        "promoted_last_read_after_promotion_s": max(
            (t - events["promote"] for t, who, _ in reads if t > events["promote"] and who == leader.name),
            default=None,
        ),
    }


def connect_plain(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=5)


def print_repoint(result: dict[str, Any], clients: int) -> None:
    print(
        f"\nrepoint: {clients} readers and 1 writer; the primary crashes at 2 s, a standby is promoted at 3 s, "
        "DATABASE_URL_FILE rewritten at 3.5 s (the same agentdb serve process throughout)"
    )
    print(
        format_table(
            [
                "reads",
                "reads failed",
                "writes",
                "writes failed",
                "failed after the move",
                "write outage s",
                "first write after the file s",
                "promoted one's last read s",
            ],
            [
                [
                    result["reads"],
                    result["reads_failed"],
                    result["writes"],
                    result["writes_failed"],
                    result["writes_failed_after_move"],
                    _seconds(result["write_outage_s"]),
                    _seconds(result["first_write_after_file_s"]),
                    _seconds(result["promoted_last_read_after_promotion_s"]),
                ]
            ],
            left=0,
        )
    )


def postgres_cpu(pgdata: Path) -> float:
    """CPU seconds used so far by the server of `pgdata` and its children (backends, walsender, startup)."""
    from agentdb.db.server import read_postmaster

    postmaster = read_postmaster(pgdata)
    if postmaster is None or not postmaster.running:
        return 0.0
    total = 0.0
    process = psutil.Process(postmaster.pid)
    for proc in [process, *process.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def throughput(
    url: str, data_dir: Path, replicas: list[str], texts: list[str], clients: int, seconds: float
) -> dict[str, Any]:
    """The load test against a server with `replicas` (none: the primary alone), with CPU per request."""
    port = free_port()
    server = start_server(url, port, replicas)
    try:
        pgdatas = {"primary": data_dir / "pg"} | {
            f"replica{i}": data_dir / "replicas" / str(i) / "pg" for i in range(1, len(replicas) + 1)
        }
        app = psutil.Process(server.pid)
        cpu_before = {name: postgres_cpu(path) for name, path in pgdatas.items()}
        app_before = sum(app.cpu_times()[:2])
        run = asyncio.run(load_test(port, texts, lexical, clients, seconds))
        app_cpu = sum(app.cpu_times()[:2]) - app_before
        db_cpu = {name: postgres_cpu(path) - cpu_before[name] for name, path in pgdatas.items()}
    finally:
        stop_server(server)
    result = {
        "requests": run.requests,
        "errors": run.errors,
        "req_per_s": run.req_per_s,
        "p50_ms": run.p50_ms,
        "p99_ms": run.p99_ms,
        "served_by": run.served_by,
    }
    requests = max(run.requests, 1)
    return result | {
        "replicas": len(replicas),
        "app_cpu_ms_per_request": app_cpu * 1000 / requests,
        "db_cpu_ms_per_request": {name: cpu * 1000 / requests for name, cpu in db_cpu.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=200, help="queries for the correctness check")
    parser.add_argument("--rounds", type=int, default=200, help="write-then-read rounds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="per throughput run")
    parser.add_argument("--no-json", action="store_true")
    parser.add_argument(
        "--only",
        choices=("all", "repoint"),
        default="all",
        help="repoint: only the failover by DATABASE_URL_FILE (its own small cluster; writes "
        "bench/results/replicas-repoint.json)",
    )
    args = parser.parse_args()
    if args.only == "repoint":
        moved = repoint()
        print_repoint(moved, 8)
        if not args.no_json:
            RESULTS.mkdir(exist_ok=True)
            out = {"machine": machine_facts(), "repoint": moved}
            (RESULTS / "replicas-repoint.json").write_text(json.dumps(out, indent=2, default=float) + "\n")
            print(f"\nwrote {RESULTS / 'replicas-repoint.json'}")
        return 0

    from agentdb.db.server import stop_embedded
    from agentdb.db.standbys import start_standbys, stop_standbys
    from agentdb.embed import load_embedder

    data_dir = CACHE / "replicas"
    url = load(data_dir)
    texts = queries(url, args.queries)
    vectors = np.asarray(load_embedder().embed(texts), dtype=np.float32)
    try:
        standbys = start_standbys(data_dir, 2)
        replica_urls = [s.url() for s in standbys]
        time.sleep(1.0)  # let both replay what the load wrote
        urls = {"primary": url} | {s.name: s.url() for s in standbys}
        checked = correctness(urls, texts, vectors)
        port = free_port()
        server = start_server(url, port, replica_urls)
        try:
            ryw = read_your_writes(port, texts, args.rounds)
            fail = failover(port, data_dir, texts)
        finally:
            stop_server(server)
        moved = repoint()
        alone = throughput(url, data_dir, [], texts, args.clients, args.seconds)
        spread = throughput(url, data_dir, replica_urls, texts, args.clients, args.seconds)
        with connect(url) as conn:
            facts = machine_facts() | {"versions": versions(conn)}
    finally:
        stop_standbys(data_dir)
        stop_embedded(data_dir, force=True)

    print(f"\ncorrectness: hybrid top {TOP_K} by document, the same statement on each server")
    print(
        format_table(
            ["replica", "queries", "identical to the primary", "hits compared"],
            [[name, c["queries"], c["identical"], c["hits_compared"]] for name, c in checked.items()],
        )
    )
    print(f"\nread-your-writes: PATCH a saved agent, then a retrieval with its LSN ({ryw['rounds']} rounds)")
    print(
        format_table(
            ["wait p50 ms", "wait p99 ms", "wait max ms", "reads that waited", "served by"],
            [
                [
                    f"{ryw['wait_p50_ms']:.2f}",
                    f"{ryw['wait_p99_ms']:.2f}",
                    f"{ryw['wait_max_ms']:.2f}",
                    ryw["waited"],
                    ", ".join(f"{k} {v}" for k, v in ryw["served_by"].items()),
                ]
            ],
            left=0,
        )
    )
    print(
        "\nfailover: 8 readers; replica1 stopped at 3 s, started at 6 s; both stopped at 9 s, started at 11 s"
    )
    print(
        format_table(
            [
                "requests",
                "failed",
                "replica1 last answer after stop s",
                "replica1 back s",
                "primary serves s",
                "replicas back s",
            ],
            [
                [
                    fail["requests"],
                    fail["failed"],
                    _seconds(fail["replica1_last_answer_after_stop_s"]),
                    _seconds(fail["replica1_back_after_start_s"]),
                    _seconds(fail["primary_serves_after_both_stopped_s"]),
                    _seconds(fail["replicas_back_after_start_s"]),
                ]
            ],
            left=0,
        )
    )
    print_repoint(moved, 8)
    print(
        f"\nthroughput: {args.clients} clients, lexical top {TOP_K}, {args.seconds:.0f} s each, all on this machine"
    )
    rows = []
    for label, run in (("primary only", alone), ("primary + 2 replicas", spread)):
        rows.append(
            [
                label,
                f"{run['req_per_s']:.0f}",
                f"{run['p50_ms']:.1f}",
                f"{run['p99_ms']:.1f}",
                run["errors"],
                f"{run['app_cpu_ms_per_request']:.2f}",
                ", ".join(f"{k} {v:.2f}" for k, v in run["db_cpu_ms_per_request"].items()),
            ]
        )
    print(
        format_table(
            ["servers", "req/s", "p50 ms", "p99 ms", "errors", "server CPU ms/req", "PostgreSQL CPU ms/req"],
            rows,
        )
    )
    app_ms = spread["app_cpu_ms_per_request"]
    db_ms = sum(alone["db_cpu_ms_per_request"].values())
    projection = {
        "app_cpu_ms_per_request": app_ms,
        "db_cpu_ms_per_request": db_ms,
        "one_app_process_req_per_s": 1000 / app_ms if app_ms else None,
        "one_postgres_core_req_per_s": 1000 / db_ms if db_ms else None,
    }
    print(
        f"\nOn {os.cpu_count()} shared cores the three servers, the HTTP server and the clients compete, so replicas "
        "cannot add throughput here. Per request the HTTP server spent "
        f"{app_ms:.2f} ms of CPU and PostgreSQL {db_ms:.2f} ms: one server process tops out near "
        f"{projection['one_app_process_req_per_s'] or 0:.0f} req/s, and each PostgreSQL core serves about "
        f"{projection['one_postgres_core_req_per_s'] or 0:.0f} req/s, so on separate machines reads scale with the "
        "replicas' cores once there are enough server processes in front of them (two replicas: twice the "
        "primary's read capacity, and the primary's CPU left for writes)."
    )
    if not args.no_json:
        RESULTS.mkdir(exist_ok=True)
        out = {
            "machine": facts,
            "corpus": {"source": SOURCE, "queries": len(texts)},
            "correctness": checked,
            "read_your_writes": ryw,
            "failover": fail,
            "repoint": moved,
            "throughput": {
                "clients": args.clients,
                "seconds": args.seconds,
                "primary_only": alone,
                "with_2_replicas": spread,
            },
            "projection": projection,
        }
        (RESULTS / "replicas.json").write_text(json.dumps(out, indent=2, default=float) + "\n")
        print(f"\nwrote {RESULTS / 'replicas.json'}")
    return 0


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
