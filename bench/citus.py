"""One node against a Citus coordinator with 2 workers, on this machine, same run, same queries: SciFact (and,
with --synthetic N, N chunks of SciFact-text built as bench/scale.py builds them).

    .venv/bin/python bench/citus.py                       # SciFact
    .venv/bin/python bench/citus.py --synthetic 100000    # and 100k scifact-text chunks
    .venv/bin/python bench/citus.py --synthetic 1000000 --reuse-scifact --output bench/results/citus_1m.json
    .venv/bin/python bench/citus.py --synthetic 100000 --cluster-layout blocks --output bench/results/citus_blocks.json

The single node is an embedded server of its own (bench/.cache/citus/one); the cluster is made by `agentdb
start --workers 2` (bench/.cache/citus/cluster; Citus built once from AGENTDB_CITUS_SOURCE or --citus-source)
and stopped at the end unless --keep. Both load the same documents through agentdb's ingest pipeline (on the
cluster the writer keeps the postings and statistics in the writing transaction), the single node's postings in
blocks (its default), the cluster's in --cluster-layout (rows, a coordinator's default, or blocks: each shard's
read by the C cursor on its worker; a source loaded in the other layout is moved, `agentdb optimize --layout`); SciFact's chunk vectors come
from the clone's embedding cache (.agentdb/embeddings; a cold cache is filled by a first load into the single
node, which is then loaded again, so neither loading rate includes the embedding model). Then, for lexical,
dense and hybrid (RRF, threshold 0; query vectors computed beforehand):

  * quality: nDCG@10 on SciFact's 300 test queries (top 100 grouped by document, as bench/scifact.py), and
    every query's hits compared between the two (ids, chunks, order, scores within 1e-9); a difference is
    printed with its query and the run exits with status 1;
  * latency: p50/p95 of top 10, each system's queries in a block, best of --repeat passes per query; and the
    cluster's lexical leg beside itself without pruning (every shard summing every posting of the query's
    terms, as before MaxScore ran on each shard), whose hits must be the same;
  * throughput: 1 and 8 clients (threads, a connection each) for --seconds per mode and system;
  * fan-out: for --fanout-queries queries per mode, the coordinator's wall time against the time of each
    statement it sent to a shard (captured with citus.log_remote_commands, then run alone on that shard's
    worker): the slowest shard of each step, the sum over shards, and what is left for the coordinator
    (planning, connections, intermediate results, merge, fusion and the page).

Everything shares 2 cores, so the cluster cannot be faster here; the figures are for the projection in
docs/scale-out.md. Writes bench/results/citus.json (or --output). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
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
    time_systems,
    versions,
)
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agentdb.db.distribute import SHARD_COUNT as SHARDS  # every distributed source's shards

DATA = CACHE / "citus"
SCIFACT_SOURCE = "scifact"
SYNTHETIC_SOURCE = "scifact_text"
N_DOCS = 5183
MODES = ("lexical", "dense", "hybrid")
SYSTEMS = ("one node", "cluster")
DEPTH = 100  # the quality run: top 100 grouped by document, as bench/scifact.py
TOP_K = 10  # latency, throughput and fan-out
CLIENTS = (1, 8)
# The cluster's lexical leg beside itself without pruning: a seed budget no query's postings reach, on the SQL
# path, so every shard sums every posting of the query's terms (what the cluster did before MaxScore ran on each
# shard).
UNPRUNED = "cluster lexical, every posting summed"
NO_PRUNING = "-c agentdb.lexical_seed_postings=1000000000000 -c agentdb.lexical_path=sql"
SCORE_TOLERANCE = 1e-9
SHARD_NAME = re.compile(r"_\d{6,}\b")  # a shard's table: the distributed table's name and the shard id
SERVER = re.compile(r"@(?P<host>.*):(?P<port>\d+) connectionId")

Hits = list[tuple[str, int, float]]  # (document id, chunk, score) in rank order


def start_cluster(data_dir: Path, citus_source: str | None) -> str:
    """The coordinator's URL once `agentdb start --workers 2` has it (and its workers) running."""
    from agentdb.cli import main
    from agentdb.db.server import server_status

    args = ["start", "--workers", "2", "--data-dir", str(data_dir)]
    if citus_source:
        args += ["--citus-source", citus_source]
    if main(args) != 0:
        raise SystemExit("agentdb start --workers 2 failed (see above)")
    url = server_status(data_dir).url()
    assert url is not None
    return url


