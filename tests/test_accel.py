"""The accelerator (ext/, agentdb/db/accel.py, sql/025_accel.sql): built and loaded by the embedded server's start,
its lexical leg returns what the plain SQL path returns (the same chunks in the same order, scores to 1e-9), for
lexical, hybrid RRF and convex, and group_by_doc, with filters, for the application and under a principal's role
with a row filter, through random inserts, updates, deletes and merges; a source in the row layout takes the
SQL path; a principal reaches the cursor only through its policy wrapper; and AGENTDB_LEXICAL_PATH=sql forces
the SQL path.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from agentdb.auth import create_principal, principal_scope
from agentdb.db import accel
from agentdb.retrieval import retrieve
from agentdb.sources import create_document_source, optimize_source
from tests.filter_oracle import filters
from tests.test_blocks import (
    DIM,
    FIELD_DICTS,
    FIELDS,
    TWINS,
    WIDE_SPAN,
    WORDS,
    _copy,
    _random_write,
    _rows,
    skip_ids,
)

PATHS = ("sql", "accel")
CALL = (
    "select * from agentdb_accel.bm25_topk(1, '{w0x}', '{1}', '{1}', '{1}', '{1}', '{0}', 10, 1, 1.2, 0.75)"
)


def _on(conn: psycopg.Connection[Any], path: str) -> None:
    conn.execute("select set_config('agentdb.lexical_path', %s, false)", ("sql" if path == "sql" else "",))


def _answer(result: Any) -> list[tuple[str, int, float, int | None]]:
    return [(h.id, h.chunk, h.score, h.rank_sparse) for h in result.hits]


def assert_same(
    got: list[tuple[str, int, float, int | None]], want: list[tuple[str, int, float, int | None]]
) -> None:
    """The same hits in the same order with the same lexical ranks, scores to 1e-9."""
    assert [(d, c, r) for d, c, _, r in got] == [(d, c, r) for d, c, _, r in want]
    assert [s for *_, s, _ in got] == pytest.approx([s for *_, s, _ in want], abs=1e-9)


def _served(name: str, path: str) -> str:
    """The path that serves source `name` when `path` is asked for: the cursor reads the block layout only."""
    return path if name == "blk" else "sql"


@pytest.fixture
def corpus(conn: psycopg.Connection[Any]) -> random.Random:
    """The twins of tests/test_blocks.py (blk in blocks, rws in rows), 600 chunks written in three statements."""
    create_document_source(
        conn, "blk", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
    )
    create_document_source(
        conn, "rws", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="rows"
    )
    rng = random.Random(30)
    for n in (300, 200, 100):
        _copy(conn, _rows(rng, n))
    return rng


def test_the_embedded_server_serves_the_accelerated_path(conn: psycopg.Connection[Any]) -> None:
    """The session's server built the extension at its start: every migrated database has it, and its
    retrieval says which path served."""
    assert conn.execute("select extname from pg_extension where extname = 'agentdb_accel'").fetchone()
    assert accel.path_in_use(conn) == "accel"
    create_document_source(conn, "blk", embedding_model="m", embedding_dim=DIM, lexical_layout="blocks")
    _copy(conn, _rows(random.Random(1), 20), names=("blk",))
    for path in PATHS:
        _on(conn, path)
        got = retrieve(conn, "blk", WORDS[0], mode="lexical")
        assert got.diagnostics["parameters"]["lexical_path"] == path
        assert got.hits
    create_document_source(conn, "rws", embedding_model="m", embedding_dim=DIM, lexical_layout="rows")
    _copy(conn, _rows(random.Random(1), 20), names=("rws",))
    _on(conn, "accel")
    assert retrieve(conn, "rws", WORDS[0], mode="lexical").diagnostics["parameters"]["lexical_path"] == "sql"


@pytest.fixture
def reader(conn: psycopg.Connection[Any], drop_principals: None) -> Any:
    """A principal granted both twins with a row filter that hides some of their chunks."""
    return create_principal(conn, "reader", tables=list(TWINS), row_filter={"year": {"$gte": 3}})[0]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_both_paths_answer_alike(
    conn: psycopg.Connection[Any], corpus: random.Random, reader: Any, data: st.DataObject
) -> None:
    """After each random write (insert, update, delete, merge), both layouts' lexical, hybrid (RRF and convex)
    and group_by_doc answers, with and without a filter, at top 10 and at a deep page, for the application
    and under the principal's role, are the same on both paths."""
    rng = corpus
    if _random_write(conn, rng, data) == "optimize":
        optimize_source(conn, "blk")
    query = " ".join(
        data.draw(st.lists(st.sampled_from([*WORDS, "nowhere"]), min_size=1, max_size=6), label="q")
    )
    filt = data.draw(st.one_of(st.none(), filters(FIELD_DICTS)), label="filter")
    top_k = data.draw(st.sampled_from([1, 10, 100]), label="top_k")
    v = np.array([rng.gauss(0, 1) for _ in range(DIM)], dtype=np.float32)
    asks: list[dict[str, Any]] = [
        {"mode": "lexical"},
        {"mode": "lexical", "group_by_doc": True},
        {"mode": "hybrid", "query_embedding": v, "threshold": 0.0},
        {"mode": "hybrid", "query_embedding": v, "threshold": 0.0, "fusion": "convex", "alpha": 0.3},
        {"mode": "hybrid", "query_embedding": v, "threshold": 0.0, "group_by_doc": True},
    ]
    as_reader = data.draw(st.booleans(), label="as the principal")
    for name in TWINS:
        for ask in asks:
            answers = {}
            for path in PATHS:
                with principal_scope(conn, reader) if as_reader else contextlib.nullcontext(conn) as c:
                    _on(c, path)
                    result = retrieve(c, name, query, filter=filt, top_k=top_k, **ask)
                assert result.diagnostics["parameters"]["lexical_path"] == _served(name, path)
                answers[path] = _answer(result)
            assert_same(answers["accel"], answers["sql"])


