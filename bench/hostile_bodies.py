"""What keyless hostile bodies cost everyone else: `agentdb serve` (this tree's) on 127.0.0.1 with a principal,
8 keyless clients sending 30 MB JSON arrays of zeros without end (to retrieval, to a document upload, chunked,
and carried by a GET of /healthz), and meanwhile one client timing `GET /healthz` and another a keyed lexical
search, one request after another for `--seconds`. Prints p50/p99 of both, with and without the hostile
clients, and writes bench/results/hostile_bodies.json. A benchmark, not a test: nothing here fails for being
slow.

    .venv/bin/python bench/hostile_bodies.py
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import threading
import time
from typing import Any

import httpx
from _common import (
    CACHE,
    RESULTS,
    free_port,
    machine_facts,
    open_embedded,
    percentile,
    serve,
)
from psycopg.types.json import Jsonb

HOSTILE = 8


def prepare() -> tuple[str, str]:
    """A cached embedded database with a 200-document source `docs` and a principal; its URL and the key."""
    from agentdb.auth import create_principal, delete_principal, list_principals
    from agentdb.sources import create_document_source, get_source

    conn = open_embedded(CACHE / "hostile_bodies")
    url = conn.info.dsn
    try:
        get_source(conn, "docs")
    except Exception:  # noqa: BLE001 - absent on the first run
        create_document_source(conn, "docs", embedding_model="all-MiniLM-L6-v2", embedding_dim=384)
        for i in range(200):
            conn.execute(
                "insert into agentdb_docs.docs (doc_id, chunk, title, text, metadata) values (%s, 0, %s, %s, %s)",
                (f"d{i}", f"doc {i}", f"backup restore wal archive {i}", Jsonb({})),
            )
    for p in list_principals(conn):
        delete_principal(conn, p.name)
    key = create_principal(conn, "bench", tables=["docs"])[1]
    conn.close()
    return url, key


def hostile(port: int, head: bytes, chunked: bool, stop: Any) -> None:
    """Send `head` and zeros until the server answers or closes, then start again, until `stop`."""
    chunk = b"0," * 32768
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(head + (b"1\r\n[\r\n" if chunked else b"["))
                sock.settimeout(0.0)
                for _ in range(30_000_000 // len(chunk)):
                    if stop.is_set():
                        break
                    try:
                        if sock.recv(1, socket.MSG_PEEK):
                            break
                    except BlockingIOError:
                        pass
                    sock.settimeout(5.0)
                    sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                    sock.settimeout(0.0)
        except OSError:
            time.sleep(0.01)


def heads(port: int) -> list[tuple[bytes, bool]]:
    host = b"Host: 127.0.0.1:%d\r\nContent-Type: application/json\r\n" % port
    big = b"Content-Length: 30000001\r\n\r\n"
    return [
        (b"POST /agents/retrieval HTTP/1.1\r\n" + host + big, False),
        (b"GET /healthz HTTP/1.1\r\n" + host + big, False),
        (b"POST /sources/docs/documents HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n\r\n", True),
        (b"POST /sources/docs/documents HTTP/1.1\r\n" + host + big, False),
    ] * (HOSTILE // 4)


def measure(base: str, key: str, seconds: float) -> dict[str, list[float]]:
    """Latencies (ms) of /healthz and of a keyed search, each from its own client, for `seconds`."""
    search = {"query": "backup", "queries": [{"table": "docs", "full_text_search": "backup", "limit": 3}]}
    took: dict[str, list[float]] = {"healthz": [], "search": []}

    def run(name: str) -> None:
        headers = {"Authorization": f"Bearer {key}"} if name == "search" else {}
        with httpx.Client(base_url=base, timeout=120, headers=headers) as client:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.perf_counter()
                answer = (
                    client.post("/agents/retrieval", json=search)
                    if name == "search"
                    else client.get("/healthz")
                )
                assert answer.status_code == 200, answer.text
                took[name].append((time.perf_counter() - started) * 1000)

    threads = [threading.Thread(target=run, args=(name,)) for name in took]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    url, key = prepare()
    port = free_port()
    server = serve(port, {"DATABASE_URL": url, "AGENTDB_EMBED_INTERVAL_S": "0"})
    base = f"http://127.0.0.1:{port}"
    results: dict[str, Any] = {
        "machine": machine_facts(),
        "hostile_clients": HOSTILE,
        "seconds": args.seconds,
    }
    try:
        results["quiet"] = measure(base, key, args.seconds)
        # The attackers run in processes of their own: here they would take the measuring clients' turns.
        stop = multiprocessing.Event()
        attackers = [multiprocessing.Process(target=hostile, args=(port, h, c, stop)) for h, c in heads(port)]
        for process in attackers:
            process.start()
        results["under_attack"] = measure(base, key, args.seconds)
        stop.set()
        for process in attackers:
            process.join(15)
    finally:
        server.terminate()
        server.wait(10)
    summary = {
        phase: {
            name: {
                "n": len(ms),
                "p50_ms": percentile(ms, 50),
                "p99_ms": percentile(ms, 99),
                "max_ms": max(ms),
            }
            for name, ms in results[phase].items()
        }
        for phase in ("quiet", "under_attack")
    }
    for phase, names in summary.items():
        for name, row in names.items():
            print(
                f"{phase:13} {name:8} n={row['n']:5}  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms"
                f"  max {row['max_ms']:7.1f} ms"
            )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "hostile_bodies.json"
    out.write_text(json.dumps({"machine": results["machine"], "summary": summary}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
