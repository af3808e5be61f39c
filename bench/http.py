"""The HTTP door beside the Python API and SQL alone: what `POST /agents/retrieval` costs on top of the search.

    .venv/bin/python bench/http.py

On the demo corpus (the PostgreSQL manual, 9,182 chunks) with the runbook questions of
examples/pgdocs/questions.jsonl, for each retrieval mode (lexical, dense, hybrid) and neighbour expansion
window (3, the default, and 1), in the same run:

  * SQL only: one statement through psycopg, `agentdb.expand(.., (agentdb.retrieve(..)->'hits')::jsonb, window)` (or
    `agentdb.retrieve` alone for window 1), with the query vector computed beforehand: the database's work;
  * embed: the query embedding alone (dense and hybrid), as the server computes it;
  * Python API: `agentdb.retrieval.retrieve` then `agentdb.agent.expansion.expand`, embedding included;
  * HTTP: `agentdb serve` (uvicorn) on 127.0.0.1, one httpx client, keep-alive; and the request's own
    cost, HTTP minus SQL minus embed per question: everything the endpoint adds (routing, validation,
    connection checkout, the caller's and the source's lookups, building and sending the response).

Each latency is a question's best of `--repeat` passes (the least noisy estimate on a shared machine), then
p50/p95 over the questions. Then throughput: 1, 8 and 32 concurrent clients (asyncio + httpx) for
`--seconds` each per mode at the default window: requests per second, p50/p99 latency. Prints the tables and
writes bench/results/http.json. The first run loads the demo corpus from its knowledge pack into
bench/.cache/http (about 15 seconds). A benchmark, not a test: nothing here fails for being slow.
"""

from __future__ import annotations

import sys

if __name__ == "http":
    # Every bench script runs with bench/ first on sys.path, where this file stands in the way of the standard
    # library's `http` package (httpx, uvicorn and urllib import it): whoever imported `http` gets the real one.
    import importlib.machinery
    import importlib.util
    import sysconfig

    _spec = importlib.machinery.PathFinder.find_spec("http", [sysconfig.get_paths()["stdlib"]])
    assert _spec is not None and _spec.loader is not None
    _real = importlib.util.module_from_spec(_spec)
    sys.modules["http"] = _real
    _spec.loader.exec_module(_real)

import argparse
import asyncio
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    CACHE,
    RESULTS,
    ROOT,
    embedded_url,
    format_table,
    free_port,
    load_test,
    machine_facts,
    percentile,
    serve,
    time_systems,
    versions,
)

QUESTIONS = ROOT / "examples" / "pgdocs" / "questions.jsonl"
MODES = ("lexical", "dense", "hybrid")
WINDOWS = (3, 1)
TOP_K = 10  # the endpoint's default `limit`
THRESHOLD = 0.5  # and its defaults for the retrieval itself
RRF_K = 60


def body(question: str, mode: str, window: int) -> dict[str, Any]:
    return {
        "query": question,
        "queries": [{"table": "pgdocs", "retrieval_mode": mode, "limit": TOP_K}],
        "steps": {"retrieval": {"expand_window": window}},
    }