def test_exact_ties_rank_by_chunk_id_on_both_paths(conn: psycopg.Connection[Any]) -> None:
    """Chunks whose BM25 is mathematically equal (the same words, each written in another order, among chunks
    that vary the lengths and frequencies) carry bit-for-bit the same score on both paths, whatever order
    each summed the terms in, and so rank by chunk id on both: a top k that cuts a tie group keeps the same
    chunks."""
    create_document_source(conn, "ties", embedding_model="m", embedding_dim=DIM, lexical_layout="blocks")
    rng = random.Random(7)
    rows = _rows(rng, 240)
    words = WORDS[:6]
    tied = words * 2
    for i, (doc, chunk, _, meta, vec) in enumerate(rows):
        if i % 4 == 1:  # the tie group: each query word twice, in an order of its own
            rows[i] = (doc, chunk, " ".join(rng.sample(tied, len(tied))), meta, vec)
        elif i % 2 == 0:  # chunks of other lengths and frequencies of the same words
            rows[i] = (doc, chunk, " ".join(rng.choices(words, k=rng.randint(3, 20))), meta, vec)
    _copy(conn, rows, names=("ties",))
    for query in (" ".join(words), " ".join(words[::-1]), " ".join(words[1:5])):
        answers = {}
        for path in PATHS:
            _on(conn, path)
            result = retrieve(conn, "ties", query, mode="lexical", top_k=40)
            assert result.diagnostics["parameters"]["lexical_path"] == path
            answers[path] = [(h.id, h.score) for h in result.hits]
        assert answers["accel"] == answers["sql"]
        scores = [s for _, s in answers["sql"]]
        assert len(set(scores)) < len(scores), "the corpus must hold ties inside the top k"
        # one chunk a document, the documents named in the order they were written: id order is chunk id order
        assert answers["sql"] == sorted(answers["sql"], key=lambda h: (-h[1], h[0]))