def documents_in(conn: psycopg.Connection[Any], name: str) -> int:
    from agentdb.sources import get_source

    if not conn.execute("select 1 from agentdb.sources where name = %s", (name,)).fetchone():
        return 0
    row = conn.execute(
        sql.SQL("select count(distinct doc_id) from {}").format(get_source(conn, name).table)
    ).fetchone()
    return int(row[0]) if row else 0


def has_vector_index(conn: psycopg.Connection[Any], name: str) -> bool:
    """Whether source `name`'s table has its HNSW index, which an ingestion builds last: a load stopped during
    the build leaves every row and no index."""
    from agentdb.sources import get_source
    from agentdb.sources.vector_index import vector_indexes

    return bool(vector_indexes(conn, get_source(conn, name)))


def load(
    conn: psycopg.Connection[Any],
    system: str,
    name: str,
    expected: int,
    records: Callable[[], Any],
    embedder: Any,
    layout: Literal["rows", "blocks"],
) -> dict[str, Any]:
    """Source `name` holding `expected` documents, its postings in `layout`: reused when it does (with the
    timings of the load that made it; moved to `layout` first if need be, timed on its own), else loaded from
    scratch through agentdb's ingest pipeline. A load that had to compute chunk vectors
    (a cold embedding cache) is dropped and done again from the cache, so its rate is the writer's alone. A
    source whose load was stopped during its HNSW build (every document written, no vector index) gets the
    index built, timed on its own; that load's rate is then not known (`chunks_per_s` null)."""
    from agentdb.ingest.pipeline import ingest
    from agentdb.sources import drop_source, get_source
    from agentdb.sources.vector_index import ensure_vector_index

    saved = DATA / f"load-{name}-{system.replace(' ', '-')}.json"
    complete = documents_in(conn, name) == expected
    if complete and get_source(conn, name).lexical_layout != layout:
        print(f"{system}: moving source {name!r} to the {layout} layout")
        started = time.perf_counter()
        conn.execute("select agentdb.lexical_set_layout(%s, %s)", (name, layout))
        moved = round(time.perf_counter() - started, 2)
        print(f"{system}: moved in {moved} s")
        if saved.exists():
            saved.write_text(json.dumps({**json.loads(saved.read_text()), "layout_move_seconds": moved}))
    if complete and not has_vector_index(conn, name):
        print(f"{system}: source {name!r} holds its {expected} documents but no vector index: building it")
        started = time.perf_counter()
        ensure_vector_index(conn, get_source(conn, name))
        info = {
            "documents": expected,
            "chunks": None,
            "seconds": None,
            "chunks_per_s": None,
            "vector_index_seconds": round(time.perf_counter() - started, 2),
            "measured_at": machine_facts()["date"],
        }
        saved.write_text(json.dumps(info))
        return {**info, "reused": True}
    if complete and saved.exists() and json.loads(saved.read_text())["documents"] == expected:
        print(f"{system}: reusing source {name!r} ({expected} documents)")
        return {**json.loads(saved.read_text()), "reused": True}
    for _ in range(2):
        if conn.execute("select 1 from agentdb.sources where name = %s", (name,)).fetchone():
            drop_source(conn, name)
        computed = embedder.misses if embedder is not None else 0
        load_before = machine_facts()["load_average_1m"]
        report = ingest(conn, name, records(), embedder, lexical_layout=layout)
        computed = (embedder.misses if embedder is not None else 0) - computed
        if computed == 0:
            break
        print(f"{system}: {computed} chunk vectors were computed; loading again from the cache")
        embedder.save()
    print(f"{system}: {report.summary()}")
    info = {
        "layout": layout,
        "documents": report.documents,
        "chunks": report.chunks,
        "seconds": round(report.seconds, 2),
        "chunks_per_s": round(report.chunks / report.seconds, 1),
        "load_average_1m": {"before": load_before, "after": machine_facts()["load_average_1m"]},
        "measured_at": machine_facts()["date"],
    }
    saved.write_text(json.dumps(info))
    return {**info, "reused": False}