def throughput(port: int, questions: list[str], mode: str, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` concurrent clients, each sending its next request when the last is answered, for `seconds`."""
    run = asyncio.run(load_test(port, questions, lambda q: body(q, mode, WINDOWS[0]), clients, seconds))
    return {
        "mode": mode,
        "clients": clients,
        "requests": run.requests,
        "errors": run.errors,
        "seconds": round(run.seconds, 2),
        "req_per_s": run.req_per_s,
        "p50_ms": run.p50_ms,
        "p99_ms": run.p99_ms,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--repeat", type=int, default=3, help="passes; each latency is a question's best")
    parser.add_argument(
        "--clients",
        type=lambda text: [int(c) for c in text.split(",")],
        default=[1, 8, 32],
        help="concurrent clients of the throughput runs (default 1,8,32)",
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each throughput run")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-json", action="store_true", help="do not write bench/results/http.json")
    args = parser.parse_args()
    progress = not args.no_progress

    import httpx
    import psycopg

    from agentdb.agent.expansion import expand
    from agentdb.cli import main as agentdb_main
    from agentdb.cli.demo import DEMO_SOURCE
    from agentdb.db.pool import configure
    from agentdb.embed import load_embedder
    from agentdb.evaluation import load_questions
    from agentdb.retrieval import retrieve
    from agentdb.sources import get_source

    wall = time.perf_counter()
    url = embedded_url(CACHE / "http")
    os.environ["DATABASE_URL"] = url
    assert agentdb_main(["demo", "--no-serve"]) in (0, None)
    questions = [q.question for q in load_questions(args.questions)]
    n = len(questions)
    conn = psycopg.connect(url, autocommit=True)
    configure(conn)
    source = get_source(conn, DEMO_SOURCE)
    embedder = load_embedder(source.embedding_model)
    vectors = np.asarray(embedder.embed(questions), dtype=np.float32)
    chunks = conn.execute(f"select count(*) from agentdb_docs.{DEMO_SOURCE}").fetchone()  # noqa: S608
    port = free_port()
    server = serve(port, {"DATABASE_URL": url})
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    load_before = machine_facts()["load_average_1m"]

    def sql_only(mode: str, window: int) -> Any:
        retrieve_sql = (
            "agentdb.retrieve(source => %(source)s, query => %(query)s, query_embedding => %(vector)s,"
            " mode => %(mode)s, top_k => %(top_k)s, rrf_k => %(rrf_k)s, threshold => %(threshold)s,"
            " group_by_doc => true)"
        )
        statement = (
            f"select agentdb.expand(%(source)s, ({retrieve_sql} -> 'hits')::jsonb, %(window)s)"
            if window > 1
            else f"select {retrieve_sql}"
        )

        def run(i: int) -> Any:
            return conn.execute(
                statement,
                {
                    "source": DEMO_SOURCE,
                    "query": questions[i],
                    "vector": None if mode == "lexical" else vectors[i],
                    "mode": mode,
                    "top_k": TOP_K,
                    "rrf_k": RRF_K,
                    "threshold": THRESHOLD,
                    "window": window,
                },
            ).fetchone()

        return run

    def python_api(mode: str, window: int) -> Any:
        def run(i: int) -> Any:
            result = retrieve(
                conn,
                DEMO_SOURCE,
                questions[i],
                mode=mode,  # type: ignore[arg-type]
                top_k=TOP_K,
                threshold=THRESHOLD,
                rrf_k=RRF_K,
                group_by_doc=True,
            )
            return expand(conn, DEMO_SOURCE, result.hits, window) if window > 1 else result.hits

        return run

    def http(mode: str, window: int) -> Any:
        # Timed up to the response's bytes: parsing them is the client's cost, not the endpoint's.
        def run(i: int) -> Any:
            response = client.post("/agents/retrieval", json=body(questions[i], mode, window))
            assert response.status_code == 200, response.text
            return response.content

        return run

    def embed_one(i: int) -> Any:
        return embedder.embed([questions[i]])

    _, embed_ms, _ = time_systems(
        [("embed", embed_one)], n, desc="embed", repeat=args.repeat, progress=progress
    )
    rows: list[dict[str, Any]] = []
    for mode in MODES:
        for window in WINDOWS:
            answers, best, _ = time_systems(
                [
                    ("sql", sql_only(mode, window)),
                    ("python", python_api(mode, window)),
                    ("http", http(mode, window)),
                ],
                n,
                desc=f"{mode} window {window}",
                repeat=args.repeat,
                progress=progress,
            )
            embed = embed_ms["embed"] if mode != "lexical" else [0.0] * n
            own = [best["http"][i] - best["sql"][i] - embed[i] for i in range(n)]
            door = [best["http"][i] - best["python"][i] for i in range(n)]
            steps = [json.loads(a)["steps"][0]["duration_ms"] for a in answers["http"]]
            rows.append(
                {
                    "mode": mode,
                    "expand_window": window,
                    "sql_p50_ms": percentile(best["sql"], 50),
                    "embed_p50_ms": percentile(embed, 50),
                    "python_api_p50_ms": percentile(best["python"], 50),
                    "http_p50_ms": percentile(best["http"], 50),
                    "http_p95_ms": percentile(best["http"], 95),
                    "http_step_p50_ms": percentile(steps, 50),
                    "own_p50_ms": percentile(own, 50),
                    "own_p95_ms": percentile(own, 95),
                    "http_minus_python_p50_ms": percentile(door, 50),
                }
            )
    load_mid = machine_facts()["load_average_1m"]
    runs = [
        throughput(port, questions, mode, clients, args.seconds) for mode in MODES for clients in args.clients
    ]
    load_after = machine_facts()["load_average_1m"]
    client.close()
    server.terminate()
    server.wait(timeout=30)

    print(
        f"\nPOST /agents/retrieval on the demo corpus ({DEMO_SOURCE}, {chunks[0] if chunks else '?'} chunks), "
        f"{n} runbook questions, top {TOP_K} documents; uvicorn with "
        f"{'httptools' if importlib.util.find_spec('httptools') else 'h11'}, "
        f"{'uvloop' if importlib.util.find_spec('uvloop') else 'asyncio'}"
    )
    print(
        format_table(
            [
                "mode",
                "window",
                "SQL",
                "embed",
                "Python API",
                "HTTP",
                "HTTP p95",
                "step",
                "own",
                "own p95",
                "HTTP-API",
            ],
            [
                [
                    r["mode"],
                    r["expand_window"],
                    f"{r['sql_p50_ms']:.2f}",
                    f"{r['embed_p50_ms']:.2f}",
                    f"{r['python_api_p50_ms']:.2f}",
                    f"{r['http_p50_ms']:.2f}",
                    f"{r['http_p95_ms']:.2f}",
                    f"{r['http_step_p50_ms']:.2f}",
                    f"{r['own_p50_ms']:.2f}",
                    f"{r['own_p95_ms']:.2f}",
                    f"{r['http_minus_python_p50_ms']:.2f}",
                ]
                for r in rows
            ],
            left=2,
        )
    )
    print(
        "ms, p50 over the questions of each question's best of "
        f"{args.repeat} passes. SQL: retrieve (+ expand) as one statement through psycopg, query vector given;\n"
        "embed: the query embedding alone; Python API: agentdb.retrieval.retrieve (+ agentdb.agent.expansion.expand),\n"
        "embedding included; HTTP: agentdb serve on loopback, one keep-alive client; step: the query step's own\n"
        "duration_ms in the response (first pass); own: HTTP - SQL - embed per question (the endpoint's own cost);\n"
        "HTTP-API: HTTP - Python API per question (what the door adds to the same call from Python; unlike own, it\n"
        "leaves out the SQL running colder right after the model than in a loop of SQL alone)."
    )
    print(
        f"\nThroughput at expand_window {WINDOWS[0]} ({args.seconds:.0f} s per run; clients on the same machine)"
    )
    print(
        format_table(
            ["mode", "clients", "req/s", "p50", "p99", "errors"],
            [
                [
                    r["mode"],
                    r["clients"],
                    f"{r['req_per_s']:.1f}",
                    f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}",
                    r["errors"],
                ]
                for r in runs
            ],
            left=1,
        )
    )
    elapsed = time.perf_counter() - wall
    print(f"load average {load_before:.1f} -> {load_mid:.1f} -> {load_after:.1f}; whole run {elapsed:.0f} s")

    if not args.no_json:
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / "http.json"
        out.write_text(
            json.dumps(
                {
                    "benchmark": "http",
                    "machine": machine_facts(),
                    "versions": versions(conn, "fastapi", "uvicorn", "httpx", "pydantic", "orjson"),
                    "corpus": {
                        "source": DEMO_SOURCE,
                        "chunks": chunks[0] if chunks else None,
                        "questions": n,
                    },
                    "settings": {
                        "top_k": TOP_K,
                        "threshold": THRESHOLD,
                        "rrf_k": RRF_K,
                        "timing_passes": args.repeat,
                        "throughput_seconds": args.seconds,
                        "embedding_backend": getattr(embedder, "backend", None),
                        # what uvicorn picks when it can import them (uvicorn[standard]), else h11 and asyncio
                        "http_parser": "httptools" if importlib.util.find_spec("httptools") else "h11",
                        "event_loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
                    },
                    "latency": [
                        {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows
                    ],
                    "throughput": [
                        {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in runs
                    ],
                    "load_average_1m": {"before": load_before, "middle": load_mid, "after": load_after},
                    "run_seconds": round(elapsed, 1),
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {out.relative_to(ROOT)}")
    conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
