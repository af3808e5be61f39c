"""agentdb.retrieve with its statement kept prepared (agentdb_accel.execute_cached) beside the same statement planned
every call (PL/pgSQL's EXECUTE, agentdb.plan_cache = 'off'), on SciFact, in one run.

    .venv/bin/python bench/accel_plans.py                       # lexical, dense, hybrid; top 10 and top 100
    .venv/bin/python bench/accel_plans.py --modes lexical --depths 10 --clients 0

SciFact's corpus (8,993 chunks, the block layout, the default model's vectors: read from .agentdb/embeddings
when an earlier run computed them, else about 10 minutes of embedding) is loaded once into bench/.cache/accel_plans.
The query vectors come from bench/scifact.py's cache. For each mode and depth the variants alternate query by
query (which comes first alternates too) on one connection each, after every variant has warmed its statements;
each query's time is the wall time of the `select agentdb.retrieve(...)` round trip, the best of --repeat passes.
The variants: `execute` (parsed and planned every call) and `kept` (prepared once; these unfiltered statements
with a generic plan). Their hits must be the same, query by query; the run says so. Then lexical top 10's
throughput with --clients connections of each variant in turn. Writes bench/results/accel_plans.json. A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    CACHE,
    RESULTS,
    ROOT,
    SCIFACT,
    connect,
    embedded_url,
    format_table,
    machine_facts,
    percentile,
    scifact_missing,
    versions,
)

DATA_DIR = CACHE / "accel_plans"
SOURCE = "scifact"
RETRIEVE = (
    "select agentdb.retrieve(source => %s, query => %s, query_embedding => %s, mode => %s, top_k => %s,"
    " group_by_doc => %s, threshold => 0, output_results => false)::text"
)


def load(conn: psycopg.Connection[Any], dataset: Path) -> None:
    """SciFact's corpus as source `scifact` in the block layout, with the default model's vectors; once."""
    from agentdb.embed import load_embedder
    from agentdb.embed_cache import CachedEmbedder, cache_path
    from agentdb.ingest.pipeline import ingest
    from agentdb.ingest.readers import read_records
    from agentdb.sources import create_document_source

    if conn.execute("select 1 from agentdb.sources where name = %s", (SOURCE,)).fetchone():
        return
    corpus = dataset / "corpus.jsonl.gz"
    model = load_embedder()
    embedder = CachedEmbedder(model, cache_path(ROOT / ".agentdb" / "embeddings", model, corpus))
    create_document_source(
        conn, SOURCE, embedding_model=model.model_name, embedding_dim=model.dim, lexical_layout="blocks"
    )
    print(f"loading SciFact into {DATA_DIR} (vectors from {embedder.path} when it has them)")
    print(ingest(conn, SOURCE, read_records(corpus), embedder).summary())
    embedder.save()
    conn.execute("vacuum analyze")


def retrieve_hits(conn: psycopg.Connection[Any], text: str, vec: Any, mode: str, depth: int) -> Any:
    """The hits of one retrieve (top `depth`; a deep page groups by document, as bench/scifact.py's does)."""
    row = conn.execute(RETRIEVE, (SOURCE, text, vec, mode, depth, depth > 10)).fetchone()
    return json.loads(row[0])["hits"] if row else None


def throughput(url: str, name: str, texts: list[str], clients: int, seconds: float) -> float:
    """Lexical top 10 retrieves a second of `clients` connections of variant `name`, each looping over the
    queries (from its own offset) for `seconds`."""
    conns = [variant_conn(url, name) for _ in range(clients)]
    for conn in conns:
        for text in texts[:20]:
            retrieve_hits(conn, text, None, "lexical", 10)
    done = [0] * clients
    deadline = time.perf_counter() + seconds

    def loop(c: int) -> None:
        i = c * len(texts) // clients
        while time.perf_counter() < deadline:
            retrieve_hits(conns[c], texts[i % len(texts)], None, "lexical", 10)
            done[c] += 1
            i += 1

    threads = [threading.Thread(target=loop, args=(c,)) for c in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    for conn in conns:
        conn.close()
    return sum(done) / elapsed


def server_ms(conn: psycopg.Connection[Any], texts: list[str]) -> float:
    """Mean time in the server of a lexical top 10 retrieve over `texts`, in one transaction (the function's
    time as the backend counts it under track_functions: no client round trip). A function with SET clauses is
    counted twice a call, by the call and by the wrapper that applies its settings, each with about the whole
    time: the mean is the total over the calls counted."""
    with conn.transaction():
        conn.execute("set local track_functions = 'pl'")
        for text in texts:
            retrieve_hits(conn, text, None, "lexical", 10)
        row = conn.execute(
            "select pg_stat_get_xact_function_total_time(p.oid), pg_stat_get_xact_function_calls(p.oid)"
            " from pg_proc p where p.oid = 'agentdb.retrieve'::regproc"
        ).fetchone()
    assert row is not None and row[1] % len(texts) == 0, row
    return float(row[0]) / row[1]


def variant_conn(url: str, name: str) -> psycopg.Connection[Any]:
    conn = connect(url)
    if name == "execute":
        conn.execute("set agentdb.plan_cache = 'off'")
    return conn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument("--modes", default="lexical,dense,hybrid")
    parser.add_argument("--depths", default="10,100")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--clients", type=int, default=4, help="lexical top 10 throughput with this many clients"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="each throughput round's length")
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args()
    if scifact_missing(args.dataset):
        return 2
    from scifact import query_embeddings

    from agentdb.evaluation import load_qrels, load_queries
    from agentdb.sources import get_source

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    url = embedded_url(DATA_DIR)
    admin = connect(url)
    load(admin, args.dataset)
    source = get_source(admin, SOURCE)
    queries, qrels = (
        load_queries(args.dataset / "queries.jsonl"),
        load_qrels(args.dataset / "qrels" / "test.tsv"),
    )
    qids = [q for q in queries if q in qrels][: args.queries]
    texts = [queries[q] for q in qids]
    vectors, _ = query_embeddings(
        [q for q in queries if q in qrels],
        [queries[q] for q in queries if q in qrels],
        source.embedding_backends,
    )
    vectors = vectors[: len(qids)]

    names = ["execute", "kept"]
    conns = {name: variant_conn(url, name) for name in names}
    rows: list[list[Any]] = []
    report: dict[str, Any] = {}
    for mode in args.modes.split(","):
        for depth in (int(d) for d in args.depths.split(",")):

            def call(conn: psycopg.Connection[Any], i: int, mode: str = mode, depth: int = depth) -> Any:
                return retrieve_hits(conn, texts[i], None if mode == "lexical" else vectors[i], mode, depth)

            for conn in conns.values():  # warm: every statement prepared, generic plans chosen where they are
                for i in range(min(20, len(qids))):
                    call(conn, i)
            best: dict[str, list[float]] = {n: [float("inf")] * len(qids) for n in names}
            differ = 0
            for r in range(args.repeat):
                for i in range(len(qids)):
                    order = names if (i + r) % 2 == 0 else names[::-1]
                    hits = {}
                    for name in order:
                        started = time.perf_counter()
                        hits[name] = call(conns[name], i)
                        best[name][i] = min(best[name][i], (time.perf_counter() - started) * 1000)
                    if r == 0:
                        want = [(h["id"], h["chunk"], round(h["score"], 9)) for h in hits["execute"]]
                        differ += any(
                            [(h["id"], h["chunk"], round(h["score"], 9)) for h in hits[n]] != want
                            for n in names
                        )
            key = f"{mode} top {depth}"
            report[key] = {
                n: {"p50_ms": percentile(best[n], 50), "p95_ms": percentile(best[n], 95)} for n in names
            }
            report[key]["queries_with_different_hits"] = differ
            rows.append(
                [
                    key,
                    *[f"{percentile(best[n], 50):.2f} / {percentile(best[n], 95):.2f}" for n in names],
                    differ,
                ]
            )
            print(rows[-1], flush=True)
    # Lexical top 10 in the server: blocks of 50 queries, the variants alternating block by block, twice.
    served: dict[str, list[float]] = {n: [] for n in names}
    for r in range(2):
        for start in range(0, len(texts), 50):
            for name in names if (start // 50 + r) % 2 == 0 else names[::-1]:
                served[name].append(server_ms(conns[name], texts[start : start + 50]))
    report["server_lexical_top10_mean_ms"] = {n: float(statistics.median(v)) for n, v in served.items()}
    rows.append(
        [
            "lexical top 10 in the server, mean ms (median block)",
            *[f"{statistics.median(served[n]):.2f}" for n in names],
            "",
        ]
    )
    # What each kept variant's connection holds now: its statements, their memory, how many have a generic plan.
    held = {
        n: conns[n]
        .execute(
            "select count(*), coalesce(sum(bytes), 0)::bigint, count(*) filter (where generic_plan),"
            " coalesce(max(bytes), 0) from agentdb_accel.cached_plans()"
        )
        .fetchone()
        for n in names
        if n != "execute"
    }
    report["kept"] = {
        n: dict(zip(("statements", "bytes", "generic_plans", "largest_bytes"), v, strict=True))
        for n, v in held.items()
        if v
    }
    print("kept statements per connection:", report["kept"])
    # Throughput: the variants in turn, twice (EXECUTE, kept, EXECUTE, kept...), the best round of each.
    rates: dict[str, float] = {}
    if args.clients > 0:
        for _ in range(2):
            for name in names:
                rates[name] = max(
                    rates.get(name, 0.0), throughput(url, name, texts, args.clients, args.seconds)
                )
        report["throughput_lexical_top10"] = {"clients": args.clients, "seconds": args.seconds, **rates}
        rows.append([f"lexical top 10, {args.clients} clients, q/s", *[f"{rates[n]:.0f}" for n in names], ""])
    facts = machine_facts()
    print(
        f"\nSciFact through agentdb.retrieve, {len(qids)} queries, best of {args.repeat}, p50 / p95 ms"
        f" (load average {facts['load_average_1m']}):"
    )
    print(format_table(["", "EXECUTE", "kept", "differ"], rows))
    if not args.no_json:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "accel_plans.json").write_text(
            json.dumps(
                {"machine": facts, "versions": versions(admin), "queries": len(qids), "results": report},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
