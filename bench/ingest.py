"""`agentdb ingest`'s pipeline end to end, each lexical layout beside the other, on the same records: N
scifact-text records that carry their vectors (bench/citus.py's synthetic records: bench/scale.py's texts, seeded
random unit vectors), loaded by agentdb.ingest.pipeline.ingest into a new source of a fresh database, HNSW build
and the closing merge included.

    .venv/bin/python bench/ingest.py                  # 20,000 records, rows then blocks, 2 rounds
    .venv/bin/python bench/ingest.py --records 100000 --rounds 1

The server is the embedded one of bench/.cache/scale. The layouts alternate within each round (which goes first
alternates too); each row reports the best and the median round. Writes bench/results/ingest.json. A benchmark,
not a test: the embedding model is not timed (the records bring their vectors).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psycopg
from _common import CACHE, RESULTS, SCIFACT, connect, embedded_url, format_table, machine_facts, versions
from psycopg import sql

LAYOUTS = ("rows", "blocks")
DATABASE = "bench_ingest"


def load_once(admin: psycopg.Connection[Any], url: str, layout: str, records: list[Any]) -> dict[str, Any]:
    """Ingest `records` into source `synthetic` of a fresh database; its rate and what it left."""
    from citus import PrecomputedVectors

    from agentdb.ingest.pipeline import ingest

    admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DATABASE)))
    admin.execute(sql.SQL("create database {}").format(sql.Identifier(DATABASE)))
    conn = connect(psycopg.conninfo.make_conninfo(url, dbname=DATABASE))
    try:
        started = time.perf_counter()
        report = ingest(
            conn,
            "synthetic",
            iter(records),
            PrecomputedVectors(),
            progress=False,
            lexical_layout=layout,  # type: ignore[arg-type]
        )
        seconds = time.perf_counter() - started
        (blocks,) = conn.execute("select count(*) from agentdb.posting_blocks").fetchone() or (0,)
        (rows,) = conn.execute("select count(*) from agentdb.postings").fetchone() or (0,)
    finally:
        conn.close()
    return {
        "chunks": report.chunks,
        "seconds": round(seconds, 2),
        "chunks_per_s": round(report.chunks / seconds, 1),
        "posting_rows": rows,
        "posting_blocks": blocks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args()
    from citus import synthetic_records

    records_of, _ = synthetic_records(args.records, args.seed, SCIFACT)
    records = list(records_of())
    url = embedded_url(CACHE / "scale")
    admin = psycopg.connect(url, autocommit=True)
    load_before = machine_facts()["load_average_1m"]
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in LAYOUTS}
    for round_no in range(args.rounds):
        order = LAYOUTS if round_no % 2 == 0 else tuple(reversed(LAYOUTS))
        for layout in order:
            run = load_once(admin, url, layout, records)
            print(
                f"round {round_no + 1}, {layout}: {run['chunks']:,} chunks in {run['seconds']} s, {run['chunks_per_s']} chunks/s"
            )
            runs[layout].append(run)
    with psycopg.connect(psycopg.conninfo.make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        versions_now = versions(conn)
    admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DATABASE)))
    summary = {
        layout: {
            "best_chunks_per_s": max(r["chunks_per_s"] for r in rows),
            "median_chunks_per_s": round(statistics.median(r["chunks_per_s"] for r in rows), 1),
            "runs": rows,
        }
        for layout, rows in runs.items()
    }
    print(
        format_table(
            ["layout", "best chunks/s", "median chunks/s", "posting rows", "posting blocks"],
            [
                [
                    layout,
                    s["best_chunks_per_s"],
                    s["median_chunks_per_s"],
                    s["runs"][0]["posting_rows"],
                    s["runs"][0]["posting_blocks"],
                ]
                for layout, s in summary.items()
            ],
        )
    )
    load_after = machine_facts()["load_average_1m"]
    print(
        f"{args.records:,} records with their vectors, HNSW build included; load average {load_before} -> {load_after}"
    )
    if not args.no_json:
        out = {
            "benchmark": "ingest",
            "machine": machine_facts(),
            "versions": versions_now,
            "settings": {
                "records": args.records,
                "rounds": args.rounds,
                "seed": args.seed,
                "corpus": "scifact-text with seeded random unit vectors (bench/citus.py synthetic_records)",
            },
            "results": summary,
            "load_average_1m": {"before": load_before, "after": load_after},
        }
        path = RESULTS / "ingest.json"
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path.relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
