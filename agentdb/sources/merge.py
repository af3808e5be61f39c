"""A source's lexical index kept compact: rebuilt from its rows (check --repair), moved between layouts,\nits posting blocks merged in term ranges by parallel connections (optimize)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal

import psycopg
from psycopg.conninfo import make_conninfo

from agentdb.sources.catalog import get_source

# Term ranges a merge of posting blocks goes through, a VACUUM after each (optimize_source).
MERGE_SLICES = 8


# Connections that merge those ranges at once: disjoint ranges merge in parallel, at the cost of a slightly
# larger block table while a range's freed space waits to be reused by a later one.
MERGE_WORKERS = 2


# The session advisory lock (with the source id) that one optimize of a source holds while its ranges merge.
MERGE_LOCK_KEY = 0x6D657267  # "merg"


def rebuild_lexical(conn: psycopg.Connection[Any], name: str) -> None:
    """Recompute source `name`'s lexical index from its rows (agentdb.lexical_rebuild, in a transaction of its
    own; `agentdb check --repair`), then leave it as a bulk load leaves it (ingest.pipeline.analyze_source):
    partly filled blocks merged, the index tables vacuumed (the old postings' space free again, the visibility
    map set for index-only scans) and analyzed (the planner's statistics are of the index before)."""
    from agentdb.db import run_sql
    from agentdb.ingest.pipeline import analyze_source

    with conn.transaction():
        run_sql(conn, "select agentdb.lexical_rebuild(source_name => %(s)s)", {"s": name})
    analyze_source(conn, get_source(conn, name))


def optimize_source(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    layout: Literal["rows", "blocks"] | None = None,
    slices: int = MERGE_SLICES,
    workers: int = MERGE_WORKERS,
) -> tuple[int, int]:
    """Move a source's lexical index to `layout` when given (rebuilt from its rows), then merge its partly
    filled posting blocks. Returns the number of blocks before and after the merge (0, 0 for 'rows').

    The merge goes through the vocabulary in up to `slices` term ranges of about equal postings, each in a
    transaction of its own, with a plain VACUUM of the block table after each range that changed: the next
    range's new blocks then reuse the space of the versions it freed, and the table's file ends near the size
    of its live data instead of growing by the whole rewritten index. Every range is a complete merge of its
    terms, so the index equals the documents at every commit. The ranges are disjoint, so `workers`
    connections (this one and new ones to the same server) merge them at once; writers wait for each range as
    before, and a second optimize of the same source waits for this one. On a connection inside a transaction
    (where VACUUM cannot run) the merge is one statement, as with `slices=1`."""
    from agentdb.db import can_vacuum, run_sql

    rebuilt = layout is not None and get_source(conn, name).lexical_layout != layout
    if layout is not None:
        with conn.transaction():
            run_sql(
                conn,
                "select agentdb.lexical_set_layout(source_name => %(s)s, layout => %(l)s)",
                {"s": name, "l": layout},
            )
    # The merge joins a source's blocks to its terms: with the statistics of before a bulk load (the source's
    # blocks then few or none) the planner picked a nested loop that ran for minutes instead of seconds. A source
    # in rows has nothing to merge (and an unknown one is refused by lexical_optimize below).
    row = conn.execute(
        "select id from agentdb.sources where name = %s and lexical_layout = 'blocks'", (name,)
    ).fetchone()
    blocks_source = row[0] if row else None
    if blocks_source is not None:
        conn.execute("analyze agentdb.posting_blocks")
    vacuum = can_vacuum(conn)
    bounds: list[str] = []
    if vacuum and slices > 1 and blocks_source is not None:
        (bounds,) = conn.execute(
            "select agentdb_internal.lexical_slice_bounds(source_id => %s, slices => %s)",
            (blocks_source, slices),
        ).fetchone() or ([],)
    edges: list[str | None] = [None, *bounds, None]
    ranges = list(zip(edges[:-1], edges[1:], strict=True))

    def merge(own: psycopg.Connection[Any], lo: str | None, hi: str | None) -> tuple[int, int]:
        with own.transaction():
            ((b, a),) = run_sql(
                own,
                "select * from agentdb.lexical_optimize(source_name => %(s)s, term_from => %(lo)s, term_to => %(hi)s)",
                {"s": name, "lo": lo, "hi": hi},
            )
        if vacuum and b != a:
            # A plain VACUUM blocks neither readers nor writers; without truncating the file's empty tail, which
            # would take an exclusive lock (replayed on standbys); term_stats too, whose rows each range updated.
            own.execute("vacuum (truncate false) agentdb.posting_blocks, agentdb.term_stats")
        return int(b), int(a)

    if len(ranges) == 1 or workers <= 1:
        counts = [merge(conn, lo, hi) for lo, hi in ranges]
    else:
        counts = _merge_in_parallel(conn, blocks_source, ranges, min(workers, len(ranges)), merge)
    if rebuilt:
        # The old layout's postings are dead versions now, and the planner's statistics are of before.
        tables = "agentdb.postings, agentdb.posting_blocks, agentdb.term_stats"
        conn.execute(f"vacuum (analyze, truncate false) {tables}" if vacuum else f"analyze {tables}")
    return sum(b for b, _ in counts), sum(a for _, a in counts)


def _merge_in_parallel(
    conn: psycopg.Connection[Any],
    source_id: int | None,
    ranges: list[tuple[str | None, str | None]],
    workers: int,
    merge: Callable[[psycopg.Connection[Any], str | None, str | None], tuple[int, int]],
) -> list[tuple[int, int]]:
    """Merge term `ranges` on `conn` and `workers - 1` new connections to its server, each taking the next
    range; under a session advisory lock on the source, so that two optimizes of one source never merge the
    same range at once (agentdb.lexical_optimize lets disjoint ranges run together). The first error is
    raised once every worker has stopped; the ranges merged until then stay merged (each is complete)."""
    from agentdb.db.pool import configure

    todo = list(reversed(ranges))
    counts: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(own: psycopg.Connection[Any]) -> None:
        while True:
            with lock:
                if errors or not todo:
                    return
                lo, hi = todo.pop()
            try:
                result = merge(own, lo, hi)
            except BaseException as exc:  # re-raised by the caller's thread below
                with lock:
                    errors.append(exc)
                return
            with lock:
                counts.append(result)

    # A connection the server refuses (max_connections reached, say) leaves its share to the others.
    extra: list[psycopg.Connection[Any]] = []
    for _ in range(workers - 1):
        try:
            extra.append(
                psycopg.connect(make_conninfo(conn.info.dsn, password=conn.info.password), autocommit=True)
            )
        except psycopg.OperationalError:
            break
    conn.execute("select pg_advisory_lock(%s, %s)", (MERGE_LOCK_KEY, source_id))
    try:
        for own in extra:
            configure(own)
        threads = [threading.Thread(target=work, args=(own,)) for own in extra]
        for thread in threads:
            thread.start()
        work(conn)
        for thread in threads:
            thread.join()
    finally:
        conn.execute("select pg_advisory_unlock(%s, %s)", (MERGE_LOCK_KEY, source_id))
        for own in extra:
            own.close()
    if errors:
        raise errors[0]
    return counts