def test_terms_with_more_blocks_than_the_cursor_reads_ahead(conn: psycopg.Connection[Any]) -> None:
    """The cursor meets a term's first 64 blocks through the scan all terms share (READ_AHEAD, ext/) and opens a
    scan of its own only for a term with more: 90 small writes give the frequent words 90 blocks each (a block
    a write), the rare ones a few. Lexical answers at several depths, with and without a filter, before and
    after a deletion rewrote blocks, are the same on both paths."""
    create_document_source(
        conn, "many", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
    )
    rng = random.Random(11)
    written = []
    for _ in range(90):
        rows = _rows(rng, 3)
        rows = [(d, c, f"w0x w1x w2x {text}", meta, v) for d, c, text, meta, v in rows]
        _copy(conn, rows, names=("many",))
        written += [d for d, *_ in rows]
    blocks = dict(
        conn.execute(
            "select b.term, count(*) from agentdb.posting_blocks b join agentdb.sources s on s.id = b.source_id"
            " where s.name = 'many' group by b.term"
        ).fetchall()
    )
    assert min(blocks["w0x"], blocks["w1x"], blocks["w2x"]) == 90 and min(blocks.values()) < 64

    def compare() -> None:
        for query in ("w0x w1x", "w0x w2x w7x w30x", "w1x w45x w59x", "w0x"):
            for top_k in (1, 10, 100):
                for filt in (None, {"year": {"$gte": 3}}):
                    answers = {}
                    for path in PATHS:
                        _on(conn, path)
                        result = retrieve(conn, "many", query, mode="lexical", top_k=top_k, filter=filt)
                        assert result.diagnostics["parameters"]["lexical_path"] == path
                        answers[path] = _answer(result)
                    assert answers["sql"], (query, top_k, filt)
                    assert_same(answers["accel"], answers["sql"])

    compare()
    conn.execute("delete from agentdb_docs.many where doc_id = any(%s)", (rng.sample(written, 60),))
    compare()


def _reversed(column: str) -> sql.Composed:
    """Column `column` of a posting block with its elements in reverse order."""
    return sql.SQL(
        "{} = (select array_agg(x order by i desc) from unnest(b.{}) with ordinality u(x, i))"
    ).format(sql.Identifier(column), sql.Identifier(column))


def test_terms_left_out_of_the_window_sums_on_both_paths(conn: psycopg.Connection[Any]) -> None:
    """Once theta rises, the cursor leaves the terms whose bounds sum below it out of a window's sums and reads
    their blocks at the candidates alone: in place from the row when the block lies within the window, in any
    order of its postings (as a write through the SQL statements may store them), or decoded and sorted when it
    reaches into the next window. 3,000 chunks, more than the first window's 1,024 ids: w0x in every chunk, w1x
    in every fifth, w2x in every 37th, among rarer words. Lexical answers at several depths are the same on both
    paths, before and after the postings of every block of w0x are put in reverse order."""
    create_document_source(
        conn, "left", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
    )
    rng = random.Random(41)
    for part in range(3):
        rows = []
        for i, (doc, chunk, _, meta, vec) in enumerate(_rows(rng, 1000), start=part * 1000):
            words = (
                ["w0x"] * rng.randint(1, 3)
                + ["w1x"] * (i % 5 == 0) * rng.randint(1, 2)
                + ["w2x"] * (i % 37 == 0)
            )
            words += rng.choices(WORDS[10:], k=rng.randint(3, 30))
            rng.shuffle(words)
            rows.append((doc, chunk, " ".join(words), meta, vec))
        _copy(conn, rows, names=("left",))

    def compare() -> None:
        for query in ("w0x w2x", "w0x w1x w2x", "w1x w2x", "w0x w1x w2x w17x"):
            for top_k in (1, 5, 10, 100):
                answers = {}
                for path in PATHS:
                    _on(conn, path)
                    result = retrieve(conn, "left", query, mode="lexical", top_k=top_k)
                    assert result.diagnostics["parameters"]["lexical_path"] == path
                    answers[path] = _answer(result)
                assert len(answers["sql"]) == top_k, (query, top_k)
                assert_same(answers["accel"], answers["sql"])

    compare()
    columns = ("offs", "narrow_offs", "tfs", "dls", "narrow_dls")
    reversed_blocks = conn.execute(
        sql.SQL(
            "update agentdb.posting_blocks b set {} from agentdb.sources s"
            " where s.id = b.source_id and s.name = 'left' and b.term = 'w0x'"
        ).format(sql.SQL(", ").join(_reversed(c) for c in columns))
    ).rowcount
    assert reversed_blocks >= 3000 // 128
    assert all(n == 0 for _, n in conn.execute("select * from agentdb.lexical_check('left')"))
    compare()


