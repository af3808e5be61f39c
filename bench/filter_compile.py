"""Filter compile time: the largest filters agentdb_internal.compile_filter's limits allow, in every surface syntax.

    .venv/bin/python bench/filter_compile.py                      # the working tree's compiler
    .venv/bin/python bench/filter_compile.py --baseline HEAD~1    # beside the compiler of another commit

A filter is user input on every door and compiling it holds a pooled connection, so the largest filter the
limits allow (depth 16, 256 nodes, 1,000 items per array, 10,000 list items in all, 1 MiB as jsonb; see
sql/030_filters.sql) must compile in tens of milliseconds. Each shape sits at those limits by construction
(the `outcome` column shows `ok`; the last rows are over them, and show the time to reject). Per shape,
after one warm-up call: `server ms`, the median wall time of compile_filter alone, timed in the server with
clock_timestamp() on a filter that is already jsonb; `server CPU ms`, the mean CPU time of the server
process over those calls (read from /proc; steadier than wall time when other work shares the cores);
`round trip ms`, the median of the same call from Python (orjson, psycopg, jsonb input and output), as the
API pays it. Then growth curves: time against the number of list items and of nodes, linear when the
per-item and per-node columns stay flat. A benchmark, not a test: it never fails for being slow.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from _common import CACHE, ROOT, connect, embedded_url, format_table, machine_facts, versions
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

DATA_DIR = CACHE / "filter_compile"
DATABASE = "bench_filter_compile"
BASELINE_DATABASE = "bench_filter_compile_baseline"
TARGET_MS = 50.0

NODES, PER_ARRAY, TOTAL = 256, 1000, 10_000

FIELDS: list[dict[str, Any]] = [
    {"name": "year", "type": "int"},
    {"name": "score", "type": "float"},
    {"name": "status", "type": "string"},
    {"name": "published", "type": "bool"},
    {"name": "tags", "type": "string_set"},
    {"name": "created", "type": "timestamp"},
    {"name": "rank", "type": "int", "optional": False, "default": 3},
]
# The same names as columns of a registered table.
COLUMN_FIELDS = [
    {**f, "column": c} for f, c in zip(FIELDS, ["n", "x", "s", "flag", "tags", "at", "r"], strict=True)
]

Filter = dict[str, Any]


def ints(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def strings(n: int, start: int = 0, width: int = 32) -> list[str]:
    return [f"s{i:0{width - 1}d}" for i in range(start, start + n)]


def timestamps(n: int, start: int = 0) -> list[str]:
    return [
        f"2020-01-{1 + (i // 86400) % 28:02d}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        for i in range(start, start + n)
    ]


def eq(field: str, value: Any) -> Filter:
    return {"op": "eq", "lhs": {"knowledge": field}, "rhs": {"value": value}}


def in_haystack(field: str, values: list[Any]) -> Filter:
    return {"op": "in", "needle": {"knowledge": field}, "haystack": {"value": values}}


def operator_lists(field: str, make: Callable[[int, int], list[Any]], lists: int = 10) -> Filter:
    """$or of `lists` x {field: {$in: 1000}} and 127 - lists fillers (2 nodes each), and one more condition:
    1 + 127 * 2 + 1 = 256 nodes, lists * 1000 items, depth 3."""
    per = TOTAL // lists
    args: list[Filter] = [{field: {"$in": make(per, i * per)}} for i in range(lists)]
    args += [{"score": {"$gt": i}} for i in range(127 - lists)]
    return {"$or": args, "rank": {"$ne": 0}}


def many_small_lists() -> Filter:
    """127 objects {year: {$in: 39, $nin: 39}} under $and (2 nodes each) and one more condition: 256 nodes,
    254 lists, 9,906 items."""
    return {
        "$and": [{"year": {"$in": ints(39, 100 * i), "$nin": ints(39, 100 * i + 50)}} for i in range(127)],
        "rank": {"$ne": 0},
    }


def deep_tryll(lists: int = 10) -> Filter:
    """14 nested nots, an or at depth 15, and at depth 16 `lists` in-haystacks of 1000 ints and fillers:
    14 + 1 + 241 = 256 nodes, every list item at the deepest level the limits allow."""
    per = TOTAL // lists
    args = [in_haystack("year", ints(per, i * per)) for i in range(lists)]
    args += [eq("score", i) for i in range(241 - lists)]
    node: Filter = {"op": "or", "args": args}
    for _ in range(14):
        node = {"op": "not", "arg": node}
    return node


def tryll_flat() -> Filter:
    """or of 10 in-haystacks (1000 strings) and 245 comparisons: 256 nodes, depth 2."""
    args = [in_haystack("status", strings(1000, 1000 * i)) for i in range(10)]
    args += [eq("year", i) for i in range(245)]
    return {"op": "or", "args": args}


def query_terms() -> Filter:
    """disjuncts (min 2) of 10 terms queries of 1000 strings and 245 term queries: 256 nodes."""
    qs: list[Filter] = [{"terms": strings(1000, 1000 * i), "field": "status"} for i in range(10)]
    qs += [{"term": i, "field": "year"} for i in range(245)]
    return {"disjuncts": qs, "min": 2}


def query_bool() -> Filter:
    """bool: must 5 terms of 1000 ints, should 5 terms of 1000 tags, must_not 245 numeric ranges: 256 nodes."""
    return {
        "bool": {
            "must": [{"terms": ints(1000, 1000 * i), "field": "year"} for i in range(5)],
            "should": [{"terms": strings(1000, 1000 * i, 16), "field": "tags"} for i in range(5)],
            "must_not": [{"field": "score", "min": i, "max": i + 0.5} for i in range(245)],
        }
    }


def query_ids() -> Filter:
    """conjuncts of 10 ids queries of 1000 and 245 date ranges: 256 nodes."""
    qs: list[Filter] = [{"ids": strings(1000, 1000 * i, 12)} for i in range(10)]
    qs += [
        {"field": "created", "start": "2020-01-01", "end": f"2021-01-{1 + i % 28:02d}"} for i in range(245)
    ]
    return {"conjuncts": qs}


def many_nodes_operator() -> Filter:
    """256 nodes of scalar comparisons, no lists: $or of 127 {year: i} and one more condition."""
    return {"$or": [{"year": i} for i in range(127)], "rank": {"$ne": 0}}


def many_nodes_tryll() -> Filter:
    """256 Tryll nodes: an or of 255 comparisons."""
    return {"op": "or", "args": [eq("year", i) for i in range(255)]}


SHAPES: list[tuple[str, list[dict[str, Any]], Callable[[], Filter]]] = [
    ("operator $in: 10 x 1000 int", FIELDS, lambda: operator_lists("year", ints)),
    ("operator $in: 10 x 1000 string (32 B)", FIELDS, lambda: operator_lists("status", strings)),
    ("operator $in: 10 x 1000 timestamp", FIELDS, lambda: operator_lists("created", timestamps)),
    ("operator $in: 10 x 1000 string_set", FIELDS, lambda: operator_lists("tags", strings)),
    (
        "operator $in: 10 x 1000 int, with default",
        FIELDS,
        lambda: operator_lists("rank", lambda n, s: ints(n, s + 10)),
    ),
    ("operator $in/$nin: 254 x 39 int", FIELDS, many_small_lists),
    ("deep (16): 10 x 1000 int at the bottom", FIELDS, lambda: deep_tryll()),
    ("Tryll: 10 x 1000 string in-haystacks", FIELDS, tryll_flat),
    ("query: 10 x 1000 terms + 245 term", FIELDS, query_terms),
    ("query: bool, terms + 245 ranges", FIELDS, query_bool),
    ("query: 10 x 1000 ids + 245 date ranges", FIELDS, query_ids),
    ("256 nodes, no lists (operator)", FIELDS, many_nodes_operator),
    ("256 nodes, no lists (Tryll)", FIELDS, many_nodes_tryll),
    ("columns: $in 10 x 1000 int", COLUMN_FIELDS, lambda: operator_lists("year", ints)),
    ("columns: $in 10 x 1000 timestamp", COLUMN_FIELDS, lambda: operator_lists("created", timestamps)),
    # Near the 1 MiB limit (1,046,114 bytes as jsonb): the largest filter in bytes.
    (
        "1 MiB: 10 x 1000 strings of 100 B",
        FIELDS,
        lambda: operator_lists("status", lambda n, s: strings(n, s, 100)),
    ),
]

# Over the limits, rejected: the time to say no. The first is the filter from the report, 127 $in lists of
# 1,000 ints (640 KB of JSON); the second is 10 MB of long strings within the item limits.
REJECTED = [
    (
        "attack: 127 x 1000 int (rejected)",
        FIELDS,
        lambda: {"$or": [{"year": {"$in": ints(1000, 1000 * i)}} for i in range(127)]},
    ),
    (
        "10 MB: 10 x 1000 strings of 1 KB (rejected)",
        FIELDS,
        lambda: operator_lists("status", lambda n, s: strings(n, s, 1024)),
    ),
]

TIMER = """
create or replace function pg_temp.time_compile(fields jsonb, f jsonb, n int) returns float8[]
language plpgsql as $$
declare
    times float8[] := '{}';
    t0 timestamptz;