def load_rate(load: dict[str, Any]) -> str:
    """A load's rate as printed; a load resumed at its vector index (load()) has none."""
    if load["chunks_per_s"] is None:
        return f"not measured (an earlier load; its vector index built in {load['vector_index_seconds']} s)"
    return f"{load['chunks_per_s']} chunks/s"


def search(
    conn: psycopg.Connection[Any], source: str, text: str, vector: np.ndarray, mode: str, top_k: int
) -> Hits:
    from agentdb.retrieval import retrieve

    result = retrieve(
        conn,
        source,
        text,
        mode=mode,  # type: ignore[arg-type]
        top_k=top_k,
        threshold=0.0,
        group_by_doc=top_k == DEPTH,
        query_embedding=None if mode == "lexical" else vector,
    )
    return [(h.id, h.chunk, h.score) for h in result.hits]


def differences(one: list[Hits], cluster: list[Hits]) -> list[dict[str, Any]]:
    """The queries whose hits differ between the systems: other ids, chunks or order, or a score off by more
    than SCORE_TOLERANCE; each with the first rank where they part."""
    found = []
    for i, (a, b) in enumerate(zip(one, cluster, strict=True)):
        same_keys = [(d, c) for d, c, _ in a] == [(d, c) for d, c, _ in b]
        if same_keys and all(abs(x[2] - y[2]) <= SCORE_TOLERANCE for x, y in zip(a, b, strict=True)):
            continue
        rank = next(
            (
                r
                for r, (x, y) in enumerate(zip(a, b, strict=False))
                if x[:2] != y[:2] or abs(x[2] - y[2]) > SCORE_TOLERANCE
            ),
            min(len(a), len(b)),
        )
        found.append(
            {
                "query": i,
                "rank": rank + 1,
                "hits": (len(a), len(b)),
                "one_node": a[rank] if rank < len(a) else None,
                "cluster": b[rank] if rank < len(b) else None,
            }
        )
    return found


def throughput(
    url: str, source: str, texts: list[str], vectors: np.ndarray, mode: str, clients: int, seconds: float
) -> dict[str, Any]:
    """`clients` threads, each on a connection of its own, searching (top 10) one query after another for
    `seconds`; queries completed per second and their latency."""
    from agentdb.db.pool import configure

    conns = []
    for _ in range(clients):
        conn = psycopg.connect(url, autocommit=True)
        configure(conn)
        conns.append(conn)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        start.wait()
        i = k
        try:
            while time.perf_counter() < end:
                began = time.perf_counter()
                search(conns[k], source, texts[i % len(texts)], vectors[i % len(texts)], mode, TOP_K)
                latencies[k].append((time.perf_counter() - began) * 1000)
                i += clients
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    end = time.perf_counter() + seconds
    began = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    for conn in conns:
        conn.close()
    if errors:
        raise errors[0]
    done = [x for part in latencies for x in part]
    return {
        "clients": clients,
        "queries": len(done),
        "seconds": round(elapsed, 2),
        "qps": round(len(done) / elapsed, 2),
        "p50_ms": round(percentile(done, 50), 2),
        "p95_ms": round(percentile(done, 95), 2),
    }