def test_a_principal_reaches_the_cursor_only_through_its_policy(
    conn: psycopg.Connection[Any], corpus: random.Random, reader: Any
) -> None:
    """A principal's role takes the accelerated path through agentdb_internal.principal_bm25_topk, which keeps
    the chunks its policy lets it read (none of a source outside its grant); calling the C function itself is
    refused, and even granted it, the role is refused the blocks, whose row security the cursor cannot apply."""
    query = " ".join(WORDS[:3])
    _on(conn, "accel")
    everyone = {(h.id, h.chunk) for h in retrieve(conn, "blk", query, mode="lexical", top_k=1000).hits}
    with principal_scope(conn, reader) as scoped:
        _on(scoped, "accel")
        got = retrieve(scoped, "blk", query, mode="lexical", top_k=1000)
        assert got.diagnostics["parameters"]["lexical_path"] == "accel"
        seen = {(h.id, h.chunk) for h in got.hits}
        assert seen and seen < everyone
        # Called directly, with any arguments, the wrapper returns only chunks the role can read.
        (returned, hidden) = scoped.execute(
            "select count(*), count(*) filter (where not exists"
            "   (select 1 from agentdb_docs.blk c where c.agentdb_chunk_id = t.cid))"
            " from agentdb_internal.principal_bm25_topk((select id from agentdb.sources where name = 'blk'),"
            "  tsvector_to_array(to_tsvector('english', %s)), '{1,1,1}', '{1,1,1}', '{1,1,1}', '{1,1,1}',"
            "  '{1000000,1000000,1000000}', 1000, 10, 1.2, 0.75) t",
            (query,),
        ).fetchone() or (0, 0)
        assert returned == len(seen) and hidden == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            scoped.execute(CALL)
    conn.execute(sql.SQL("grant usage on schema agentdb_accel to {}").format(sql.Identifier(reader.role)))
    conn.execute(
        sql.SQL("grant execute on all functions in schema agentdb_accel to {}").format(
            sql.Identifier(reader.role)
        )
    )
    try:
        with principal_scope(conn, reader) as scoped:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="posting_blocks"):
                scoped.execute(CALL)
    finally:
        role = sql.Identifier(reader.role)
        conn.execute(sql.SQL("revoke all on all functions in schema agentdb_accel from {}").format(role))
        conn.execute(sql.SQL("revoke all on schema agentdb_accel from {}").format(role))
    other, _ = create_principal(conn, "other", tables=["rws"])
    with principal_scope(conn, other) as scoped:
        (n,) = scoped.execute(
            "select count(*) from agentdb_internal.principal_bm25_topk("
            " (select id from agentdb.sources where name = 'blk'), %s, '{1}', '{1}', '{1}', '{1}', '{1000000}',"
            " 10, 10, 1.2, 0.75)",
            (WORDS[:1],),
        ).fetchone() or (0,)
        assert n == 0


def test_migrate_updates_an_accelerator_older_than_the_server_offers(conn: psycopg.Connection[Any]) -> None:
    """A database whose functions are current but whose accelerator is older than the server's build (the build
    came after the functions were made) is updated by the next migrate, which runs sql/ again for it."""
    from agentdb.db.migrate import migrate

    (offered,) = conn.execute(
        "select default_version from pg_available_extensions where name = 'agentdb_accel'"
    ).fetchone() or (None,)
    assert offered is not None and offered != "1.3"
    conn.execute("drop extension agentdb_accel")
    conn.execute("create extension agentdb_accel version '1.3'")
    migrate(conn)
    assert conn.execute("select extversion from pg_extension where extname = 'agentdb_accel'").fetchone() == (
        offered,
    )
    migrate(conn)  # current again: nothing to do
    assert conn.execute("select agentdb_internal.lexical_write_accel('merged_blocks')").fetchone() == (True,)


def test_a_principal_may_not_call_the_merge(
    conn: psycopg.Connection[Any], corpus: random.Random, reader: Any
) -> None:
    """agentdb_accel.merged_blocks reads every chunk's blocks: a principal's role may not call it, with any
    arguments, hostile ones included."""
    for terms in (["w0x"], ["w0x\u00e9" * 2000], []):
        with principal_scope(conn, reader) as scoped:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                scoped.execute(
                    "select count(*) from agentdb_accel.merged_blocks((select id from agentdb.sources"
                    " where name = 'blk'), %s)",
                    (terms,),
                )