begin
    for i in 1 .. n loop
        t0 := clock_timestamp();
        begin
            perform * from agentdb_internal.compile_filter(fields, f, '$1', 'c.doc_id');
        exception when sqlstate 'ADB00' then
            null;  -- a rejected filter: the time to reject it
        end;
        times := times || extract(epoch from clock_timestamp() - t0)::float8 * 1000;
    end loop;
    return times;
end;
$$;
"""


def apply_baseline(conn: psycopg.Connection[Any], rev: str) -> str:
    """Replace the filter compiler in this database by the one in commit `rev`; returns its short hash."""
    text = subprocess.run(
        ["git", "show", f"{rev}:sql/030_filters.sql"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    short = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with conn.transaction():
        for (signature,) in conn.execute(
            "select p.oid::regprocedure::text from pg_proc p"
            " where p.pronamespace = 'agentdb'::regnamespace and p.proname like 'filter\\_%'"
        ).fetchall():
            conn.execute(sql.SQL("drop function {}").format(sql.SQL(signature)))
        conn.execute(text)
    return short


def open_database(server: str, name: str) -> psycopg.Connection[Any]:
    with psycopg.connect(server, autocommit=True) as admin:
        if not admin.execute("select 1 from pg_database where datname = %s", (name,)).fetchone():
            admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    conn = connect(make_conninfo(server, dbname=name))
    conn.execute("set statement_timeout = '600s'")
    conn.execute(TIMER)
    return conn


def backend_cpu_ms(pid: int) -> float | None:
    """CPU time (user + system) the server process `pid` has used, from /proc; None when it is not readable
    (a server on another machine). Less disturbed than wall time when other work shares the cores."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def measure(
    conn: psycopg.Connection[Any], fields: list[dict[str, Any]], filter: Filter, repeat: int
) -> dict[str, Any]:
    """Median server wall and mean server CPU milliseconds, median round-trip milliseconds (after one untimed
    call), and the outcome."""
    args = (Jsonb(fields), Jsonb(filter))
    outcome = "ok"
    try:
        conn.execute(
            "select * from agentdb_internal.compile_filter(%s, %s, '$1', 'c.doc_id')", args
        ).fetchone()
    except psycopg.Error as exc:
        outcome = (exc.diag.message_primary or "error").split(":")[0]
    cpu_before = backend_cpu_ms(conn.info.backend_pid)
    row = conn.execute("select pg_temp.time_compile(%s, %s, %s)", (*args, repeat)).fetchone()
    cpu_after = backend_cpu_ms(conn.info.backend_pid)
    assert row is not None
    cpu = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) / repeat
    trips = []
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            conn.execute(
                "select * from agentdb_internal.compile_filter(%s, %s, '$1', 'c.doc_id')", args
            ).fetchone()
        except psycopg.Error:
            pass
        trips.append((time.perf_counter() - started) * 1000)
    return {
        "server_ms": statistics.median(row[0]),
        "server_cpu_ms": cpu,
        "round_trip_ms": statistics.median(trips),
        "outcome": outcome,
    }


