"""Block postings (migrations/0013_block_postings.sql, sql/020_lexical.sql): a source whose lexical index is kept
in blocks answers exactly as exhaustive Okapi BM25 computed in Python from its rows, and exactly as a twin
source holding the same rows in the row layout, for lexical and hybrid retrieval, with filters, through random
inserts, updates, deletes and block merges (agentdb optimize); agentdb check sees broken blocks and --repair
rebuilds them; a principal granted a block source reads exactly what it reads of the row twin, and its role
never reads a posting of a chunk it may not read.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import threading
from collections import defaultdict
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from agentdb.auth import check_fields, create_principal, delete_principal, list_principals, principal_scope
from agentdb.cli import main as cli_main
from agentdb.db.pool import configure
from agentdb.errors import DatabaseSetupError, InvalidParamValue, StorageFileNotFound
from agentdb.memory import StoreSpec, write_records
from agentdb.retrieval import retrieve
from agentdb.sources import (
    MERGE_LOCK_KEY,
    FieldSpec,
    create_document_source,
    get_source,
    merge,
    optimize_source,
    rebuild_lexical,
)
from agentdb.sources.merge import REINDEX_SHARE
from tests.conftest import without_autovacuum
from tests.filter_oracle import filters, matches, sample_metadata

DIM = 8
FIELDS = [FieldSpec(name="year", type="int"), FieldSpec(name="status", type="string")]
FIELD_DICTS = [f.model_dump() for f in FIELDS]
# Zipf-like weights: the first words reach several blocks of 128 chunks, the last are rare.
WORDS = [f"w{i}x" for i in range(60)]
WEIGHTS = [1 / (i + 1) for i in range(len(WORDS))]
TWINS = ("blk", "rws")
CHECKS = ("postings", "term_stats", "term_bounds", "corpus_stats")
_docs = itertools.count()


def _rows(
    rng: random.Random, n: int, words: list[str] = WORDS, weights: list[float] = WEIGHTS
) -> list[tuple[Any, ...]]:
    """`n` new chunks (one per document): random words, metadata and unit vector."""
    out = []
    for _ in range(n):
        doc = f"d{next(_docs):05d}"
        v = np.array([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)
        text = " ".join(rng.choices(words, weights=weights, k=rng.randint(3, 40)))
        out.append((doc, 0, text, Jsonb(sample_metadata(FIELD_DICTS, rng)), v / np.linalg.norm(v)))
    return out


def _both(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> None:
    """Run `statement` (with {table} for the source table) on both twins, one statement each."""
    for name in TWINS:
        table = sql.Identifier("agentdb_docs", name)
        conn.execute(sql.SQL(statement).format(table=table), params)  # type: ignore[arg-type]


def _copy(conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]], names: tuple[str, ...] = TWINS) -> None:
    """Write `rows` to both twins (or to the sources `names`), one COPY statement each (so the block source gets
    blocks of many chunks)."""
    for name in names:
        target = sql.Identifier("agentdb_docs", name)
        with (
            conn.cursor() as cur,
            cur.copy(
                sql.SQL("copy {} (doc_id, chunk, text, metadata, agentdb_embedding) from stdin").format(
                    target
                )
            ) as copy,
        ):
            for doc, chunk, text, meta, vec in rows:
                copy.write_row(
                    (doc, chunk, text, json.dumps(meta.obj), "[" + ",".join(map(str, vec.tolist())) + "]")
                )


@pytest.fixture
def twins(conn: psycopg.Connection[Any]) -> random.Random:
    """Sources blk (block postings) and rws (row postings) with the same 600 chunks, written in three
    statements (so terms span several blocks, some partly filled). Returns the random source for more rows."""
    create_document_source(
        conn, "blk", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
    )
    create_document_source(
        conn, "rws", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="rows"
    )
    rng = random.Random(14)
    for n in (300, 200, 100):
        _copy(conn, _rows(rng, n))
    return rng


def lexical_check(conn: psycopg.Connection[Any], name: str) -> dict[str, int]:
    return {w: n for w, n in conn.execute("select what, mismatches from agentdb.lexical_check(%s)", (name,))}


def on_grid(score: float) -> float:
    """A BM25 score as the lexical legs return it: rounded to the 1e-9 grid (agentdb_internal.bm25_round),
    half to even as C's rint."""
    return round(score * 1e9) / 1e9


def exhaustive(
    conn: psycopg.Connection[Any], name: str, query: str, filter: dict[str, Any] | None, top_k: int
) -> list[tuple[str, int, float]]:
    """Okapi BM25 (k1 1.2, b 0.75) over every chunk of source `name`, from its tsvectors, in Python: the best
    `top_k` chunks passing `filter` by (score desc, chunk id), then ordered by (score desc, doc id, chunk). A
    query term counts once per occurrence in the query (its query frequency multiplies its weight). Scores are
    on the legs' 1e-9 grid."""
    src = get_source(conn, name)
    qtf = query_frequencies(conn, query)
    terms = set(qtf)
    tf: dict[int, dict[str, int]] = defaultdict(dict)
    dl: dict[int, int] = {}
    keys: dict[int, tuple[str, int, dict[str, Any]]] = {}
    for cid, doc_id, chunk, metadata, term, n in conn.execute(
        sql.SQL(
            "select c.agentdb_chunk_id, c.doc_id, c.chunk, c.metadata, t.lexeme,"
            " coalesce(cardinality(t.positions), 1) from {} c cross join lateral unnest(c.agentdb_tsv) t"
        ).format(src.table)
    ):
        tf[cid][term] = n
        dl[cid] = dl.get(cid, 0) + n
        keys[cid] = (doc_id, chunk, metadata)
    n_chunks = len(dl)
    avgdl = sum(dl.values()) / n_chunks
    df = {t: sum(1 for c in tf if t in tf[c]) for t in terms}
    scores = {}
    for cid, freqs in tf.items():
        held = [t for t in terms if t in freqs]
        if not held or not matches(FIELD_DICTS, filter, keys[cid][0], keys[cid][2]):
            continue
        scores[cid] = on_grid(
            sum(
                qtf[t]
                * math.log(1 + (n_chunks - df[t] + 0.5) / (df[t] + 0.5))
                * 2.2
                * freqs[t]
                / (freqs[t] + 1.2 * (1 - 0.75) + 1.2 * 0.75 / avgdl * dl[cid])
                for t in held
            )
        )
    best = sorted(scores, key=lambda c: (-scores[c], c))[:top_k]
    return sorted(((keys[c][0], keys[c][1], scores[c]) for c in best), key=lambda h: (-h[2], h[0], h[1]))