def test_forcing_the_sql_path_and_no_compiler(
    embedded_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """AGENTDB_LEXICAL_PATH=sql writes the setting into the server's configuration; without a compiler on
    PATH the build is skipped, the reason logged once, and the server still serves, on the SQL path."""
    from agentdb.db.server import start_embedded

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(accel, "_said", set())
    url = start_embedded(embedded_dir)
    assert any("plain SQL path" in r.message and "compiler" in r.message for r in caplog.records)
    with psycopg.connect(url, autocommit=True) as c:
        assert (
            c.execute("select 1 from pg_available_extensions where name = 'agentdb_accel'").fetchone() is None
        )
    assert accel.install(url) == "sql"
    monkeypatch.setenv(accel.PATH_ENV, "sql")
    pgdata = embedded_dir / "pg"
    assert accel.write_conf(pgdata, None)
    assert "agentdb.lexical_path = 'sql'" in (pgdata / accel.CONF_FILE).read_text()


def test_status_and_healthz_say_which_path_serves(db_url: str, conn: psycopg.Connection[Any]) -> None:
    from fastapi.testclient import TestClient

    from agentdb.api.app import create_app
    from agentdb.config import Settings
    from tests.test_cli import run

    report = orjson.loads(run(["status", "--json"], db_url).stdout)
    assert report["lexical_path"] == "accelerated (agentdb_accel, C)"
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        assert client.get("/healthz").json()["lexical_path"] == "accel"
    conn.execute(
        sql.SQL("alter database {} set agentdb.lexical_path = 'sql'").format(sql.Identifier(conn.info.dbname))
    )
    report = orjson.loads(run(["status", "--json"], db_url).stdout)
    assert report["lexical_path"] == "plain SQL (agentdb.lexical_path is 'sql' (AGENTDB_LEXICAL_PATH=sql))"
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as client:
        assert client.get("/healthz").json()["lexical_path"] == "sql"


def test_accel_build_for_a_self_hosted_server(tmp_path: Path) -> None:
    """`agentdb accel build` compiles against the given pg_config and says what to install where."""
    from agentdb.db.server import _never_started
    from tests.test_cli import run

    pg_config = Path(_never_started().bin_path) / "pg_config"
    out = tmp_path / "build"
    done = run(["accel", "build", "--pg-config", str(pg_config), "--out", str(out)], None)
    assert (out / "lib" / "agentdb_accel.so").is_file()
    assert (out / "share" / "extension" / "agentdb_accel.control").is_file()
    assert f"extension_control_path = '$system:{out / 'share'}'" in done.stdout
    failed = run(
        ["accel", "build", "--pg-config", str(tmp_path / "none"), "--out", str(tmp_path / "x")],
        None,
        check=False,
    )
    assert failed.returncode != 0 and "InvalidParamValue" in failed.stderr


def _derived(conn: psycopg.Connection[Any], name: str) -> tuple[Any, ...]:
    """Source `name`'s postings (each named by its document: term, document, tf, dl), blocks (as the same
    names), term statistics and corpus statistics."""
    sid = conn.execute("select id from agentdb.sources where name = %s", (name,)).fetchone()[0]  # type: ignore[index]
    table = sql.Identifier("agentdb_docs", name)
    postings = conn.execute(
        sql.SQL(
            """select b.term, t.doc_id, u.tf, u.dl
               from agentdb.posting_blocks b
               cross join lateral unnest(agentdb_internal.block_ints(b.offs, b.narrow_offs), b.tfs,
                                         agentdb_internal.block_ints(b.dls, b.narrow_dls)) u(off, tf, dl)
               join {} t on t.agentdb_chunk_id = b.first_chunk + u.off
               where b.source_id = %s order by 1, 2"""
        ).format(table),
        (sid,),
    ).fetchall()
    blocks = conn.execute(
        sql.SQL(
            """select b.term, b.max_tf, b.min_dl, b.last_chunk - b.first_chunk, b.tfs, b.dls, b.narrow_dls,
                      b.offs is null,
                      (select array_agg(t.doc_id order by u.o)
                       from unnest(agentdb_internal.block_ints(b.offs, b.narrow_offs)) with ordinality u(off, o)
                       join {} t on t.agentdb_chunk_id = b.first_chunk + u.off)
               from agentdb.posting_blocks b where b.source_id = %s order by 1, 9"""
        ).format(table),
        (sid,),
    ).fetchall()
    terms = conn.execute(
        "select term, df, max_tf, min_dl, max_span from agentdb.term_stats where source_id = %s order by term",
        (sid,),
    ).fetchall()
    corpus = conn.execute(
        "select n_chunks, total_len from agentdb.corpus_stats where source_id = %s", (sid,)
    ).fetchall()
    return postings, blocks, terms, corpus


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_write_path_in_c_writes_what_sql_writes(
    conn: psycopg.Connection[Any], data: st.DataObject
) -> None:
    """The same rows written to two block sources, one through agentdb_accel.tsv_blocks and one through the
    plain SQL statements (random inserts, updates of text, deletes): the same postings, term and corpus
    statistics, and after inserts alone the same blocks; lexical_check finds nothing on either. A merge of
    either source's blocks cuts the same blocks on both paths."""
    paths = {"wa": "accel", "ws": "sql"}
    for name in paths:
        conn.execute(sql.SQL("drop table if exists {} cascade").format(sql.Identifier("agentdb_docs", name)))
        conn.execute("delete from agentdb.sources where name = %s", (name,))
        create_document_source(
            conn, name, embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
        )
    rng = random.Random(data.draw(st.integers(0, 2**16), label="seed"))
    ops = []
    for _ in range(data.draw(st.integers(1, 4), label="writes")):
        op = data.draw(st.sampled_from(["insert", "insert", "update", "delete"]), label="op")
        ops.append(op)
        rows = _rows(rng, data.draw(st.integers(1, 400), label="n"))
        if op == "insert":
            skip_ids(conn, tuple(paths), data.draw(st.sampled_from([0, 0, WIDE_SPAN]), label="id gap"))
        words = " ".join(rng.choices(WORDS, k=rng.randint(1, 20)))
        mod = data.draw(st.integers(2, 9), label="mod")
        for name, path in paths.items():
            _on(conn, path)
            assert conn.execute("select agentdb_internal.lexical_write_accel()").fetchone() == (
                path == "accel",
            )
            table = sql.Identifier("agentdb_docs", name)
            if op == "insert":
                _copy(conn, rows, (name,))
            elif op == "update":
                conn.execute(
                    sql.SQL(
                        "update {} set text = text || ' ' || %s where right(doc_id, 1)::int %% %s = 0"
                    ).format(table),
                    (words, mod),
                )
            else:
                conn.execute(
                    sql.SQL("delete from {} where right(doc_id, 1)::int %% %s = 1").format(table), (mod,)
                )
    c_path, sql_path = _derived(conn, "wa"), _derived(conn, "ws")
    postings, blocks, terms, corpus = range(4)
    assert c_path[postings] == sql_path[postings] and c_path[corpus] == sql_path[corpus]
    # The statistics but max_span, which follows where the blocks are cut: the C path cuts each term's
    # postings in chunk order, the SQL path in the order an update's rows come, which need not be chunk order.
    assert [t[:4] for t in c_path[terms]] == [t[:4] for t in sql_path[terms]]
    if set(ops) == {"insert"}:  # rows come in chunk order: the same blocks, bound for bound
        assert c_path[blocks] == sql_path[blocks] and c_path[terms] == sql_path[terms]
    for name in paths:
        assert all(n == 0 for _, n in conn.execute("select * from agentdb.lexical_check(%s)", (name,)))
        # A merge (agentdb_accel.merged_blocks or the SQL statements) cuts the same blocks from the same blocks.
        merged = {}
        for path in ("sql", "accel"):
            _on(conn, path)
            assert conn.execute(
                "select agentdb_internal.lexical_write_accel('merged_blocks')"
            ).fetchone() == (path == "accel",)
            with conn.transaction(force_rollback=True):
                optimize_source(conn, name)
                merged[path] = _derived(conn, name)
                assert all(
                    n == 0 for _, n in conn.execute("select * from agentdb.lexical_check(%s)", (name,))
                )
        assert merged["accel"] == merged["sql"]


def test_blocks_too_wide_for_two_bytes_on_both_paths(conn: psycopg.Connection[Any]) -> None:
    """A block keeps its offsets in int4 when its chunks lie more than 32,767 ids apart, and its lengths in int4
    when a chunk is longer than 32,767 lexemes; else two bytes each (migrations/0025_narrow_posting_blocks.sql).
    Both write paths choose the same widths, both read paths answer alike over wide and narrow blocks, and
    lexical_check finds nothing, before and after a merge."""
    paths = {"wa": "accel", "ws": "sql"}
    rng = random.Random(25)
    first, later = _rows(rng, 60), _rows(rng, 60)
    doc, chunk, _, meta, vec = _rows(rng, 1)[0]
    long_text = " ".join([*rng.choices(WORDS, k=100), *(f"z{i:05d}" for i in range(33_000))])
    for name, path in paths.items():
        create_document_source(
            conn, name, embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
        )
        _on(conn, path)
        _copy(conn, first, (name,))
        skip_ids(conn, (name,), WIDE_SPAN)
        _copy(conn, [(doc, chunk, long_text, meta, vec), *later], (name,))
    assert _derived(conn, "wa") == _derived(conn, "ws")
    for name in paths:
        for merge in (False, True):
            if merge:  # a term's blocks cut again across the gap in ids: offsets wide
                _on(conn, paths[name])
                optimize_source(conn, name)
            widths = conn.execute(
                "select count(*) filter (where b.offs is not null), count(*) filter (where b.narrow_offs is not null),"
                " count(*) filter (where b.dls is not null), count(*) filter (where b.narrow_dls is not null)"
                " from agentdb.posting_blocks b join agentdb.sources s on s.id = b.source_id where s.name = %s",
                (name,),
            ).fetchone()
            assert widths is not None and (widths[0] > 0) == merge and all(n > 0 for n in widths[1:]), widths
            assert all(n == 0 for _, n in conn.execute("select * from agentdb.lexical_check(%s)", (name,)))
            for query in (" ".join(WORDS[:4]), "z00017 z32000"):
                answers = {}
                for path in PATHS:
                    _on(conn, path)
                    result = retrieve(conn, name, query, mode="lexical", top_k=100)
                    assert result.diagnostics["parameters"]["lexical_path"] == path
                    answers[path] = _answer(result)
                assert answers["accel"]
                assert ("z00017" in query) <= any(d == doc for d, *_ in answers["accel"])
                assert_same(answers["accel"], answers["sql"])
    assert _derived(conn, "wa") == _derived(conn, "ws")


def test_terms_of_every_stored_size_on_both_paths(conn: psycopg.Connection[Any]) -> None:
    """The cursor reads a term's index tuples at the places it found on the term's first one (the term and what
    comes before it take the same bytes in each), however the key index keeps the term: with a short header (up
    to 126 bytes), a long one, or compressed (over 512 bytes). Each term's blocks are written by statements of
    their own (a tuple a block); both paths answer alike."""
    create_document_source(
        conn, "sz", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="blocks"
    )
    rng = random.Random(31)
    short, long, compressed = "ab" * 20, "".join(rng.choices("abcdefgh", k=200)), "abcdefgh" * 112
    rows = _rows(rng, 12)
    for n, (doc, chunk, text, meta, vec) in enumerate(rows):  # one statement a chunk: a block a term each
        words = [w for i, w in enumerate((short, long, compressed)) if (n >> i) & 1 or n % 5 == 0]
        _copy(conn, [(doc, chunk, " ".join([text, *words]), meta, vec)], ("sz",))
    held = conn.execute(
        "select length(term), count(*) from agentdb.posting_blocks where length(term) >= 40 group by 1 order by 1"
    ).fetchall()
    assert [n for n, _ in held] == [40, 200, 896] and all(blocks > 3 for _, blocks in held), held
    for query in (
        f"{short} {long} {compressed}",
        f"{compressed} {WORDS[0]}",
        f"{WORDS[1]} {long} {WORDS[2]}",
    ):
        answers = {}
        for path in PATHS:
            _on(conn, path)
            result = retrieve(conn, "sz", query, mode="lexical", top_k=10)
            assert result.diagnostics["parameters"]["lexical_path"] == path
            answers[path] = _answer(result)
        assert len(answers["accel"]) >= 4
        assert_same(answers["accel"], answers["sql"])