def list_items(filter: Any) -> int:
    """List items as the budget counts them, for the table: the arrays of values (not of filters)."""
    if isinstance(filter, dict):
        total = 0
        for key, value in filter.items():
            if key in ("$in", "$nin", "terms", "ids") and isinstance(value, list):
                total += len(value)
            elif key == "haystack" and isinstance(value, dict) and isinstance(value.get("value"), list):
                total += len(value["value"])
            else:
                total += list_items(value)
        return total
    if isinstance(filter, list):
        return sum(list_items(v) for v in filter)
    return 0


def per(got: dict[str, Any], count: int) -> list[str]:
    """Server wall and CPU ms, and each divided by `count` in microseconds."""
    cpu = got["server_cpu_ms"]
    return [
        fmt(got["server_ms"]),
        f"{got['server_ms'] * 1000 / count:.1f}",
        fmt(cpu),
        "" if cpu is None else f"{cpu * 1000 / count:.1f}",
    ]


def fmt(ms: float | None) -> str:
    return "" if ms is None else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per shape")
    parser.add_argument("--baseline", metavar="REV", help="also time the compiler of this commit")
    parser.add_argument(
        "--baseline-repeat", type=int, default=1, help="timed runs per shape for the baseline"
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()

    server = embedded_url(DATA_DIR)
    conn = open_database(server, DATABASE)
    base = None
    if args.baseline:
        base = open_database(server, BASELINE_DATABASE)
        args.baseline = apply_baseline(base, args.baseline)

    rows, out = [], []
    for name, fields, make in [*SHAPES, *REJECTED]:
        filter = make()
        size_kb = len(json.dumps(filter)) / 1024
        got = measure(conn, fields, filter, args.repeat)
        old = measure(base, fields, filter, args.baseline_repeat) if base else None
        out.append(
            {"shape": name, "kb": round(size_kb, 1), "items": list_items(filter), **got, "baseline": old}
        )
        row = [
            name,
            f"{size_kb:.0f}",
            list_items(filter),
            fmt(got["server_ms"]),
            fmt(got["server_cpu_ms"]),
            fmt(got["round_trip_ms"]),
            got["outcome"],
        ]
        if old:
            row[5:5] = [fmt(old["server_ms"])]
        rows.append(row)
        print(f"  {name}: {fmt(got['server_ms'])} ms", file=sys.stderr)
    headers = ["shape", "KB", "list items", "server ms", "server CPU ms", "round trip ms", "outcome"]
    if base:
        headers[5:5] = [f"server ms at {args.baseline}"]
    print()
    print(format_table(headers, rows))
    allowed = [r for r in out if r["outcome"] == "ok"]
    worst = max(allowed, key=lambda r: r["server_ms"])
    print(
        f"\nslowest shape within the limits: {worst['shape']}, {fmt(worst['server_ms'])} ms"
        f" on the server ({fmt(worst['server_cpu_ms'])} ms CPU), {fmt(worst['round_trip_ms'])} ms round trip"
        f" (target < {TARGET_MS:.0f} ms); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )

    # Growth: the same shape at growing sizes; flat per-item and per-node columns mean linear.
    growth = []
    for lists in (1, 2, 5, 10):
        filter = {"$or": [{"year": {"$in": ints(1000, 1000 * i)}} for i in range(lists)]}
        got = measure(conn, FIELDS, filter, args.repeat)
        growth.append(["list items", lists * 1000, *per(got, lists * 1000)])
    for n in (31, 63, 127, 255):
        filter = {"op": "or", "args": [eq("year", i) for i in range(n)]}
        got = measure(conn, FIELDS, filter, args.repeat)
        growth.append(["nodes", n + 1, *per(got, n + 1)])
    print()
    print(format_table(["growing", "count", "server ms", "us each", "server CPU ms", "us CPU each"], growth))

    if args.json:
        facts = {
            "machine": machine_facts(),
            "versions": versions(conn),
            "baseline": args.baseline,
            "repeat": args.repeat,
            "shapes": out,
            "growth": growth,
        }
        args.json.write_text(json.dumps(facts, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