def query_frequencies(conn: psycopg.Connection[Any], query: str) -> dict[str, int]:
    """The lexemes of `query` (english) and how often the query says each, by its words' own count: the
    words are counted in Python, each stemmed alone by to_tsvector, not read from the query's tsvector."""
    counts: dict[str, int] = defaultdict(int)
    for word in query.split():
        for (lexeme,) in conn.execute("select lexeme from unnest(to_tsvector('english', %s))", (word,)):
            counts[lexeme] += 1
    return dict(counts)


def assert_same_ranking(got: list[tuple[str, int, float]], want: list[tuple[str, int, float]]) -> None:
    """The same scores (to 1e-9) in the same order; within a group of tied scores (the same point of the 1e-9
    grid) the same chunks, and where the top k cuts a tie group, as many chunks of that group. (The sums of SQL
    and Python differ in their last bits; they fall on different grid points only when a sum lies within those
    bits of a half-way point.)"""
    assert [s for *_, s in got] == pytest.approx([s for *_, s in want], abs=2e-9)
    groups_got: dict[int, set[tuple[str, int]]] = defaultdict(set)
    groups_want: dict[int, set[tuple[str, int]]] = defaultdict(set)
    for d, c, s in got:
        groups_got[round(s * 1e9)].add((d, c))
    for d, c, s in want:
        groups_want[round(s * 1e9)].add((d, c))
    last = round(want[-1][2] * 1e9) if want else None
    for score, members in groups_want.items():
        if score != last:
            assert groups_got[score] == members, score
    if last is not None:
        assert len(groups_got[last]) == len(groups_want[last])


def _hits(result: Any) -> list[tuple[str, int, float]]:
    return [(h.id, h.chunk, h.score) for h in result.hits]


# A gap in chunk ids wider than a narrow block's offsets reach (int2, migrations/0025_narrow_posting_blocks.sql):
# the blocks of a term whose chunks straddle it keep their offsets wide.
WIDE_SPAN = 40_000


def skip_ids(conn: psycopg.Connection[Any], names: tuple[str, ...], gap: int) -> None:
    """Make the next chunk ids of sources `names` jump `gap` past their largest (nothing when 0)."""
    for name in names if gap else ():
        table = sql.Identifier("agentdb_docs", name)
        conn.execute(
            sql.SQL(
                "select setval(pg_get_serial_sequence(%s, 'agentdb_chunk_id'),"
                " coalesce((select max(agentdb_chunk_id) from {}), 0) + %s)"
            ).format(table),
            (f"agentdb_docs.{name}", gap),
        )


