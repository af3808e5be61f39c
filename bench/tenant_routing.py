"""Tenant routing on a Citus coordinator: the same reads with and without the tenant fixed by the filter.

    .venv/bin/agentdb start --workers 2 --data-dir /tmp/tenants        # a coordinator and 2 workers
    DATABASE_URL=<its URL> .venv/bin/python bench/tenant_routing.py --docs 8000 --tenants 8

Loads `--docs` random documents (a 17-word vocabulary, random 384-dimension unit vectors, one of `--tenants`
tenants each) into a new source `tenant_bench` created with `--tenant-field team` (dropped first if it exists),
then for lexical, dense and hybrid (RRF, top 10, threshold 0) asks each query twice, alternating: with the
filter `{"team": T}`, which fixes the tenant (routed: Citus sends the statement to one shard), and with
`{"team": {"$in": [T]}}`, the same rows, which agentdb does not route (every shard). It prints p50/p95
latency of each side by side, the shard statements one read of each sent (citus.log_remote_commands), and on
how many queries both gave the same hits (ids, chunks, scores): the two filters are compiled to different
conditions, so the shards' planner may take the HNSW index for one and an exact scan for the other. Everything shares this machine's cores: the figures are the price of a fan-out
here, not a scaling result. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import statistics
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from agentdb.db.pool import configure
from agentdb.ingest.pipeline import ingest
from agentdb.ingest.readers import Located
from agentdb.sources import create_document_source, drop_source
from agentdb.sources.catalog import source_exists

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
SOURCE = "tenant_bench"


def _unit(rng: random.Random) -> list[float]:
    vector = [rng.gauss(0, 1) for _ in range(384)]
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def load(conn: psycopg.Connection[Any], docs: int, tenants: int, rng: random.Random) -> None:
    if source_exists(conn, SOURCE):
        drop_source(conn, SOURCE)
    create_document_source(
        conn, SOURCE, embedding_model="bench-random", embedding_dim=384, tenant_field="team"
    )
    records = (
        Located(
            "<bench>",
            i,
            {
                "id": f"d{i}",
                "title": f"doc {i}",
                "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))),
                "team": f"t{i % tenants}",
                "embedding": _unit(rng),
            },
        )
        for i in range(docs)
    )
    started = time.perf_counter()
    report = ingest(conn, SOURCE, records, None, create=False, progress=False)
    print(f"loaded {report.chunks} chunks in {time.perf_counter() - started:.1f} s")


def search(
    conn: psycopg.Connection[Any], text: str, vector: str, mode: str, where: dict[str, Any]
) -> list[Any]:
    return conn.execute(
        "select id, chunk, score from agentdb.search(%s, %s, query_embedding => %s::vector, mode => %s,"
        " threshold => 0, filter => %s)",
        (SOURCE, text, vector, mode, Jsonb(where)),
    ).fetchall()


def shard_statements(
    conn: psycopg.Connection[Any], text: str, vector: str, mode: str, where: dict[str, Any]
) -> int:
    messages: list[str] = []
    conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
    conn.execute("set citus.log_remote_commands = on")
    conn.execute("set client_min_messages = log")
    search(conn, text, vector, mode, where)
    conn.execute("reset citus.log_remote_commands")
    conn.execute("reset client_min_messages")
    return sum(1 for m in messages if re.search(rf"agentdb_docs\.{SOURCE}_\d+|agentdb\.postings_\d+", m))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=8000)
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--no-load", action="store_true", help="reuse the source a previous run loaded")
    args = parser.parse_args()
    rng = random.Random(7)
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        configure(conn)
        if not args.no_load:
            load(conn, args.docs, args.tenants, rng)
        queries = [
            (
                " ".join(rng.sample(WORDS, rng.randint(1, 3))),
                str(_unit(rng)),
                f"t{rng.randrange(args.tenants)}",
            )
            for _ in range(args.queries)
        ]
        print(f"load average {os.getloadavg()[0]:.2f} at the start")
        print("mode      routed p50 / p95 ms   not routed p50 / p95 ms   shard statements routed / not")
        for mode in ("lexical", "dense", "hybrid"):
            times: dict[bool, list[float]] = {True: [], False: []}
            same = 0
            for text, vector, tenant in queries:
                answers = []
                for routed in (True, False):
                    where = {"team": tenant} if routed else {"team": {"$in": [tenant]}}
                    started = time.perf_counter()
                    answers.append(search(conn, text, vector, mode, where))
                    times[routed].append((time.perf_counter() - started) * 1000)
                same += answers[0] == answers[1]
            text, vector, tenant = queries[0]
            counts = [
                shard_statements(conn, text, vector, mode, {"team": tenant}),
                shard_statements(conn, text, vector, mode, {"team": {"$in": [tenant]}}),
            ]
            cells = [
                f"{statistics.median(times[r]):7.2f} / {statistics.quantiles(times[r], n=20)[18]:7.2f}"
                for r in (True, False)
            ]
            print(
                f"{mode:8}  {cells[0]:>21}   {cells[1]:>23}   {counts[0]} / {counts[1]:<6}"
                f"   same hits {same} / {len(queries)}"
            )
        print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