def best_ms(run: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        best = min(best, (time.perf_counter() - began) * 1000)
    return best


def fanout(
    urls: dict[str, str],
    workers: dict[tuple[str, int], str],
    source: str,
    texts: list[str],
    vectors: np.ndarray,
    mode: str,
    n: int,
    repeat: int,
) -> dict[str, Any]:
    """Where a query's time goes on the cluster. Each of `n` queries (top 10): its wall time on the coordinator
    and on one node (best of `repeat`), then once with citus.log_remote_commands, which names every statement
    sent to a worker. Each SELECT on a shard is then run alone on its worker (best of `repeat`), as the
    coordinator sends it (constants for the parameters, the worker's own settings). Statements that read the
    coordinator's intermediate results (read_intermediate_result, only there during the query) cannot run
    alone and are counted, not timed. A step is a set of statements equal but for the shard."""
    from agentdb.db.pool import configure

    notices: list[tuple[str, str]] = []
    coord = psycopg.connect(urls["cluster"], autocommit=True)
    configure(coord)
    coord.add_notice_handler(lambda d: notices.append((d.message_primary or "", d.message_detail or "")))
    one = psycopg.connect(urls["one node"], autocommit=True)
    configure(one)
    shard_conns = {key: psycopg.connect(url, autocommit=True) for key, url in workers.items()}
    for conn in shard_conns.values():
        configure(conn)
    rows = []
    example: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()  # worker connections (host, port, Citus's connection id) so far
    for i in range(n):
        text, vector = texts[i], vectors[i]
        wall = best_ms(lambda t=text, v=vector: search(coord, source, t, v, mode, TOP_K), repeat)
        single = best_ms(lambda t=text, v=vector: search(one, source, t, v, mode, TOP_K), repeat)
        notices.clear()
        used: set[tuple[str, str, str]] = set()
        coord.execute("set citus.log_remote_commands = on")
        search(coord, source, text, vector, mode, TOP_K)
        coord.execute("set citus.log_remote_commands = off")
        steps: dict[str, list[float]] = {}
        untimed = statements = broadcasts = local = 0
        for message, detail in notices:
            command = message.removeprefix("issuing ")
            server = SERVER.search(detail)
            local += message.startswith("executing the command locally")
            broadcasts += command.startswith("COPY") and "(format result)" in command
            if server is not None:
                used.add((server["host"], server["port"], detail.rsplit(" ", 1)[-1]))
            if command == message or server is None or not SHARD_NAME.search(command):
                continue  # transaction control, distributed transaction ids, other notices
            statements += 1
            if (
                not command.lstrip().lower().startswith(("select", "with"))
                or "read_intermediate_result" in command
            ):
                untimed += 1
                continue
            conn = shard_conns[(server["host"], int(server["port"]))]
            try:
                took = best_ms(lambda c=conn, q=command: c.execute(q).fetchall(), repeat)
            except psycopg.Error:  # a statement that does not run alone (parameters sent apart from it)
                untimed += 1
                continue
            steps.setdefault(SHARD_NAME.sub("_N", command), []).append(took)
        if i == 0:
            example = [
                {"statement": step[:300], "shards": len(times), "ms": [round(t, 3) for t in times]}
                for step, times in steps.items()
            ]
        slowest = sum(max(times) for times in steps.values())
        opened = len(used - seen)
        seen |= used
        rows.append(
            {
                "worker_connections_opened": opened,
                "intermediate_result_broadcasts": broadcasts,
                "statements_run_on_the_coordinator": local,
                "coordinator_ms": wall,
                "one_node_ms": single,
                "shard_statements": statements,
                "untimed_statements": untimed,
                "timed_steps": len(steps),
                "per_shard_ms": float(np.median([t for times in steps.values() for t in times]))
                if steps
                else 0.0,
                "slowest_shard_per_step_ms": slowest,
                "sum_over_shards_ms": sum(sum(times) for times in steps.values()),
                "coordinator_rest_ms": wall - slowest,
            }
        )
    for conn in (coord, one, *shard_conns.values()):
        conn.close()
    keys = [k for k in rows[0] if k.endswith("_ms")]
    summary: dict[str, Any] = {
        "queries": n,
        **{f"{k}_p50": round(percentile([r[k] for r in rows], 50), 3) for k in keys},
    }
    counts = [k for k in rows[0] if not k.endswith("_ms")]
    for k in counts:
        summary[k] = float(np.median([r[k] for r in rows]))
    return {**summary, "first_query_steps": example}


def synthetic_records(
    size: int, seed: int, dataset: Path
) -> tuple[Callable[[], Any], Callable[[], np.ndarray]]:
    """bench/scale.py's scifact-text chunks (SciFact sentences of an abstract and its related abstracts) with
    seeded random unit vectors, one chunk per document, as ingest records; and the query vectors (a stored
    vector plus noise, as bench/scale.py makes them), read from the vectors made here."""
    from scale import DIM, real_texts, related_documents, unit_vectors

    from agentdb.ingest.readers import Located

    sentences, neighbours = related_documents(dataset, 5)
    texts = real_texts(np.random.default_rng([seed, size, 1]), sentences, neighbours, size, 80, 240)
    vectors = unit_vectors(np.random.default_rng([seed, size, 2]), size)

    def records() -> Any:
        for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
            record = {"id": f"s{i:08d}", "text": text, "embedding": vector.tolist()}
            yield Located("synthetic", i + 1, record)

    def query_vectors(n: int) -> np.ndarray:
        rng = np.random.default_rng([seed, size, 3])
        base = vectors[rng.choice(size, n, replace=False)]
        q = base + unit_vectors(rng, n) * 0.75
        assert q.shape[1] == DIM
        return q / np.linalg.norm(q, axis=1, keepdims=True)

    return records, query_vectors


class PrecomputedVectors:
    """The embedder of a corpus whose records carry their vectors: it names the model (the source is created
    for it, as by any first ingest) and embeds nothing."""

    model_name = "all-MiniLM-L6-v2"
    dim = 384
    backend = "precomputed"
    misses = 0

    def embed(self, texts: list[str], *, batch_size: int = 64) -> np.ndarray:
        raise AssertionError("every synthetic record carries its vector")

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        raise AssertionError("every synthetic record is one chunk")


def time_modes(
    conns: dict[str, psycopg.Connection[Any]],
    source: str,
    texts: list[str],
    vectors: np.ndarray,
    repeat: int,
    progress: bool,
) -> dict[str, dict[str, Any]]:
    """p50/p95 of top 10 per mode and system, each system's queries in a block."""
    systems = [
        (
            f"{system} {mode}",
            lambda i, c=conns[system], m=mode: search(c, source, texts[i], vectors[i], m, TOP_K),
        )
        for mode in MODES
        for system in SYSTEMS
    ]
    _, best, _ = time_systems(
        systems, len(texts), desc=f"{source} top {TOP_K}", repeat=repeat, progress=progress
    )
    return {
        name: {"p50_ms": round(percentile(times, 50), 2), "p95_ms": round(percentile(times, 95), 2)}
        for name, times in best.items()
    }


def compare_hits(
    conns: dict[str, psycopg.Connection[Any]],
    source: str,
    texts: list[str],
    vectors: np.ndarray,
    top_k: int,
    progress: bool,
) -> tuple[dict[str, dict[str, list[Hits]]], dict[str, list[dict[str, Any]]]]:
    """Every query in every mode on both systems; the hits, and the queries whose hits differ, by mode."""
    from tqdm import tqdm

    hits: dict[str, dict[str, list[Hits]]] = {mode: {s: [] for s in SYSTEMS} for mode in MODES}
    bar = tqdm(
        total=len(MODES) * len(SYSTEMS) * len(texts), desc=f"{source} top {top_k}, both", disable=not progress
    )
    for mode in MODES:
        for system in SYSTEMS:
            for text, vector in zip(texts, vectors, strict=True):
                hits[mode][system].append(search(conns[system], source, text, vector, mode, top_k))
                bar.update()
    bar.close()
    return hits, {mode: differences(hits[mode]["one node"], hits[mode]["cluster"]) for mode in MODES}


def report_differences(
    found: dict[str, list[dict[str, Any]]], texts: list[str], qids: list[str] | None
) -> bool:
    """Print every query whose hits differ; whether there was one."""
    for mode, rows in found.items():
        for row in rows:
            query = qids[row["query"]] if qids else row["query"]
            print(
                f"DIFFERENT {mode} query {query} {texts[row['query']]!r}: first at rank {row['rank']} "
                f"(hits {row['hits'][0]} vs {row['hits'][1]}): one node {row['one_node']}, cluster {row['cluster']}"
            )
    return any(found.values())


def measure(
    label: str,
    urls: dict[str, str],
    conns: dict[str, psycopg.Connection[Any]],
    workers: dict[tuple[str, int], str],
    source: str,
    texts: list[str],
    vectors: np.ndarray,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Latency, throughput and fan-out of one corpus on both systems; the cluster's lexical leg also without
    pruning (UNPRUNED), whose hits must be the pruned one's."""
    progress = not args.no_progress
    latency = time_modes(conns, source, texts, vectors, args.repeat, progress)
    unpruned_url = make_conninfo(urls["cluster"], options=NO_PRUNING)
    unpruned = connect(unpruned_url)
    pair = [
        (name, lambda i, c=conn: search(c, source, texts[i], vectors[i], "lexical", TOP_K))
        for name, conn in (("cluster lexical", conns["cluster"]), (UNPRUNED, unpruned))
    ]
    first, best, _ = time_systems(
        pair, len(texts), desc=f"{source} pruned or not", repeat=args.repeat, progress=progress
    )
    unpruned.close()
    latency[UNPRUNED] = {
        "p50_ms": round(percentile(best[UNPRUNED], 50), 2),
        "p95_ms": round(percentile(best[UNPRUNED], 95), 2),
    }
    same = sum(a == b for a, b in zip(first["cluster lexical"], first[UNPRUNED], strict=True))
    print(f"{label}: cluster lexical pruned and {UNPRUNED}: the same hits on {same} of {len(texts)} queries")
    rates: dict[str, list[dict[str, Any]]] = {}
    for name, url, mode in [(s, urls[s], m) for m in MODES for s in SYSTEMS] + [
        (UNPRUNED, unpruned_url, "lexical")
    ]:
        key = name if name == UNPRUNED else f"{name} {mode}"
        for clients in CLIENTS:
            rate = throughput(url, source, texts, vectors, mode, clients, args.seconds)
            print(f"{label} {key}, {clients} client(s): {rate['qps']} q/s, p50 {rate['p50_ms']} ms")
            rates.setdefault(key, []).append(rate)
    fan = {}
    for mode in MODES:
        fan[mode] = fanout(urls, workers, source, texts, vectors, mode, args.fanout_queries, 3)
        print(f"{label} fan-out {mode}: {fan[mode]}")
    return {
        "latency_top10": latency,
        "throughput": rates,
        "fanout": fan,
        "unpruned_same_hits": {"queries": len(texts), "same": same},
    }


def print_corpus(label: str, out: dict[str, Any]) -> None:
    rows = []
    for mode in MODES:
        for name in [f"{system} {mode}" for system in SYSTEMS] + ([UNPRUNED] if mode == "lexical" else []):
            if name not in out["latency_top10"]:  # (a run before the unpruned row)
                continue
            lat, rate = out["latency_top10"][name], out["throughput"][name]
            system = name.removesuffix(f" {mode}")
            quality = out.get("ndcg10", {}).get(mode, {}).get(system) if system in SYSTEMS else None
            rows.append(
                [
                    name,
                    "" if quality is None else f"{quality:.4f}",
                    f"{lat['p50_ms']:.2f}",
                    f"{lat['p95_ms']:.2f}",
                    *(f"{r['qps']:.1f}" for r in rate),
                ]
            )
    print(f"\n{label}")
    print(
        format_table(["system, mode", "nDCG@10", "p50 ms", "p95 ms", "q/s 1 client", "q/s 8 clients"], rows)
    )
    for mode in MODES:
        one, cluster = out["latency_top10"][f"one node {mode}"], out["latency_top10"][f"cluster {mode}"]
        print(f"  {mode}: cluster / one node p50 {cluster['p50_ms'] / one['p50_ms']:.2f}x")
    fan_rows = [
        [
            mode,
            f"{f['one_node_ms_p50']:.2f}",
            f"{f['coordinator_ms_p50']:.2f}",
            f"{f['per_shard_ms_p50']:.2f}",
            f"{f['slowest_shard_per_step_ms_p50']:.2f}",
            f"{f['sum_over_shards_ms_p50']:.2f}",
            f"{f['coordinator_rest_ms_p50']:.2f}",
            f"{f['shard_statements']:.0f} ({f['untimed_statements']:.0f})",
        ]
        for mode, f in out["fanout"].items()
    ]
    print(
        format_table(
            [
                "fan-out",
                "one node",
                "coordinator",
                "per shard",
                "slowest/step",
                "sum shards",
                "rest",
                "statements (untimed)",
            ],
            fan_rows,
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument("--citus-source", help="Citus source tarball (default: AGENTDB_CITUS_SOURCE)")
    parser.add_argument("--repeat", type=int, default=2, help="latency passes, best per query (default 2)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each throughput run (default 10)")
    parser.add_argument(
        "--fanout-queries", type=int, default=20, help="queries per mode for fan-out (default 20)"
    )
    parser.add_argument(
        "--synthetic", type=int, default=0, help="also N scifact-text chunks (bench/scale.py's)"
    )
    parser.add_argument("--synthetic-queries", type=int, default=200)
    parser.add_argument(
        "--reuse-scifact", action="store_true", help="keep the SciFact results of bench/results/citus.json"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cluster-layout",
        choices=("rows", "blocks"),
        default="rows",
        help="the cluster's postings (default rows, a coordinator's default; the single node keeps blocks)",
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-json", action="store_true")
    parser.add_argument(
        "--output",
        type=Path,
        default=RESULTS / "citus.json",
        help="results file (default bench/results/citus.json)",
    )
    args = parser.parse_args()
    if scifact_missing(args.dataset):
        return 2

    from scifact import query_embeddings

    from agentdb.cli import main as agentdb
    from agentdb.db.cluster import list_workers
    from agentdb.embed import load_embedder
    from agentdb.embed_cache import CachedEmbedder, cache_path
    from agentdb.evaluation import load_qrels, load_queries, ndcg_at, pool_by_document
    from agentdb.ingest.readers import read_records
    from agentdb.sources import get_source

    wall = time.perf_counter()
    layouts: dict[str, Literal["rows", "blocks"]] = {"one node": "blocks", "cluster": args.cluster_layout}
    DATA.mkdir(parents=True, exist_ok=True)
    cluster_dir = DATA / "cluster"
    urls = {"one node": embedded_url(DATA / "one"), "cluster": start_cluster(cluster_dir, args.citus_source)}
    failed = False
    try:
        conns = {system: connect(url) for system, url in urls.items()}
        workers = {(w.host, w.port): w.url() for w in list_workers(cluster_dir)}
        with conns["cluster"].cursor() as cur:
            citus = cur.execute("select citus_version()").fetchone()
        corpus = args.dataset / "corpus.jsonl.gz"
        model = load_embedder()
        embedder = CachedEmbedder(model, cache_path(ROOT / ".agentdb" / "embeddings", model, corpus))
        loads = {
            system: load(
                conns[system],
                system,
                SCIFACT_SOURCE,
                N_DOCS,
                lambda: read_records(corpus),
                embedder,
                layouts[system],
            )
            for system in SYSTEMS
        }
        embedder.save()

        queries, qrels = (
            load_queries(args.dataset / "queries.jsonl"),
            load_qrels(args.dataset / "qrels" / "test.tsv"),
        )
        qids = [q for q in queries if q in qrels]
        texts = [queries[q] for q in qids]
        backends = get_source(conns["one node"], SCIFACT_SOURCE).embedding_backends
        qvecs, _ = query_embeddings(qids, texts, backends)
        load_before = machine_facts()["load_average_1m"]

        def write(results: dict[str, Any]) -> None:
            load_after = machine_facts()["load_average_1m"]
            print(f"load average {load_before} -> {load_after}; {time.perf_counter() - wall:.0f} s so far")
            if args.no_json:
                return
            out = {
                "benchmark": "citus",
                "machine": machine_facts(),
                "versions": {**versions(conns["one node"]), "citus": citus[0] if citus else None},
                "settings": {
                    "workers": 2,
                    "shards": SHARDS,
                    "layouts": layouts,
                    "quality_depth": DEPTH,
                    "top_k": TOP_K,
                    "threshold": 0.0,
                    "fusion": "rrf",
                    "timing_passes": args.repeat,
                    "latency_statistic": "per-query best of the passes, then p50/p95 over queries",
                    "throughput_seconds": args.seconds,
                    "fanout_queries": args.fanout_queries,
                    "latency_excludes_query_embedding": True,
                },
                "results": results,
                "run_seconds": round(time.perf_counter() - wall, 1),
                "load_average_1m": {"before_timing": load_before, "after": load_after},
            }
            args.output.write_text(json.dumps(out, indent=2) + "\n")
            print(f"wrote {args.output}")

        if args.reuse_scifact:  # the SciFact part of the last run, to measure only the synthetic corpus
            scifact = json.loads((RESULTS / "citus.json").read_text())["results"]["scifact"]
        else:
            hits, different = compare_hits(conns, SCIFACT_SOURCE, texts, qvecs, DEPTH, not args.no_progress)
            failed |= report_differences(different, texts, qids)
            ndcg = {
                mode: {
                    system: ndcg_at(
                        {
                            q: pool_by_document((d, s) for d, _, s in h)
                            for q, h in zip(qids, hits[mode][system], strict=True)
                        },
                        {q: qrels[q] for q in qids},
                        10,
                    )
                    for system in SYSTEMS
                }
                for mode in MODES
            }
            for mode in MODES:
                print(
                    f"SciFact nDCG@10 {mode}: one node {ndcg[mode]['one node']:.4f}, cluster {ndcg[mode]['cluster']:.4f}"
                )
            scifact = {
                "documents": N_DOCS,
                "chunks": loads["one node"]["chunks"],
                "queries": len(qids),
                "load": loads,
                "ndcg10": ndcg,
                "differing_queries": {mode: len(rows) for mode, rows in different.items()},
                "differences": different,
                **measure("SciFact", urls, conns, workers, SCIFACT_SOURCE, texts, qvecs, args),
            }
            failed |= scifact["unpruned_same_hits"]["same"] != len(qids)
        results: dict[str, Any] = {"scifact": scifact}
        write(results)  # again at the end; kept if a later part fails
        print_corpus(f"SciFact: {N_DOCS} documents, {scifact['chunks']} chunks, {len(qids)} queries", scifact)

        if args.synthetic:
            records, query_vectors = synthetic_records(args.synthetic, args.seed, args.dataset)
            synth_loads = {
                system: load(
                    conns[system],
                    system,
                    SYNTHETIC_SOURCE,
                    args.synthetic,
                    records,
                    PrecomputedVectors(),
                    layouts[system],
                )
                for system in SYSTEMS
            }
            n = args.synthetic_queries
            stexts, svecs = texts[:n], query_vectors(n)
            _, synth_different = compare_hits(
                conns, SYNTHETIC_SOURCE, stexts, svecs, TOP_K, not args.no_progress
            )
            failed |= report_differences(synth_different, stexts, qids)
            synthetic = {
                "chunks": args.synthetic,
                "corpus": "scifact-text (bench/scale.py real_texts, 80 to 240 words, 5 related abstracts)",
                "queries": n,
                "settings": {
                    "timing_passes": args.repeat,
                    "throughput_seconds": args.seconds,
                    "fanout_queries": args.fanout_queries,
                },
                "load": synth_loads,
                "differing_queries": {mode: len(rows) for mode, rows in synth_different.items()},
                "differences": synth_different,
                **measure(
                    f"scifact-text {args.synthetic}",
                    urls,
                    conns,
                    workers,
                    SYNTHETIC_SOURCE,
                    stexts,
                    svecs,
                    args,
                ),
            }
            failed |= synthetic["unpruned_same_hits"]["same"] != n
            results["synthetic"] = synthetic
            print_corpus(f"scifact-text: {args.synthetic} chunks, {n} queries", synthetic)
        for system in SYSTEMS:
            print(
                f"loading rate {system}: SciFact {load_rate(loads[system])}"
                + (
                    f", scifact-text {load_rate(results['synthetic']['load'][system])}"
                    if args.synthetic
                    else ""
                )
            )
        write(results)
        for conn in conns.values():
            conn.close()
    finally:
        if not args.keep:
            agentdb(["stop", "--force", "--data-dir", str(cluster_dir)])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