def _random_write(conn: psycopg.Connection[Any], rng: random.Random, data: st.DataObject) -> str:
    """Apply one random write to both twins (a bulk insert, an update, a delete) or none; returns the
    operation drawn, "optimize" included, which the caller carries out with its own checks."""
    op = data.draw(st.sampled_from(["insert", "update", "delete", "optimize", "none"]), label="op")
    if op == "insert":
        skip_ids(conn, TWINS, data.draw(st.sampled_from([0, 0, 0, WIDE_SPAN]), label="id gap"))
        _copy(conn, _rows(rng, data.draw(st.integers(1, 150), label="n")))
    elif op == "update":
        words = " ".join(rng.choices(WORDS, k=rng.randint(1, 20)))
        mod = data.draw(st.integers(2, 9), label="mod")
        # Of the text, of the title, or of neither (a virtual agentdb_tsv's inputs unchanged: nothing to redo).
        statement = data.draw(
            st.sampled_from(
                [
                    "update {table} set text = text || ' ' || %s where agentdb_chunk_id %% %s = 0",
                    "update {table} set title = %s where agentdb_chunk_id %% %s = 0",
                    "update {table} set metadata = jsonb_build_object('u', %s::text) where agentdb_chunk_id %% %s = 0",
                ]
            ),
            label="update",
        )
        _both(conn, statement, (words, mod))
    elif op == "delete":
        mod = data.draw(st.integers(3, 11), label="mod")
        _both(conn, "delete from {table} where agentdb_chunk_id %% %s = 1", (mod,))
    return op


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_blocks_equal_exhaustive_bm25_and_the_row_layout(
    conn: psycopg.Connection[Any], twins: random.Random, data: st.DataObject
) -> None:
    """After each random write (bulk insert, update of text, delete, merge), the block source's index matches
    its rows (agentdb check); its lexical top 10 and top 100 equal exhaustive BM25 (and the row twin's top 10),
    and its hybrid top 10 is the exact RRF of its legs (ids, order, scores), with and without a filter and
    MaxScore pruning."""
    rng = twins
    op = _random_write(conn, rng, data)
    if op == "optimize":
        before, after = optimize_source(conn, "blk")
        assert after <= before
        assert optimize_source(conn, "blk") == (after, after)
        assert optimize_source(conn, "rws") == (0, 0)
    assert lexical_check(conn, "blk") == {"postings": 0, "term_stats": 0, "term_bounds": 0, "corpus_stats": 0}

    query = " ".join(
        data.draw(st.lists(st.sampled_from([*WORDS, "nowhere"]), min_size=1, max_size=5), label="q")
    )
    filt = data.draw(st.one_of(st.none(), filters(FIELD_DICTS)), label="filter")
    seed = data.draw(st.sampled_from(["1", "40", "20000"]), label="lexical_seed_postings")
    conn.execute("select set_config('agentdb.lexical_seed_postings', %s, false)", (seed,))
    lexical = {name: _hits(retrieve(conn, name, query, mode="lexical", filter=filt)) for name in TWINS}
    assert_same_ranking(lexical["blk"], exhaustive(conn, "blk", query, filt, 10))
    assert_same_ranking(lexical["blk"], lexical["rws"])

    # Hybrid: RRF of the block source's own legs at the candidate depth, computed exactly in Python.
    cand = 100
    v = np.array([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)
    legs = [
        retrieve(conn, "blk", query, mode="lexical", filter=filt, top_k=cand),
        retrieve(conn, "blk", "", mode="dense", filter=filt, top_k=cand, query_embedding=v, threshold=0.0),
    ]
    assert_same_ranking(_hits(legs[0]), exhaustive(conn, "blk", query, filt, cand))
    fused: dict[tuple[str, int], Fraction] = defaultdict(Fraction)
    for leg in legs:
        for rank, h in enumerate(leg.hits, start=1):
            fused[(h.id, h.chunk)] += Fraction(1, 60 + rank)
    want = sorted(fused, key=lambda k: (-fused[k], k))[:10]
    got = retrieve(
        conn, "blk", query, mode="hybrid", filter=filt, query_embedding=v, threshold=0.0, candidates=cand
    )
    assert [(h.id, h.chunk) for h in got.hits] == want
    assert [h.score for h in got.hits] == pytest.approx([float(fused[k]) for k in want], abs=1e-12)


def test_a_repeated_query_word_counts_once_per_occurrence(
    conn: psycopg.Connection[Any], twins: random.Random
) -> None:
    """A query term's weight is multiplied by how often the query says it (as Lucene's BooleanQuery of
    repeated TermQuery clauses and bm25s score): both layouts, summed and pruned by MaxScore, and
    agentdb.score_keys give exhaustive BM25 with query frequencies, and a word said three times scores each
    chunk exactly three times as high as the word said once."""
    queries = ["w3x w3x w17x", "w0x w9x w0x w9x w0x", "w41x w41x w41x w41x w2x", "w5x nowhere w5x"]
    for seed in ("1", "20000"):
        conn.execute("select set_config('agentdb.lexical_seed_postings', %s, false)", (seed,))
        for query in queries:
            want = exhaustive(conn, "blk", query, None, 20)
            for name in TWINS:
                assert_same_ranking(_hits(retrieve(conn, name, query, mode="lexical", top_k=20)), want)
    docs = [d for d, _, _ in exhaustive(conn, "blk", "w3x w17x", None, 600)]
    keyed = dict(
        conn.execute(
            "select doc_id, lexical from agentdb.score_keys('blk', %s, 'w3x w3x w17x')", (docs,)
        ).fetchall()
    )
    assert keyed == pytest.approx({d: s for d, _, s in exhaustive(conn, "blk", "w3x w3x w17x", None, 600)})
    once = {d: s for d, _, s in exhaustive(conn, "blk", "w41x", None, 600)}
    thrice = {h.id: h.score for h in retrieve(conn, "blk", "w41x w41x w41x", mode="lexical", top_k=600).hits}
    # each on the 1e-9 grid: three times a rounded score is within 2e-9 of the rounded triple
    assert once and thrice == pytest.approx({d: 3 * s for d, s in once.items()}, abs=2.5e-9)


def test_check_sees_broken_blocks_and_repair_rebuilds_them(
    conn: psycopg.Connection[Any],
    twins: random.Random,
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A changed term frequency is a postings mismatch, a bound tighter than its block a term_bounds one, an
    offset outside its block's range a postings one; `agentdb check --repair` rebuilds the blocks."""
    src = get_source(conn, "blk")
    key = conn.execute(
        "select term, first_chunk from agentdb.posting_blocks where source_id = %s and cardinality(tfs) > 2"
        " and narrow_offs is not null"
        " order by term, first_chunk limit 1",
        (src.id,),
    ).fetchone()
    assert key is not None
    params = (src.id, *key)
    conn.execute(
        "update agentdb.posting_blocks set tfs[1] = tfs[1] + 1 where source_id = %s and term = %s and first_chunk = %s",
        params,
    )
    assert lexical_check(conn, "blk")["postings"] == 2
    conn.execute(
        "update agentdb.posting_blocks set tfs[1] = tfs[1] - 1, max_tf = 0"
        " where source_id = %s and term = %s and first_chunk = %s",
        params,
    )
    assert lexical_check(conn, "blk") == {"postings": 0, "term_stats": 0, "term_bounds": 1, "corpus_stats": 0}
    conn.execute(
        "update agentdb.posting_blocks set max_tf = 256, narrow_offs[1] = narrow_offs[1] - 1"
        " where source_id = %s and term = %s and first_chunk = %s",
        params,
    )
    assert lexical_check(conn, "blk")["postings"] > 0
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert cli_main(["check", "blk"]) == 2
    assert not cli_main(["check", "blk", "--repair"])
    assert "repaired" in capsys.readouterr().out
    assert lexical_check(conn, "blk") == {"postings": 0, "term_stats": 0, "term_bounds": 0, "corpus_stats": 0}


def test_a_rebuild_cuts_blocks_in_chunk_order_and_leaves_them_vacuumed(
    conn: psycopg.Connection[Any], twins: random.Random
) -> None:
    """A rebuild reads the source table in its physical order, which rows written again leave out of chunk
    order; it cuts each term's blocks in chunk order all the same, as a merge does (the term's postings, block
    by block, in ascending chunk order: disjoint narrow ranges), both when `agentdb check --repair` rebuilds
    (sources.rebuild_lexical) and when a source moves to blocks. Afterwards the index matches its rows, answers
    as exhaustive BM25, and the block table is vacuumed (every page all-visible) and analyzed."""
    without_autovacuum(conn)
    _both(conn, "update {table} set metadata = metadata where agentdb_chunk_id % 5 = 0")
    for name in TWINS:
        table = get_source(conn, name).table
        physical = [r[0] for r in conn.execute(sql.SQL("select agentdb_chunk_id from {}").format(table))]
        assert physical != sorted(physical)
    rebuild_lexical(conn, "blk")
    optimize_source(conn, "rws", layout="blocks")
    for name in TWINS:
        per_term: dict[str, list[int]] = defaultdict(list)
        for term, first, offs in conn.execute(
            "select b.term, b.first_chunk, agentdb_internal.block_ints(b.offs, b.narrow_offs)"
            " from agentdb.posting_blocks b"
            " join agentdb.sources s on s.id = b.source_id where s.name = %s order by b.term, b.first_chunk",
            (name,),
        ):
            per_term[term] += [first + o for o in offs]
        assert per_term and all(ids == sorted(set(ids)) for ids in per_term.values())
        assert lexical_check(conn, name) == dict.fromkeys(CHECKS, 0)
        query = "w0x w3x w17x w3x"
        assert_same_ranking(
            _hits(retrieve(conn, name, query, mode="lexical", top_k=20)),
            exhaustive(conn, name, query, None, 20),
        )
    pages, visible, analyzed = conn.execute(
        "select c.relpages, c.relallvisible, s.last_analyze is not null from pg_class c"
        " join pg_stat_user_tables s on s.relid = c.oid where c.oid = 'agentdb.posting_blocks'::regclass"
    ).fetchone() or (0, 0, False)
    assert pages > 0 and visible == pages and analyzed


def test_layouts_convert_both_ways(conn: psycopg.Connection[Any], twins: random.Random) -> None:
    """agentdb optimize --layout moves a source between layouts (same results, index matching its rows)."""
    query = "w0x w3x w17x"
    assert get_source(conn, "blk").lexical_layout == "blocks"
    want = _hits(retrieve(conn, "blk", query, mode="lexical"))
    optimize_source(conn, "blk", layout="rows")
    assert get_source(conn, "blk").lexical_layout == "rows"
    assert conn.execute("select count(*) from agentdb.posting_blocks").fetchone() == (0,)
    assert_same_ranking(_hits(retrieve(conn, "blk", query, mode="lexical")), want)
    optimize_source(conn, "blk", layout="blocks")
    assert_same_ranking(_hits(retrieve(conn, "blk", query, mode="lexical")), want)
    assert lexical_check(conn, "blk") == {"postings": 0, "term_stats": 0, "term_bounds": 0, "corpus_stats": 0}
    # An unknown source is the clear error, not a merge of nothing.
    with pytest.raises(StorageFileNotFound) as raised:
        optimize_source(conn, "nope")
    assert raised.value.code == 3010 and raised.value.path == "source"


def test_a_write_during_a_layout_change_lands_in_the_new_layout(
    conn: psycopg.Connection[Any], twins: random.Random, db_url: str
) -> None:
    """A write whose statement starts while agentdb optimize --layout moves the source to blocks waits for the
    move and adds its postings as blocks (it read the layout under a lock the move holds): afterwards no posting
    of the source is left in the row table, the index matches the rows, and the new chunk is found."""
    rws = get_source(conn, "rws").id
    mover = psycopg.connect(db_url, autocommit=True)
    writer = psycopg.connect(db_url, autocommit=True)
    configure(mover)
    configure(writer)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            _copy(writer, _rows(twins, 5, words=["latecomer"], weights=[1.0]), names=("rws",))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    try:
        with mover.transaction():
            mover.execute("select agentdb.lexical_set_layout('rws', 'blocks')")
            thread = threading.Thread(target=write)
            thread.start()
            waited = 0.0
            while waited < 20 and not conn.execute(
                "select count(*) from pg_stat_activity where pid = %s and wait_event_type = 'Lock'",
                (writer.info.backend_pid,),
            ).fetchone() == (1,):
                threading.Event().wait(0.05)
                waited += 0.05
            assert waited < 20, "the write did not wait for the layout change"
        thread.join(30)
        assert not thread.is_alive() and not errors, errors
    finally:
        mover.close()
        writer.close()
    assert get_source(conn, "rws").lexical_layout == "blocks"
    assert conn.execute("select count(*) from agentdb.postings where source_id = %s", (rws,)).fetchone() == (
        0,
    )
    assert lexical_check(conn, "rws") == dict.fromkeys(CHECKS, 0)
    hits = _hits(retrieve(conn, "rws", "latecomer", mode="lexical", top_k=10))
    assert len(hits) == 5


def test_concurrent_writers_readers_and_a_merge_stay_exact(
    conn: psycopg.Connection[Any], twins: random.Random, db_url: str
) -> None:
    """Two writers, each on its own connection and thread, write both twins at once (COPY batches, re-ingested
    batches that delete and insert, updates of text) while a third connection merges the blocks and a reader
    checks snapshots: every snapshot the reader takes (REPEATABLE READ) has an index that matches its rows
    (agentdb check) and lexical hits equal to exhaustive BM25 and to the row twin's; so has the end state. The
    writers insert their blocks before queueing for the source's statistics: no deadlock, no lost update."""
    writers_done = threading.Event()
    start = threading.Barrier(4)
    errors: list[BaseException] = []
    snapshots: list[int] = []

    def guarded(work: Callable[[psycopg.Connection[Any]], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                with psycopg.connect(db_url, autocommit=True) as own:
                    configure(own)
                    start.wait()
                    work(own)
            except BaseException as exc:  # handed to the test's thread, which re-raises it
                errors.append(exc)
                start.abort()

        return run

    def writer(seed: int) -> Callable[[psycopg.Connection[Any]], None]:
        def write(own: psycopg.Connection[Any]) -> None:
            rng = random.Random(seed)
            mine: list[str] = []
            for step in range(6):
                rows = _rows(rng, rng.randint(40, 150))
                with own.transaction():
                    if step % 3 == 2 and mine:
                        gone = rng.sample(mine, k=len(mine) // 3)
                        _both(own, "delete from {table} where doc_id = any(%s)", (gone,))
                        mine = [d for d in mine if d not in gone]
                    _copy(own, rows)
                    if step % 3 == 1:
                        words = " ".join(rng.choices(WORDS, k=rng.randint(1, 10)))
                        _both(
                            own,
                            "update {table} set text = text || ' ' || %s where doc_id = any(%s)",
                            (words, mine[::4]),
                        )
                mine += [r[0] for r in rows]

        return write

    def merger(own: psycopg.Connection[Any]) -> None:
        for _ in range(3):
            optimize_source(own, "blk")

    def reader(own: psycopg.Connection[Any]) -> None:
        rng = random.Random(7)
        while not writers_done.is_set() or not snapshots:
            with own.transaction():
                own.execute("set transaction isolation level repeatable read")
                assert lexical_check(own, "blk") == dict.fromkeys(CHECKS, 0)
                assert lexical_check(own, "rws") == dict.fromkeys(CHECKS, 0)
                query = " ".join(rng.choices([*WORDS, "nowhere"], k=rng.randint(1, 4)))
                got = {name: _hits(retrieve(own, name, query, mode="lexical")) for name in TWINS}
                assert_same_ranking(got["blk"], exhaustive(own, "blk", query, None, 10))
                assert_same_ranking(got["blk"], got["rws"])
                row = own.execute("select count(*) from agentdb_docs.blk").fetchone()
                snapshots.append(row[0] if row else 0)

    threads = [threading.Thread(target=guarded(work)) for work in (writer(1), writer(2), merger, reader)]
    for t in threads:
        t.start()
    for t in threads[:3]:
        t.join(timeout=600)
    writers_done.set()
    threads[3].join(timeout=600)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    assert snapshots
    for name in TWINS:
        assert lexical_check(conn, name) == dict.fromkeys(CHECKS, 0)
    for query in ("w0x", "w1x w7x", "w3x w22x w59x", "w0x w2x w5x w11x w40x"):
        got = _hits(retrieve(conn, "blk", query, mode="lexical", top_k=100))
        assert_same_ranking(got, exhaustive(conn, "blk", query, None, 100))
        assert_same_ranking(got, _hits(retrieve(conn, "rws", query, mode="lexical", top_k=100)))


# Principals on block sources ------------------------------------------------------------------------------

# Document ids that row filters may name (the twins' ids are d00000 upwards, counted across tests).
ID_POOL = [f"d{i:05d}" for i in range(0, 4000, 9)]
_principals = itertools.count()


def _metadata(conn: psycopg.Connection[Any], name: str) -> dict[str, dict[str, Any]]:
    """Doc id -> metadata of every row of source `name`, read as the owner."""
    query = sql.SQL("select doc_id, metadata from {}").format(get_source(conn, name).table)
    return {doc_id: meta for doc_id, meta in conn.execute(query)}


def _block_postings_of(conn: psycopg.Connection[Any], name: str, doc_ids: set[str]) -> set[tuple[Any, ...]]:
    """The postings (term, chunk id, tf, dl) held in the blocks of source `name` for the chunks of documents
    `doc_ids`, read as the owner."""
    src = get_source(conn, name)
    query = sql.SQL(
        "select b.term, b.first_chunk + u.off, u.tf::int, u.dl from agentdb.posting_blocks b"
        " cross join lateral unnest(agentdb_internal.block_ints(b.offs, b.narrow_offs), b.tfs,"
        " agentdb_internal.block_ints(b.dls, b.narrow_dls)) as u(off, tf, dl)"
        " join {} c on c.agentdb_chunk_id = b.first_chunk + u.off"
        " where b.source_id = %s and c.doc_id = any(%s)"
    ).format(src.table)
    return set(conn.execute(query, (src.id, sorted(doc_ids))).fetchall())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_principal_reads_a_block_source_as_its_row_twin(
    conn: psycopg.Connection[Any], twins: random.Random, data: st.DataObject
) -> None:
    """A principal granted both twins, with a random row filter and field grant, gets from the block source
    exactly its hits on the row source (lexical at two depths, and hybrid as the exact RRF of its legs) and
    the owner's hits with the row filter as an ordinary filter (and exhaustive BM25 over the rows it may
    read), through random inserts, updates, deletes and merges, with and without MaxScore pruning."""
    rng = twins
    row_filter = data.draw(filters(FIELD_DICTS, ID_POOL), label="row_filter")
    grant = data.draw(
        st.none() | st.lists(st.sampled_from(["title", "text", "year", "status"]), unique=True),
        label="fields",
    )
    principal, _ = create_principal(
        conn, f"b{next(_principals)}", tables=list(TWINS), row_filter=row_filter, fields=grant
    )
    try:
        if _random_write(conn, rng, data) == "optimize":
            optimize_source(conn, "blk")

        query = " ".join(
            data.draw(st.lists(st.sampled_from([*WORDS, "nowhere"]), min_size=1, max_size=5), label="q")
        )
        seed = data.draw(st.sampled_from(["1", "40", "20000"]), label="lexical_seed_postings")
        fields = check_fields(principal, None)
        cand = 100
        v = np.array([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)
        lexical: dict[str, list[tuple[str, int, float]]] = {}
        deep: dict[str, list[tuple[str, int, float]]] = {}
        with principal_scope(conn, principal) as scoped:
            scoped.execute("select set_config('agentdb.lexical_seed_postings', %s, true)", (seed,))
            for name in TWINS:
                lexical[name] = _hits(retrieve(scoped, name, query, mode="lexical", fields=fields))
                deep[name] = _hits(retrieve(scoped, name, query, mode="lexical", fields=fields, top_k=cand))
            dense = retrieve(
                scoped, "blk", "", mode="dense", top_k=cand, query_embedding=v, threshold=0.0, fields=fields
            )
            hybrid = retrieve(
                scoped,
                "blk",
                query,
                mode="hybrid",
                query_embedding=v,
                threshold=0.0,
                candidates=cand,
                fields=fields,
            )
        conn.execute("select set_config('agentdb.lexical_seed_postings', %s, false)", (seed,))
        owner = _hits(retrieve(conn, "rws", query, mode="lexical", filter=row_filter))
        assert_same_ranking(lexical["blk"], lexical["rws"])
        assert_same_ranking(lexical["blk"], owner)
        assert_same_ranking(lexical["blk"], exhaustive(conn, "blk", query, row_filter, 10))
        assert_same_ranking(deep["blk"], deep["rws"])
        assert_same_ranking(deep["blk"], exhaustive(conn, "blk", query, row_filter, cand))

        fused: dict[tuple[str, int], Fraction] = defaultdict(Fraction)
        for leg in (deep["blk"], _hits(dense)):
            for rank, (doc, chunk, _) in enumerate(leg, start=1):
                fused[(doc, chunk)] += Fraction(1, 60 + rank)
        want = sorted(fused, key=lambda k: (-fused[k], k))[:10]
        assert [(h.id, h.chunk) for h in hybrid.hits] == want
        assert [h.score for h in hybrid.hits] == pytest.approx([float(fused[k]) for k in want], abs=1e-12)
    finally:
        delete_principal(conn, principal.name)


def _block_terms(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("select distinct term from agentdb.posting_blocks order by 1")]


def test_the_role_reads_no_block_posting_of_a_hidden_chunk(
    conn: psycopg.Connection[Any], twins: random.Random
) -> None:
    """Under a principal's role, called directly with any arguments: posting_blocks shows nothing; the block
    postings function and term_postings give exactly the postings of the chunks it may read of a block source
    it is granted, and nothing of a source it is not granted (nor of a row source, whose postings policy
    serves it); an open grant reads every posting."""
    row_filter = {"year": {"$gte": 5}}
    reader, _ = create_principal(
        conn,
        "reader",
        tables=["blk"],
        row_filter=row_filter,
        fields=["text", "year"],
        tools=["search", "ingest"],
    )
    everyone, _ = create_principal(conn, "everyone", tables=["blk"])
    outsider, _ = create_principal(conn, "outsider", tables=["rws"])
    try:
        blk, rws = get_source(conn, "blk").id, get_source(conn, "rws").id
        # Its writes (the ingest tool) keep the blocks current: the lexical triggers run as their owner.
        with principal_scope(conn, reader) as scoped:
            scoped.execute(
                "insert into agentdb_docs.blk (doc_id, chunk, text, metadata) values ('mine', 0, 'w0x w59x', %s)",
                (Jsonb({"year": 7}),),
            )
            deleted = scoped.execute(
                "delete from agentdb_docs.blk where doc_id = (select min(doc_id) from agentdb_docs.blk)"
            )
            assert deleted.rowcount == 1
        assert lexical_check(conn, "blk") == {
            "postings": 0,
            "term_stats": 0,
            "term_bounds": 0,
            "corpus_stats": 0,
        }
        metadata = _metadata(conn, "blk")
        assert "mine" in metadata
        allowed = {d for d, meta in metadata.items() if matches(FIELD_DICTS, row_filter, d, meta)}
        assert 0 < len(allowed) < len(metadata)
        terms = [*_block_terms(conn), "nowhere"]
        weights = [float(i) for i in range(len(terms))]
        visible = _block_postings_of(conn, "blk", allowed)
        every = _block_postings_of(conn, "blk", set(metadata))
        assert visible < every
        with principal_scope(conn, reader) as scoped:
            # The statistics are written by the triggers (as their owner), never by the role itself: called
            # directly, the function that applies a write's delta is refused and changes nothing.
            with pytest.raises(psycopg.errors.InsufficientPrivilege), scoped.transaction():
                scoped.execute(
                    "select agentdb_internal.lexical_apply(%s, row(1000000, 1, array['w0x'], array[1000000]::bigint[],"
                    " array[1], array[1], array[0]::bigint[])::agentdb_internal.lexical_delta)",
                    (blk,),
                )
            assert scoped.execute("select count(*) from agentdb.posting_blocks").fetchone() == (0,)
            direct = set(
                scoped.execute(
                    "select * from agentdb_internal.principal_block_postings(%s, %s)", (blk, terms)
                ).fetchall()
            )
            through = set(
                scoped.execute(
                    "select term, chunk_id, tf, dl from agentdb_internal.term_postings(%s, %s, %s)",
                    (blk, terms, weights),
                ).fetchall()
            )
            weighted_as_role = scoped.execute(
                "select distinct term, wk from agentdb_internal.term_postings(%s, %s, %s)",
                (blk, terms, weights),
            ).fetchall()
            assert not scoped.execute(
                "select * from agentdb_internal.principal_block_postings(%s, %s)", (rws, terms)
            ).fetchall()
            for statement in ("select doc_id from agentdb_docs.rws", "select metadata from agentdb_docs.blk"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege), scoped.transaction():
                    scoped.execute(statement)
        assert direct == visible and through == visible
        # Each posting carries its own term's weight, read from the blocks (the owner) or through the function.
        weighted = conn.execute(
            "select distinct term, wk from agentdb_internal.term_postings(%s, %s, %s)", (blk, terms, weights)
        ).fetchall()
        for pairs in (weighted, weighted_as_role):
            assert len(pairs) > 3 and all(wk == weights[terms.index(term)] for term, wk in pairs)
        with principal_scope(conn, everyone) as scoped:
            assert (
                set(
                    scoped.execute(
                        "select * from agentdb_internal.principal_block_postings(%s, %s)", (blk, terms)
                    ).fetchall()
                )
                == every
            )
        with principal_scope(conn, outsider) as scoped:
            for source_id in (blk, rws, -1, None):
                assert not scoped.execute(
                    "select * from agentdb_internal.principal_block_postings(%s, %s)", (source_id, terms)
                ).fetchall()
            assert not scoped.execute(
                "select * from agentdb_internal.term_postings(%s, %s, %s)", (blk, terms, weights)
            ).fetchall()
        # The application, and any other role, gets nothing from the function.
        assert not conn.execute(
            "select * from agentdb_internal.principal_block_postings(%s, %s)", (blk, terms)
        ).fetchall()
    finally:
        for p in (reader, everyone, outsider):
            delete_principal(conn, p.name)


def test_the_owner_never_runs_the_principals_block_reader(
    conn: psycopg.Connection[Any], twins: random.Random
) -> None:
    """term_postings gates its two block branches by the current user's name (one-time filters): outside a
    principal's role the SECURITY DEFINER reader is never executed, and under one the blocks are not read."""

    def loops(plan: dict[str, Any], relation: str) -> list[int]:
        here = (
            [plan["Actual Loops"]]
            if relation in (plan.get("Function Name"), plan.get("Relation Name"))
            else []
        )
        return here + [n for child in plan.get("Plans", []) for n in loops(child, relation)]

    statement = "explain (analyze, format json) select * from agentdb_internal.term_postings(%s, %s, %s)"
    terms = _block_terms(conn)
    params = (get_source(conn, "blk").id, terms, [1.0] * len(terms))
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    assert loops(row[0][0]["Plan"], "principal_block_postings") == [0]
    assert loops(row[0][0]["Plan"], "posting_blocks") == [1]
    reader, _ = create_principal(conn, "reader", tables=["blk"])
    try:
        with principal_scope(conn, reader) as scoped:
            row = scoped.execute(statement, params).fetchone()
        assert row is not None
        assert loops(row[0][0]["Plan"], "principal_block_postings") == [1]
        assert loops(row[0][0]["Plan"], "posting_blocks") == [0]
    finally:
        delete_principal(conn, "reader")


def test_block_sources_with_foreign_policies(conn: psycopg.Connection[Any], twins: random.Random) -> None:
    """Row security that is not agentdb's cannot be applied to block reads: granting a block source whose table
    has such a policy is refused, as is moving a source read by principals with one to blocks; a policy added
    after the grant makes the principal's block reads fail rather than show chunks the policy hides."""
    conn.execute(
        "create policy not_mine on agentdb_docs.blk as restrictive for select to public using (chunk = 0)"
    )
    with pytest.raises(InvalidParamValue) as refused:
        create_principal(conn, "reader", tables=["blk"])
    assert refused.value.path == "tables" and "not_mine" in refused.value.message
    assert not list_principals(conn)

    reader, _ = create_principal(conn, "reader", tables=["rws"], row_filter={"year": {"$gte": 5}})
    try:
        conn.execute("create policy not_mine on agentdb_docs.rws for select to public using (true)")
        with pytest.raises(InvalidParamValue) as kept:
            optimize_source(conn, "rws", layout="blocks")
        assert kept.value.path == "layout" and get_source(conn, "rws").lexical_layout == "rows"
        # Without the foreign policies, both moves go through.
        for name in TWINS:
            conn.execute(sql.SQL("drop policy not_mine on {}").format(get_source(conn, name).table))
        optimize_source(conn, "rws", layout="blocks")
        with principal_scope(conn, reader) as scoped:
            assert retrieve(scoped, "rws", "w0x w1x w2x", mode="lexical", top_k=50).hits
        conn.execute(
            "create policy not_mine on agentdb_docs.rws as restrictive for select to public using (false)"
        )
        with pytest.raises(DatabaseSetupError) as failed, principal_scope(conn, reader) as scoped:
            retrieve(scoped, "rws", "w0x w1x w2x", mode="lexical")
        assert failed.value.path == "source"
        # The owner's reads are not affected.
        assert retrieve(conn, "rws", "w0x w1x w2x", mode="lexical").hits
    finally:
        delete_principal(conn, "reader")


MEMORIES = [
    "Alice is allergic to peanuts and to walnuts.",
    "Alice prefers a window seat on long flights.",
    "Alice likes grilled fish with lemon, and peanuts in salads are out.",
    "Bob, Alice's brother, flies to Lisbon on long weekends.",
    "The window of the kitchen faces the lemon tree.",
]


def test_a_principals_memory_store_in_blocks(conn: psycopg.Connection[Any], embedder: Any) -> None:
    """A principal's own memory store (which its role reads whole) moved to blocks and written to under its
    role answers its lexical searches as in rows; another principal's role reads none of its block postings."""
    alice, _ = create_principal(conn, "alice", tables=[], tools=["memory"])
    mallory, _ = create_principal(conn, "mallory", tables=[], tools=["memory"])
    try:
        spec = StoreSpec(schema="notes")
        records = [{"text": t, "importance": 5} for t in MEMORIES]
        write_records(conn, "diary", records[:3], principal=alice, embedder=embedder, spec=spec)
        row = conn.execute(
            "select s.name, s.id from agentdb.memory_stores m join agentdb.sources s on s.id = m.source_id"
            " where m.owner = %s",
            (alice.id,),
        ).fetchone()
        assert row is not None
        name, source_id = row
        queries = ["peanuts", "long window flights", "lemon fish alice", "lisbon"]

        def searched() -> dict[str, list[tuple[str, int, float]]]:
            with principal_scope(conn, alice) as scoped:
                return {q: _hits(retrieve(scoped, name, q, mode="lexical")) for q in queries}

        optimize_source(conn, name, layout="blocks")
        write_records(conn, "diary", records[3:], principal=alice, embedder=embedder, spec=spec)
        assert lexical_check(conn, name) == {
            "postings": 0,
            "term_stats": 0,
            "term_bounds": 0,
            "corpus_stats": 0,
        }
        in_blocks = searched()
        assert all(in_blocks.values())
        terms = _block_terms(conn)
        with principal_scope(conn, mallory) as scoped:
            assert not scoped.execute(
                "select * from agentdb_internal.principal_block_postings(%s, %s)", (source_id, terms)
            ).fetchall()
        optimize_source(conn, name, layout="rows")
        for query, hits in searched().items():
            assert_same_ranking(in_blocks[query], hits)
    finally:
        for p in (alice, mallory):
            delete_principal(conn, p.name)


@pytest.mark.parametrize("workers", [1, 2])
def test_sliced_merge_equals_one_merge_and_reuses_the_space_it_frees(
    conn: psycopg.Connection[Any], workers: int
) -> None:
    """agentdb optimize merges in term ranges, a VACUUM after each, on one connection or on two at once: it
    leaves exactly the blocks and term statistics of the merge in one statement (inside a transaction) and
    answers as before and as exhaustive BM25. On one connection it grows the block table's file by less than
    half of what it rewrote. Two block sources get the same rows (hence the same chunk ids) in ten writes.

    A VACUUM frees a deleted version only once no transaction that began before the deletion committed is
    still running. The merge's own VACUUMs are the only ones here: autovacuum is off for this test's tables
    (its ANALYZE, run at any moment, holds such a snapshot). On one connection the ranges then run one after
    the other and each VACUUM frees its range's versions, whatever the load. On two, the other connection's
    range may have begun before that commit, so what each VACUUM frees depends on how the two interleave:
    the file's growth is not asserted there."""
    without_autovacuum(conn)
    _twin_block_sources(conn, ("sliced", "whole"), "v", seed=21, writes=10, size=400)
    queries = ["v0x v5x v77x", "v1x v2x", "v150x v399x v12x"]
    want = {q: _hits(retrieve(conn, "sliced", q, mode="lexical", top_k=20)) for q in queries}

    def file_size() -> int:
        row = conn.execute("select pg_relation_size('agentdb.posting_blocks')").fetchone()
        assert row is not None
        return int(row[0])

    def term_stats(name: str) -> list[tuple[Any, ...]]:
        return conn.execute(
            "select t.term, t.df, t.max_tf, t.min_dl, t.max_span from agentdb.term_stats t"
            " join agentdb.sources s on s.id = t.source_id where s.name = %s order by t.term",
            (name,),
        ).fetchall()

    src = get_source(conn, "sliced")
    row = conn.execute("select agentdb_internal.lexical_slice_bounds(%s, 8)", (src.id,)).fetchone()
    assert row is not None and len(row[0]) == 7
    merged = [
        r[0]
        for r in conn.execute(
            "select term from agentdb.posting_blocks where source_id = %s"
            " group by term having count(*) * 4 > ceil(sum(cardinality(tfs)) / 128.0) * 5",
            (src.id,),
        )
    ]
    start = file_size()
    before, after = optimize_source(conn, "sliced", slices=8, workers=workers)
    sliced_growth = file_size() - start
    row = conn.execute(
        "select sum(pg_column_size(b.*)) from agentdb.posting_blocks b where b.source_id = %s and b.term = any(%s)",
        (src.id, merged),
    ).fetchone()
    assert row is not None
    rewritten = int(row[0])
    with conn.transaction():
        assert optimize_source(conn, "whole", slices=8) == (before, after)

    assert after < before
    assert _source_blocks(conn, "sliced") == _source_blocks(conn, "whole")
    assert term_stats("sliced") == term_stats("whole")
    assert lexical_check(conn, "sliced") == {
        "postings": 0,
        "term_stats": 0,
        "term_bounds": 0,
        "corpus_stats": 0,
    }
    for q in queries:
        got = _hits(retrieve(conn, "sliced", q, mode="lexical", top_k=20))
        assert_same_ranking(got, want[q])
        assert_same_ranking(got[:10], exhaustive(conn, "sliced", q, None, 10))
    # The table had no free space before (its blocks were only ever inserted): the sliced merge's new blocks
    # went mostly into the space of the versions it deleted, where a merge in one transaction can reuse none of
    # its own.
    if workers == 1:
        assert sliced_growth <= rewritten // 2


def test_a_merge_that_takes_away_many_blocks_rebuilds_the_key_index(
    conn: psycopg.Connection[Any],
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A merge that removes at least a quarter of the block table's rows rebuilds its key index afterwards
    (REINDEX CONCURRENTLY, sources.merge.compact_block_key): smaller than the one many writes and the merge
    left, with an index an interrupted rebuild left invalid dropped first; answers unchanged. While another
    transaction outlasts the rebuild's lock timeout the merge still completes, and the index stays as it was,
    with a warning. A merge that removes less leaves the index as it is."""
    _twin_block_sources(conn, ("many", "other"), "k", seed=8, writes=12, size=300)

    def key_index() -> tuple[int, int]:
        row = conn.execute(
            "select pg_relation_filenode('agentdb.posting_blocks_pkey'),"
            " pg_relation_size('agentdb.posting_blocks_pkey')"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def indexes() -> list[tuple[str, bool]]:
        return conn.execute(
            "select c.relname, i.indisvalid from pg_index i join pg_class c on c.oid = i.indexrelid"
            " where i.indrelid = 'agentdb.posting_blocks'::regclass order by 1"
        ).fetchall()

    def merge_removing_a_share(name: str) -> float:
        (rows,) = conn.execute("select count(*) from agentdb.posting_blocks").fetchone() or (0,)
        before, after = optimize_source(conn, name, slices=1)
        assert lexical_check(conn, name) == dict.fromkeys(CHECKS, 0)
        return (before - after) / rows

    # What an interrupted rebuild leaves: a concurrent build that failed (here on duplicate keys), invalid.
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "create unique index concurrently posting_blocks_pkey_ccnew on agentdb.posting_blocks (term)"
        )
    assert ("posting_blocks_pkey_ccnew", False) in indexes()
    node, size = key_index()

    monkeypatch.setattr(merge, "REINDEX_LOCK_TIMEOUT", "300ms")
    with psycopg.connect(db_url) as other_session:  # a transaction holding its snapshot throughout
        other_session.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        other_session.execute("select count(*) from agentdb.sources").fetchone()
        assert merge_removing_a_share("other") >= REINDEX_SHARE
    assert "was not rebuilt" in caplog.text
    assert key_index()[0] == node and ("posting_blocks_pkey", True) in indexes()

    queries = ["k0x k5x k77x", "k1x k2x"]
    want = {q: _hits(retrieve(conn, "many", q, mode="lexical", top_k=20)) for q in queries}
    assert merge_removing_a_share("many") >= REINDEX_SHARE
    rebuilt_node, rebuilt_size = key_index()
    assert rebuilt_node != node and rebuilt_size < size
    assert indexes() == [("posting_blocks_pkey", True)]
    for q in queries:
        assert_same_ranking(_hits(retrieve(conn, "many", q, mode="lexical", top_k=20)), want[q])

    words = [f"k{i}x" for i in range(300)]
    _copy(conn, _rows(random.Random(9), 20, words, [1 / (i + 1) for i in range(len(words))]), ("many",))
    assert 0 < merge_removing_a_share("many") < REINDEX_SHARE
    assert key_index()[0] == rebuilt_node


def test_a_second_optimize_of_a_source_waits_for_the_first(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    """Two merges of the same term ranges at once could deadlock: an optimize holds the source's merge lock
    while its ranges merge on two connections, and a second optimize of the source waits for it (another
    source's does not)."""
    _twin_block_sources(conn, ("first", "other"), "w", seed=5, writes=6, size=300)
    first = get_source(conn, "first")
    with psycopg.connect(db_url, autocommit=True) as holder:
        configure(holder)
        holder.execute("select pg_advisory_lock(%s, %s)", (MERGE_LOCK_KEY, first.id))
        done: list[tuple[int, int]] = []
        waiting = threading.Thread(
            target=lambda: done.append(_optimize_on_own_connection(db_url, "first")), daemon=True
        )
        waiting.start()
        # Held back by the lock: its request is seen waiting (not after a fixed sleep, which load can outlast).
        for _ in range(1200):
            row = conn.execute(
                "select count(*) from pg_locks where locktype = 'advisory' and not granted"
                " and classid = %s::oid and objid = %s::oid and objsubid = 2",
                (MERGE_LOCK_KEY, first.id),
            ).fetchone()
            if row == (1,) or not waiting.is_alive():
                break
            threading.Event().wait(0.05)
        assert row == (1,) and waiting.is_alive() and not done
        assert optimize_source(conn, "other")[1] > 0  # another source's merge does not wait
        holder.execute("select pg_advisory_unlock(%s, %s)", (MERGE_LOCK_KEY, first.id))
        waiting.join(timeout=600)
    assert done and done[0][1] < done[0][0]
    for name in ("first", "other"):
        assert lexical_check(conn, name) == {
            "postings": 0,
            "term_stats": 0,
            "term_bounds": 0,
            "corpus_stats": 0,
        }


def _optimize_on_own_connection(db_url: str, name: str) -> tuple[int, int]:
    with psycopg.connect(db_url, autocommit=True) as own:
        configure(own)
        return optimize_source(own, name)


def test_a_refused_extra_connection_leaves_the_merge_to_the_first(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the server refuses the merge's extra connection (max_connections reached, say), the caller's
    connection merges every range itself: the same blocks as a merge on one connection."""
    _twin_block_sources(conn, ("refused", "single"), "r", seed=9, writes=6, size=300)

    def refuse(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        raise psycopg.OperationalError("too many clients already")

    with monkeypatch.context() as patched:
        patched.setattr(psycopg, "connect", refuse)
        before, after = optimize_source(conn, "refused", workers=2)
    assert optimize_source(conn, "single", workers=1) == (before, after) and after < before

    assert _source_blocks(conn, "refused") == _source_blocks(conn, "single")
    assert lexical_check(conn, "refused") == {
        "postings": 0,
        "term_stats": 0,
        "term_bounds": 0,
        "corpus_stats": 0,
    }


def _twin_block_sources(
    conn: psycopg.Connection[Any], names: tuple[str, str], prefix: str, *, seed: int, writes: int, size: int
) -> None:
    """Two block sources given the same rows (hence the same chunk ids) in `writes` writes of `size` rows of
    Zipf-weighted words `<prefix><i>x`: each write leaves partly filled blocks to merge."""
    words = [f"{prefix}{i}x" for i in range(size)]
    weights = [1 / (i + 1) for i in range(len(words))]
    for name in names:
        create_document_source(
            conn, name, embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
        )
    rng = random.Random(seed)
    for _ in range(writes):
        _copy(conn, _rows(rng, size, words, weights), names)


def _source_blocks(conn: psycopg.Connection[Any], name: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "select b.term, b.first_chunk, b.last_chunk, b.max_tf, b.min_dl, b.offs, b.narrow_offs, b.tfs, b.dls,"
        " b.narrow_dls"
        " from agentdb.posting_blocks b join agentdb.sources s on s.id = b.source_id where s.name = %s"
        " order by b.term, b.first_chunk",
        (name,),
    ).fetchall()
