"""A source's lexical index kept compact: rebuilt from its rows (check --repair), moved between layouts,\nits posting blocks merged in term ranges by parallel connections (optimize)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agentdb.sources.catalog import Source, get_source

log = logging.getLogger(__name__)

# Term ranges a merge of posting blocks goes through, a VACUUM after each (optimize_source).
MERGE_SLICES = 8


# Connections that merge those ranges at once: disjoint ranges merge in parallel, at the cost of a slightly
# larger block table while a range's freed space waits to be reused by a later one.
MERGE_WORKERS = 2


# A merge that took away at least this share of the block table's rows rebuilds the table's key index afterwards
# (compact_block_key): the pages its deleted keys held stay allocated, and a bulk load's merge leaves them mostly
# empty.
REINDEX_SHARE = 0.25

# How long that rebuild waits, at each of its steps, for the transactions it must outlast (every one running in the
# database when the step begins, however unrelated) before it gives up and leaves the index as it was.
REINDEX_LOCK_TIMEOUT = "10s"


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
    connections (this one and new ones to the same server) merge them at once (a distributed source's one at a
    time); writers wait for each range as before, and a second optimize of the same source waits for this one.
    On a connection inside a transaction (where VACUUM cannot run) the merge is one statement, as with
    `slices=1`."""
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
        "select id, distributed from agentdb.sources where name = %s and lexical_layout = 'blocks'", (name,)
    ).fetchone()
    blocks_source = row[0] if row else None
    if row is not None and row[1]:
        # A distributed source's ranges merge one after another: each writes every shard of the blocks, and
        # Citus's shard locks of two such transactions at once deadlock.
        workers = 1
    table_rows = 0.0
    if blocks_source is not None:
        conn.execute("analyze agentdb.posting_blocks")
        (table_rows,) = conn.execute(
            "select reltuples from pg_class where oid = 'agentdb.posting_blocks'::regclass"
        ).fetchone() or (0.0,)
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
    before, after = sum(b for b, _ in counts), sum(a for _, a in counts)
    if vacuum and blocks_source is not None and before - after >= REINDEX_SHARE * table_rows > 0:
        compact_block_key(conn)
    if rebuilt:
        # The old layout's postings are dead versions now, and the planner's statistics are of before.
        tables = "agentdb.postings, agentdb.posting_blocks, agentdb.term_stats"
        conn.execute(f"vacuum (analyze, truncate false) {tables}" if vacuum else f"analyze {tables}")
    return before, after


def merge_written_terms(conn: psycopg.Connection[Any], source: Source, doc_ids: list[str]) -> tuple[int, int]:
    """After a small write to a source in the block layout (one that does not merge the whole vocabulary, as a
    bulk load does through ingest.pipeline.analyze_source): merge the partly filled blocks of the terms of
    documents `doc_ids`, those held in more than 5/4 of the blocks they need (agentdb.lexical_optimize with its
    term list), in a transaction of its own. Each write statement cuts its own blocks, so without it a source
    fed one document at a time would hold a block per posting of each of its rarer terms, and its lookups would
    read one block per posting. A frequent term is rewritten once a quarter of its blocks are partly filled,
    a rare one sooner (its blocks are few). Under the source's merge lock (MERGE_LOCK_KEY, held to commit):
    two such merges of overlapping terms at once could deadlock, so they take turns, and wait for an optimize
    merging in parallel. Returns the number of those terms' blocks before and after."""
    from agentdb.db import run_sql

    if source.lexical_layout != "blocks" or not doc_ids:
        return 0, 0
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s, %s)", (MERGE_LOCK_KEY, source.id))
        (terms,) = conn.execute(
            sql.SQL(
                "select coalesce(array_agg(distinct t.lexeme), '{{}}') from {} r"
                " cross join lateral unnest(r.agentdb_tsv) t where r.doc_id = any(%s)"
            ).format(source.table),
            (doc_ids,),
        ).fetchone() or ([],)
        ((before, after),) = run_sql(
            conn,
            "select * from agentdb.lexical_optimize(source_name => %(s)s, terms => %(t)s)",
            {"s": source.name, "t": terms},
        )
    return int(before), int(after)


def compact_block_key(conn: psycopg.Connection[Any]) -> None:
    """Rebuild agentdb.posting_blocks' key index with REINDEX CONCURRENTLY, which blocks neither readers nor
    writers. Many writes each adding a term's partial block, then a merge deleting them, leave the index's pages
    sparse: at scifact-text 1M after a bulk load, 160 MB for 742,634 keys, which a rebuild fits in 30 MB. An
    index an interrupted rebuild left invalid is dropped first. A rebuild waits for every transaction running
    in the database as it goes: after REINDEX_LOCK_TIMEOUT it gives up with a warning (the next large merge
    tries again and drops what it left). Only the table's owner may rebuild it; on a Citus coordinator, where
    the table is a reference table, it is left as it is."""
    from agentdb.db.cluster import citus_version

    owner = conn.execute(
        "select pg_has_role(relowner, 'usage') from pg_class where oid = 'agentdb.posting_blocks'::regclass"
    ).fetchone()
    if not (owner and owner[0]) or citus_version(conn) is not None:
        return
    (before,) = conn.execute("select current_setting('lock_timeout')").fetchone() or ("0",)
    conn.execute("select set_config('lock_timeout', %s, false)", (REINDEX_LOCK_TIMEOUT,))
    try:
        invalid = conn.execute(
            "select n.nspname, c.relname from pg_index i join pg_class c on c.oid = i.indexrelid"
            " join pg_namespace n on n.oid = c.relnamespace"
            " where i.indrelid = 'agentdb.posting_blocks'::regclass and not i.indisvalid"
        ).fetchall()
        for schema, index in invalid:
            conn.execute(
                sql.SQL("drop index concurrently if exists {}").format(sql.Identifier(schema, index))
            )
        conn.execute("reindex index concurrently agentdb.posting_blocks_pkey")
    except psycopg.errors.LockNotAvailable:
        log.warning(
            "the posting blocks' key index was not rebuilt: other transactions ran longer than %s. It stays"
            " larger than it needs to be; `reindex index concurrently agentdb.posting_blocks_pkey` rebuilds it"
            " when the database is quieter",
            REINDEX_LOCK_TIMEOUT,
        )
    finally:
        conn.execute("select set_config('lock_timeout', %s, false)", (before,))


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
