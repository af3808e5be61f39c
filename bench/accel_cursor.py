"""The C cursor (agentdb_accel.bm25_topk) of a baseline commit beside the current sources, on the same queries.

    .venv/bin/python bench/accel_cursor.py --baseline HEAD~1                 # SciFact and scifact-text 100k
    .venv/bin/python bench/accel_cursor.py --baseline HEAD~1 --databases bench_scale_text_100000

The baseline's ext/agentdb_accel.c (from git) and the worktree's are compiled against the bench server's
pg_config as two libraries of their own names, each declared as a function in a scratch schema (accel_ab) of
every database measured: the same arguments go to both, query by query, the two alternating (which comes
first alternates too), each query's time its best of --repeat passes. Every query's hits must be equal (ids,
order, scores); the run says how many were. Server-side time of the call alone (pg_stat_user_functions under
track_functions, so no client round trip), and the wall time of `agentdb.retrieve` lexical on the current
extension for scale.

Databases: `scifact` is SciFact's corpus (8,993 chunks, chunked as `agentdb ingest` chunks it, no vectors) in
the block layout, loaded on first use into bench/.cache/scale; the others are bench/scale.py's (load them with
`bench/scale.py --sizes 100000 --corpus scifact-text --layouts blocks --lexical-only`). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import tempfile
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
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

DATA_DIR = CACHE / "scale"
SCIFACT_DB = "scifact"  # the database and source of SciFact's corpus
LIB_DIR = CACHE / "accel_cursor"
VERSIONS = ("baseline", "current")
ARGS = (
    "source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[], min_dls int[],"
    " max_spans bigint[], k int, avgdl float8, k1 float8, b float8"
)


def build(c_source: str, name: str, pg_config: Path) -> Path:
    """Compile one version of the cursor as library `name`.so into bench/.cache/accel_cursor."""
    from agentdb.db.accel import DROPPED_CFLAGS

    cflags = " ".join(
        f
        for f in subprocess.run(
            [str(pg_config), "--cflags"], check=True, capture_output=True, text=True
        ).stdout.split()
        if f not in DROPPED_CFLAGS
    )
    LIB_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / f"{name}.c").write_text(c_source)
        (Path(scratch) / "Makefile").write_text(
            f"MODULE_big = {name}\nOBJS = {name}.o\nPG_CONFIG ?= pg_config\n"
            "PGXS := $(shell $(PG_CONFIG) --pgxs)\ninclude $(PGXS)\n"
        )
        subprocess.run(["make", "-s", f"PG_CONFIG={pg_config}", f"CFLAGS={cflags}"], cwd=scratch, check=True)
        target = LIB_DIR / f"{name}.so"
        target.write_bytes((Path(scratch) / f"{name}.so").read_bytes())
    target.chmod(0o755)
    LIB_DIR.chmod(0o755)
    return target


def load_scifact(conn: psycopg.Connection[Any], dataset: Path) -> None:
    """SciFact's corpus into source `scifact`, block layout, chunked as `agentdb ingest` chunks it (the model's
    tokenizer), no vectors; once."""
    from agentdb.embed import load_embedder
    from agentdb.ingest.chunking import chunk_text
    from agentdb.ingest.pipeline import copy_chunks
    from agentdb.sources import create_document_source

    if conn.execute("select 1 from agentdb.sources where name = %s", (SCIFACT_DB,)).fetchone():
        return
    source = create_document_source(
        conn, SCIFACT_DB, embedding_model="all-MiniLM-L6-v2", embedding_dim=384, lexical_layout="blocks"
    )
    embedder = load_embedder(source.embedding_model)
    rows = []
    with gzip.open(dataset / "corpus.jsonl.gz", "rt") as handle:
        for line in handle:
            doc = json.loads(line)
            for n, text in enumerate(
                chunk_text(doc["text"], embedder.token_spans, source.chunk_size, source.chunk_overlap)
            ):
                rows.append((str(doc["_id"]), n, doc.get("title", ""), text, Jsonb({}), None))
    with conn.transaction(), conn.cursor() as cur:
        copy_chunks(cur, source, rows)
    conn.execute("vacuum analyze agentdb.posting_blocks, agentdb.term_stats, agentdb.corpus_stats")


def database(url: str, name: str) -> psycopg.Connection[Any]:
    with psycopg.connect(url, autocommit=True) as admin:
        if not admin.execute("select 1 from pg_database where datname = %s", (name,)).fetchone():
            admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    return connect(make_conninfo(url, dbname=name))


def measure(
    conn: psycopg.Connection[Any],
    source: str,
    libs: dict[str, Path],
    queries: list[str],
    top_k: int,
    repeat: int,
) -> dict[str, Any]:
    conn.execute("drop schema if exists accel_ab cascade")  # made anew: an older run may have declared others
    conn.execute("create schema accel_ab")
    for version, lib in libs.items():
        conn.execute(
            sql.SQL(
                "create or replace function accel_ab.{}(" + ARGS + ") returns table (cid bigint, bm25 float8)"
                " as {}, 'agentdb_accel_bm25_topk_blocks' language c stable strict"
            ).format(sql.Identifier(version), sql.Literal(str(lib)))
        )
    sid, cfg, k1, b = conn.execute(
        "select id, ts_config, bm25_k1, bm25_b from agentdb.sources where name = %s", (source,)
    ).fetchone() or (None, None, None, None)
    n_chunks, total_len = conn.execute(
        "select n_chunks, total_len from agentdb.corpus_stats where source_id = %s", (sid,)
    ).fetchone() or (0, 0)
    calls = []
    for q in queries:
        qt = conn.execute(
            "select (x).* from (select agentdb_internal.query_terms(%s, to_tsvector(%s::regconfig, %s), %s, %s) x) y",
            (sid, cfg, q, float(n_chunks), k1),
        ).fetchone()
        if qt and qt[0]:
            held, weights, _, dfs, max_tfs, min_dls, max_spans = qt
            calls.append(
                (
                    q,
                    (
                        sid,
                        held,
                        weights,
                        dfs,
                        max_tfs,
                        min_dls,
                        max_spans,
                        top_k,
                        total_len / n_chunks,
                        k1,
                        b,
                    ),
                )
            )
    conn.execute("set track_functions = 'all'")  # C functions are timed under 'all' only

    def server_ms(version: str, args: tuple[Any, ...]) -> tuple[float, list[tuple[int, float]]]:
        conn.execute("select pg_stat_reset_single_function_counters(%s::regproc)", (f"accel_ab.{version}",))
        rows = conn.execute(
            sql.SQL("select cid, bm25 from accel_ab.{}(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)").format(
                sql.Identifier(version)
            ),
            args,
        ).fetchall()
        conn.execute("select pg_stat_force_next_flush()")
        (ms,) = conn.execute(
            "select total_time from pg_stat_user_functions where schemaname = 'accel_ab' and funcname = %s",
            (version,),
        ).fetchone() or (float("nan"),)
        return float(ms), rows

    times: dict[str, list[float]] = {v: [float("inf")] * len(calls) for v in VERSIONS}
    same = 0
    for r in range(repeat):
        for i, (_, args) in enumerate(calls):
            order = VERSIONS if (i + r) % 2 == 0 else VERSIONS[::-1]
            got = {}
            for version in order:
                ms, got[version] = server_ms(version, args)
                times[version][i] = min(times[version][i], ms)
            if r == 0:
                same += got["baseline"] == got["current"]
    # Where a lexical retrieve's time goes, on the installed (current) extension: each function's time a query
    # (total with what it calls, and its own), beside the wall time of the call from here.
    conn.execute("select pg_stat_reset()")
    wall = []
    for q, _ in calls:
        started = time.perf_counter()
        conn.execute(
            "select agentdb.retrieve(%s, %s, mode => 'lexical', top_k => %s, output_results => false)",
            (source, q, top_k),
        ).fetchone()
        wall.append((time.perf_counter() - started) * 1000)
    conn.execute("select pg_stat_force_next_flush()")
    breakdown = {
        f"{schema}.{fn}": {"total_ms": total / len(calls), "self_ms": own / len(calls)}
        for schema, fn, total, own in conn.execute(
            "select schemaname, funcname, total_time, self_time from pg_stat_user_functions"
            " where schemaname <> 'accel_ab' order by total_time desc limit 8"
        )
    }
    return {
        "queries": len(calls),
        "same_hits": same,
        "n_chunks": n_chunks,
        **{
            f"{v}_{stat}_ms": f(times[v])
            for v in VERSIONS
            for stat, f in (
                ("p50", lambda x: percentile(x, 50)),
                ("p95", lambda x: percentile(x, 95)),
                ("mean", lambda x: sum(x) / len(x)),
            )
        },
        "retrieve_p50_ms": percentile(wall, 50),
        "retrieve_mean_ms": sum(wall) / len(wall),
        "retrieve_breakdown_mean_ms": breakdown,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--baseline", required=True, help="git revision whose ext/agentdb_accel.c is the baseline"
    )
    parser.add_argument(
        "--databases", nargs="+", default=[SCIFACT_DB, "bench_scale_text_100000"], help="databases to measure"
    )
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--top-k", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dataset", type=Path, default=SCIFACT)
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args()
    if scifact_missing(args.dataset):
        return 2
    url = embedded_url(DATA_DIR)
    from agentdb.db.server import _never_started

    pg_config = Path(_never_started().bin_path) / "pg_config"
    baseline = subprocess.run(
        ["git", "rev-parse", "--short", args.baseline], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    base = subprocess.run(
        ["git", "show", f"{baseline}:ext/agentdb_accel.c"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    libs = {
        "baseline": build(base, "agentdb_accel_baseline", pg_config),
        "current": build((ROOT / "ext" / "agentdb_accel.c").read_text(), "agentdb_accel_current", pg_config),
    }
    queries = [json.loads(line)["text"] for line in (args.dataset / "queries.jsonl").open() if line.strip()]
    queries = queries[: args.queries]
    out: dict[str, Any] = {}
    rows = []
    notes: list[str] = []
    for name in args.databases:
        conn = database(url, name)
        if name == SCIFACT_DB:
            load_scifact(conn, args.dataset)
        source = conn.execute("select name from agentdb.sources order by id limit 1").fetchone()
        assert source is not None, f"database {name} has no source"
        for k in args.top_k:
            r = measure(conn, source[0], libs, queries, k, args.repeat)
            out[f"{name} top {k}"] = r
            rows.append(
                [
                    f"{name} ({r['n_chunks']:,} chunks) top {k}",
                    f"{r['baseline_p50_ms']:.2f} / {r['baseline_p95_ms']:.2f} / {r['baseline_mean_ms']:.2f}",
                    f"{r['current_p50_ms']:.2f} / {r['current_p95_ms']:.2f} / {r['current_mean_ms']:.2f}",
                    f"{r['baseline_mean_ms'] / r['current_mean_ms']:.2f}x",
                    f"{r['same_hits']}/{r['queries']}",
                    f"{r['retrieve_p50_ms']:.2f}",
                ]
            )
            parts = ", ".join(
                f"{fn} {v['total_ms']:.2f} (own {v['self_ms']:.2f})"
                for fn, v in r["retrieve_breakdown_mean_ms"].items()
            )
            notes.append(
                f"{name} top {k}: retrieve wall mean {r['retrieve_mean_ms']:.2f} ms; server: {parts}"
            )
        conn.close()
    print(
        format_table(
            [
                "database, top k",
                "baseline p50 / p95 / mean ms",
                "current p50 / p95 / mean ms",
                "mean ratio",
                "same hits",
                "retrieve p50 ms",
            ],
            rows,
        )
    )
    print(
        f"bm25_topk server-side (track_functions), best of {args.repeat} per query, baseline {baseline} and the"
        " worktree alternating; retrieve: agentdb.retrieve lexical on the installed (current) extension, from Python."
    )
    print("Where a retrieve's time goes (mean ms a query, each function with what it calls, and its own):")
    for note in notes:
        print("  " + note)
    if not args.no_json:
        with connect(url) as conn:
            facts = {"machine": machine_facts(), "versions": versions(conn), "baseline": baseline}
        path = RESULTS / "accel_cursor.json"
        path.write_text(json.dumps({**facts, "results": out}, indent=2, default=float) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
