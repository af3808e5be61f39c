"""Sources: typed fields, and existing tables registered in place, against a real PostgreSQL. Writes by
plain SQL from another connection (as another program would make them) must keep the lexical index equal
to the rows."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from pydantic import ValidationError

from agentdb.errors import (
    AgentDBError,
    InvalidParamValue,
    StorageFileNotFound,
    StorageKindMismatch,
    from_db_error,
)
from agentdb.ingest.embed_missing import embed_missing
from agentdb.sources import FieldSpec, coerce_value, drop_source, get_source, list_sources, register_table

ARTICLES = """
create table public.articles (
    id        int primary key,
    title     text not null,
    body      text,
    views     int,
    rating    double precision,
    price     numeric(8, 2),
    published boolean,
    tags      text[],
    created   timestamptz,
    note      varchar(40),
    day       date,
    big       bigint,
    payload   jsonb
)
"""
ROWS = [
    (
        1,
        "Checkpoints",
        "A checkpoint flushes dirty buffers to disk.",
        10,
        4.5,
        9.99,
        True,
        ["wal", "io"],
        datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC),
        "first",
        "2020-01-02",
        1,
        '{"a": 1}',
    ),
    (
        2,
        "Vacuum",
        "Vacuum removes dead tuples and prevents transaction wraparound.",
        20,
        3.0,
        0.5,
        False,
        [],
        datetime(2021, 6, 1, tzinfo=UTC),
        None,
        None,
        2,
        None,
    ),
    (
        3,
        "Replication",
        "Standby servers replay the write-ahead log of the primary.",
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    ),
    (
        4,
        "Indexes",
        None,
        5,
        1.5,
        100,
        True,
        ["btree"],
        datetime(2019, 5, 5, tzinfo=UTC),
        "no body",
        None,
        4,
        None,
    ),
    (
        5,
        "Planner",
        "The planner uses statistics; the planner chooses a plan.",
        7,
        2.0,
        1,
        True,
        ["planner"],
        datetime(2022, 2, 2, tzinfo=UTC),
        None,
        "2022-02-02",
        5,
        None,
    ),
]
EXPECTED_FIELDS = [
    ("views", "int"),
    ("rating", "float"),
    ("price", "float"),
    ("published", "bool"),
    ("tags", "string_set"),
    ("created", "timestamp"),
    ("note", "string"),
    ("day", "timestamp"),
    ("big", "int"),
]
AGENTDB_COLUMNS = [
    ("agentdb_chunk_id", "bigint"),
    ("agentdb_embedding", "vector(384)"),
    ("agentdb_tsv", "tsvector"),
]
TRIGGERS = [
    "agentdb_lex_delete",
    "agentdb_lex_insert",
    "agentdb_lex_truncate",
    "agentdb_lex_update",
    "agentdb_stale_embedding",
]


def lexical_check(conn: psycopg.Connection[Any], name: str) -> dict[str, int]:
    return dict(conn.execute("select what, mismatches from agentdb.lexical_check(%s)", (name,)).fetchall())


def assert_lexical_ok(conn: psycopg.Connection[Any], name: str, table: str = "articles") -> None:
    assert lexical_check(conn, name) == {"postings": 0, "term_stats": 0, "term_bounds": 0, "corpus_stats": 0}
    row = conn.execute(
        f"select (select count(*) from {table}), n_chunks from agentdb.corpus_stats c"  # noqa: S608 - test table
        " join agentdb.sources s on s.id = c.source_id where s.name = %s",
        (name,),
    ).fetchone()
    assert row is not None and row[0] == row[1]


def columns(conn: psycopg.Connection[Any], table: str = "articles") -> list[tuple[str, str]]:
    return conn.execute(
        "select attname, format_type(atttypid, atttypmod) from pg_attribute"
        " where attrelid = %s::regclass and attnum > 0 and not attisdropped order by attnum",
        (table,),
    ).fetchall()


def triggers(conn: psycopg.Connection[Any], table: str = "articles") -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "select tgname from pg_trigger where tgrelid = %s::regclass and not tgisinternal order by tgname",
            (table,),
        )
    ]


def postings_of(conn: psycopg.Connection[Any], term: str) -> set[int]:
    """The ids of the rows whose postings hold `term` (as the english configuration stems it)."""
    return {
        r[0]
        for r in conn.execute(
            "select a.id from agentdb.postings p join articles a on a.agentdb_chunk_id = p.chunk_id"
            " where p.term = (select lexeme from unnest(to_tsvector('english', %s)) limit 1)",
            (term,),
        )
    }


@pytest.fixture
def articles(conn: psycopg.Connection[Any]) -> None:
    conn.execute(ARTICLES)
    with conn.cursor() as cur:
        cur.executemany(f"insert into articles values ({', '.join(['%s'] * 13)})", ROWS)  # noqa: S608


def register(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any, name: str = "articles", **overrides: Any
) -> Any:
    arguments: dict[str, Any] = {
        "table": "articles",
        "id_column": "id",
        "text_columns": ["title", "body"],
        "embedding_model": embedder.model_name,
        "embedding_dim": embedder.dim,
    }
    arguments.update(overrides)
    return register_table(conn, db_url, name, **arguments)


@pytest.fixture
def registered(conn: psycopg.Connection[Any], db_url: str, embedder: Any, articles: None) -> Any:
    return register(conn, db_url, embedder)


@pytest.fixture
def other(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection, not configured by agentdb, in transaction mode: another program."""
    with psycopg.connect(db_url) as connection:
        yield connection


# Registration ----------------------------------------------------------------------------------------------


def test_register_reflects_fields_and_indexes_existing_rows(
    conn: psycopg.Connection[Any], registered: Any
) -> None:
    source = registered
    assert (source.kind, source.table_schema, source.table_name, source.id_column) == (
        "table",
        "public",
        "articles",
        "id",
    )
    assert source.text_columns == ["title", "body"]
    # Typed fields from the column types; the id, the text columns and the jsonb column are not fields.
    assert [(f.name, f.type) for f in source.fields] == EXPECTED_FIELDS
    assert all(f.column == f.name and f.optional and f.filterable for f in source.fields)
    assert get_source(conn, "articles") == source
    assert [s.name for s in list_sources(conn)] == ["articles"]

    # Only agentdb's three columns are added, after the table's own, and the rows are all kept.
    assert columns(conn)[:13] == [
        ("id", "integer"),
        ("title", "text"),
        ("body", "text"),
        ("views", "integer"),
        ("rating", "double precision"),
        ("price", "numeric(8,2)"),
        ("published", "boolean"),
        ("tags", "text[]"),
        ("created", "timestamp with time zone"),
        ("note", "character varying(40)"),
        ("day", "date"),
        ("big", "bigint"),
        ("payload", "jsonb"),
    ]
    assert columns(conn)[13:] == AGENTDB_COLUMNS
    assert triggers(conn) == TRIGGERS
    assert conn.execute(
        "select count(*), count(agentdb_embedding), count(distinct agentdb_chunk_id) from articles"
    ).fetchone() == (5, 0, 5)

    # The rows that were already there are in the lexical index: title and body words alike, the null body
    # of row 4 included as nothing.
    assert_lexical_ok(conn, "articles")
    assert conn.execute("select count(*) from agentdb.postings").fetchone()[0] > 0  # type: ignore[index]
    assert postings_of(conn, "wraparound") == {2}
    assert postings_of(conn, "checkpoints") == {1}
    assert postings_of(conn, "indexes") == {4}
    assert postings_of(conn, "planner") == {5}
    tf = conn.execute(
        "select p.tf from agentdb.postings p join articles a on a.agentdb_chunk_id = p.chunk_id"
        " where a.id = 5 and p.term = 'planner'"
    ).fetchone()
    assert tf == (3,)  # title once, body twice
    assert conn.execute(
        "select n_chunks from agentdb.corpus_stats where source_id = %s", (source.id,)
    ).fetchone() == (5,)


def test_register_in_another_schema_and_with_one_text_column(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any
) -> None:
    conn.execute("create schema kb")
    conn.execute(
        "create table kb.notes (key text primary key, body varchar(200), stars smallint, own vector(3))"
    )
    conn.execute(
        "insert into kb.notes values ('a', 'hot standby servers', 3, null), ('b', null, 1, '[1,2,3]')"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the table's own vector column is understood, not warned about
        source = register_table(
            conn,
            db_url,
            "notes",
            table="notes",
            schema="kb",
            id_column="key",
            text_columns=["body"],
            embedding_model="other-model",
            embedding_dim=8,
            ts_config="simple",
        )
    assert [(f.name, f.type) for f in source.fields] == [("stars", "int")]
    assert (source.embedding_model, source.embedding_dim, source.ts_config) == ("other-model", 8, "simple")
    assert ("agentdb_embedding", "vector(8)") in columns(conn, "kb.notes")
    assert lexical_check(conn, "notes") == {
        "postings": 0,
        "term_stats": 0,
        "term_bounds": 0,
        "corpus_stats": 0,
    }
    # The simple configuration keeps words unstemmed.
    assert conn.execute("select count(*) from agentdb.postings where term = 'servers'").fetchone() == (1,)


def test_plain_sql_writes_keep_the_lexical_index(
    conn: psycopg.Connection[Any], registered: Any, other: psycopg.Connection[Any]
) -> None:
    def write(statement: str, params: Any = None) -> None:
        other.execute(statement, params)
        other.commit()
        assert_lexical_ok(conn, "articles")

    write("insert into articles (id, title, body) values (10, 'Autovacuum', 'Autovacuum launches workers.')")
    assert postings_of(conn, "launches") == {10}
    write(
        "insert into articles (id, title, body) values (11, 'TOAST', 'Large values move out of line.'),"
        " (12, 'Locks', null), (13, '', '')"
    )
    write("update articles set body = 'Checkpoints bound recovery time.' where id = 1")
    assert postings_of(conn, "flushes") == set() and postings_of(conn, "recovery") == {1}
    write("update articles set views = coalesce(views, 0) + 1")  # no text changed
    write("update articles set title = title, body = body where id in (2, 3)")  # same text
    write("update articles set title = 'Vacuuming', body = null where id = 2")
    assert postings_of(conn, "wraparound") == set()
    write("update articles set body = coalesce(body, '') || ' Standby standby.' where id between 3 and 5")
    assert postings_of(conn, "standby") == {3, 4, 5}
    write(
        "insert into articles (id, title, body) values (1, 'Checkpoint', 'upserted text'), (20, 'New', 'row')"
        " on conflict (id) do update set title = excluded.title, body = excluded.body"
    )
    assert postings_of(conn, "upserted") == {1} and postings_of(conn, "row") == {20}
    write("update articles set id = id + 100 where id = 20")  # a key change, same text
    write("delete from articles where id in (3, 11)")
    assert postings_of(conn, "replay") == set()
    write("delete from articles where id = -1")  # nothing

    # A transaction that writes and rolls back leaves the index as it was.
    before = conn.execute("select count(*), sum(tf) from agentdb.postings").fetchone()
    other.execute("insert into articles (id, title, body) values (30, 'Rolled', 'back and forth')")
    other.execute("delete from articles where id = 1")
    other.rollback()
    assert conn.execute("select count(*), sum(tf) from agentdb.postings").fetchone() == before
    assert_lexical_ok(conn, "articles")

    # Several statements in one transaction, and COPY.
    other.execute("insert into articles (id, title, body) values (40, 'Multi', 'one statement')")
    other.execute("update articles set body = 'two statements' where id = 40")
    other.execute("delete from articles where id = 5")
    with other.cursor().copy("copy articles (id, title, body) from stdin") as copy:
        copy.write_row((50, "Copied", "rows arrive by copy"))
        copy.write_row((51, "Copied too", None))
    other.commit()
    assert_lexical_ok(conn, "articles")
    assert postings_of(conn, "arrive") == {50}

    write("truncate articles")
    assert conn.execute("select count(*) from agentdb.postings").fetchone() == (0,)
    assert conn.execute("select count(*) from agentdb.term_stats").fetchone() == (0,)
    write("insert into articles (id, title, body) values (60, 'After', 'truncate comes insert')")
    assert postings_of(conn, "truncate") == {60}


def test_text_update_clears_only_that_rows_embedding(
    conn: psycopg.Connection[Any], registered: Any, other: psycopg.Connection[Any], embedder: Any
) -> None:
    vector = np.full(384, 1 / np.sqrt(384), dtype=np.float32)
    conn.execute("update articles set agentdb_embedding = %s", (vector,))
    assert_lexical_ok(conn, "articles")

    def missing() -> list[int]:
        return [
            r[0] for r in conn.execute("select id from articles where agentdb_embedding is null order by id")
        ]

    other.execute("update articles set body = 'a new body' where id = 1")
    other.commit()
    assert missing() == [1]
    other.execute("update articles set title = 'Retitled' where id = 4")
    other.commit()
    assert missing() == [1, 4]
    other.execute("update articles set views = 99, tags = '{x}' where id in (2, 3)")  # not a text column
    other.commit()
    assert missing() == [1, 4]
    assert_lexical_ok(conn, "articles")

    # embed_missing recomputes exactly the cleared rows with the source's model, from title and body.
    assert embed_missing(conn, registered, embedder, progress=False) == 2
    assert missing() == []
    stored = conn.execute("select agentdb_embedding from articles where id = 1").fetchone()[0]  # type: ignore[index]
    assert np.allclose(stored.to_numpy(), embedder.embed(["Checkpoints\na new body"])[0], atol=1e-4)
    kept = conn.execute("select agentdb_embedding from articles where id = 2").fetchone()[0]  # type: ignore[index]
    assert np.array_equal(kept.to_numpy(), vector)


def test_lexical_check_sees_damage_and_rebuild_repairs_it(
    conn: psycopg.Connection[Any], registered: Any
) -> None:
    conn.execute("delete from agentdb.postings where term = 'planner'")
    assert lexical_check(conn, "articles") == {
        "postings": 1,
        "term_stats": 0,
        "term_bounds": 0,
        "corpus_stats": 0,
    }
    conn.execute("update agentdb.term_stats set df = df + 1 where term = 'vacuum'")
    conn.execute("update agentdb.corpus_stats set total_len = total_len + 1")
    # A pruning bound tighter than the postings would drop true hits: the check sees it.
    conn.execute("update agentdb.term_stats set max_tf = 0 where term = 'checkpoint'")
    assert lexical_check(conn, "articles") == {
        "postings": 1,
        "term_stats": 2,
        "term_bounds": 1,
        "corpus_stats": 1,
    }
    conn.execute("select agentdb.lexical_rebuild('articles')")
    assert_lexical_ok(conn, "articles")
    assert postings_of(conn, "planner") == {5}
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("select * from agentdb.lexical_check('nope')")
    error = from_db_error(caught.value)
    assert error is not None and (error.code, error.path) == (3010, "source")


# Bad registrations change nothing -------------------------------------------------------------------------------

BAD_REGISTRATIONS: list[tuple[str, dict[str, Any], type[AgentDBError], str]] = [
    ("missing_table", {"table": "nope"}, StorageFileNotFound, "table"),
    ("missing_schema", {"schema": "nope"}, StorageFileNotFound, "table"),
    ("missing_id_column", {"id_column": "uid"}, InvalidParamValue, "id_column"),
    ("missing_text_column", {"text_columns": ["title", "summary"]}, InvalidParamValue, "text_columns[1]"),
    ("int_text_column", {"text_columns": ["views"]}, InvalidParamValue, "text_columns[0]"),
    ("array_text_column", {"text_columns": ["title", "tags"]}, InvalidParamValue, "text_columns[1]"),
    ("no_text_columns", {"text_columns": []}, InvalidParamValue, "text_columns"),
    ("missing_title_column", {"title_column": "heading"}, InvalidParamValue, "title_column"),
    ("unknown_ts_config", {"ts_config": "klingon"}, InvalidParamValue, "ts_config"),
    ("uppercase_name", {"name": "Articles"}, InvalidParamValue, "source"),
    ("dashed_name", {"name": "my-articles"}, InvalidParamValue, "source"),
    ("digit_name", {"name": "1articles"}, InvalidParamValue, "source"),
    ("long_name", {"name": "a" * 64}, InvalidParamValue, "source"),
]


def test_a_registered_tables_hits_carry_its_title_column(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any, articles: None, drop_principals: None
) -> None:
    """`register --title-column`: every door's hits carry that column as their title (not a field); a
    principal whose field grant leaves out "title" gets '' for it, as for a document table's title."""
    from agentdb.auth import create_principal, principal_scope
    from agentdb.retrieval import retrieve

    source = register(conn, db_url, embedder, text_columns=["body"], title_column="title")
    assert source.title_column == "title" and "title" not in {f.name for f in source.fields}
    assert get_source(conn, "articles") == source
    embed_missing(conn, source, embedder, progress=False)
    titles = dict(conn.execute("select id::text, title from articles").fetchall())
    for mode in ("lexical", "dense", "hybrid"):
        hits = retrieve(conn, "articles", "dirty buffers flushed", mode=mode, top_k=5, threshold=0).hits
        assert hits and all(h.title == titles[h.id] for h in hits), (mode, hits)
    # Registering it again the same way is the same source; with another title column, a conflict.
    assert register(conn, db_url, embedder, text_columns=["body"], title_column="title").id == source.id
    with pytest.raises(StorageKindMismatch):
        register(conn, db_url, embedder, text_columns=["body"], title_column="note")
    # A principal granted only the field "views" reads no title.
    for fields, title in ((["views"], ""), (["views", "title"], "Checkpoints")):
        principal, _ = create_principal(conn, f"reader{len(fields)}", tables=["articles"], fields=fields)
        with principal_scope(conn, principal):
            [hit] = retrieve(conn, "articles", "checkpoint", mode="lexical", top_k=1, threshold=0).hits
        assert (hit.id, hit.title) == ("1", title), fields


@pytest.mark.parametrize(
    ("case", "overrides", "error", "path"), BAD_REGISTRATIONS, ids=[c[0] for c in BAD_REGISTRATIONS]
)
def test_bad_registration_changes_nothing(
    conn: psycopg.Connection[Any],
    db_url: str,
    embedder: Any,
    articles: None,
    case: str,
    overrides: dict[str, Any],
    error: type[AgentDBError],
    path: str,
) -> None:
    before = (columns(conn), triggers(conn))
    arguments = dict(overrides)
    name = arguments.pop("name", "articles")
    with pytest.raises(error) as caught:
        register(conn, db_url, embedder, name, **arguments)
    assert type(caught.value) is error
    assert caught.value.path == path
    assert conn.execute("select count(*) from agentdb.sources").fetchone() == (0,)
    assert conn.execute("select count(*) from agentdb.corpus_stats").fetchone() == (0,)
    assert (columns(conn), triggers(conn)) == before
    assert conn.execute("select count(*) from articles").fetchone() == (5,)


def test_duplicate_source_name_changes_nothing(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any, articles: None
) -> None:
    conn.execute("create table notes (id int primary key, body text)")
    first = register_table(
        conn,
        db_url,
        "taken",
        table="notes",
        id_column="id",
        text_columns=["body"],
        embedding_model=embedder.model_name,
        embedding_dim=embedder.dim,
    )
    before = columns(conn)
    with pytest.raises(StorageKindMismatch) as caught:
        register(conn, db_url, embedder, "taken")
    assert caught.value.path == "source"
    assert [(s.name, s.table_name) for s in list_sources(conn)] == [("taken", "notes")]
    assert get_source(conn, "taken") == first
    assert columns(conn) == before and triggers(conn) == []


def test_registering_a_table_twice_is_refused(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any, registered: Any
) -> None:
    before = (columns(conn), triggers(conn))
    with pytest.raises(StorageKindMismatch) as caught:
        register(conn, db_url, embedder, "articles_again")
    assert caught.value.path == "table"
    assert [s.name for s in list_sources(conn)] == ["articles"]
    assert (columns(conn), triggers(conn)) == before
    assert_lexical_ok(conn, "articles")


def test_drop_source_gives_the_table_back(
    conn: psycopg.Connection[Any], db_url: str, embedder: Any, registered: Any
) -> None:
    drop_source(conn, "articles")
    assert list_sources(conn) == []
    assert [c for c, _ in columns(conn)] == [
        "id",
        "title",
        "body",
        "views",
        "rating",
        "price",
        "published",
        "tags",
        "created",
        "note",
        "day",
        "big",
        "payload",
    ]
    assert triggers(conn) == []
    assert conn.execute("select count(*) from articles").fetchone() == (5,)
    assert conn.execute("select count(*) from agentdb.postings").fetchone() == (0,)
    conn.execute("insert into articles (id, title) values (9, 'still writable')")
    # ... and it can be registered again.
    register(conn, db_url, embedder)
    assert_lexical_ok(conn, "articles")


def test_every_kind_of_source_keeps_its_vectors_and_ordinary_texts_in_the_row(
    conn: psycopg.Connection[Any], embedder: Any, registered: Any
) -> None:
    """Documents, registered tables and memory stores store each vector in its row (storage main), even where a
    long text goes out of line, and an ordinary chunk's text beside it (toast_tuple_target: the vector plus
    1.5 kB); migrations 0018 and 0020 set both on the sources made before them."""
    from agentdb.db.migrate import migrate
    from agentdb.memory.store import create_store
    from agentdb.sources import create_document_source

    docs = create_document_source(
        conn, "docs", embedding_model=embedder.model_name, embedding_dim=embedder.dim
    )
    create_store(conn, "notes", embedding_model=embedder.model_name, embedding_dim=embedder.dim)
    storage_sql = (
        "select s.name, a.attstorage from agentdb.sources s join pg_attribute a"
        " on a.attrelid = format('%I.%I', s.table_schema, s.table_name)::regclass"
        " and a.attname = 'agentdb_embedding' order by s.name"
    )
    tables = conn.execute(storage_sql).fetchall()
    assert [kind for _, kind in tables] == ["m", "m", "m"] and len({n for n, _ in tables}) == 3

    def out_of_line(doc_id: str, text: str) -> tuple[bool, bool, bool]:
        """Insert a chunk of `text`; whether its text, vector and tsvector went out of line."""
        conn.execute(
            sql.SQL("insert into {} (doc_id, chunk, text, agentdb_embedding) values (%s, 0, %s, %s)").format(
                docs.table
            ),
            (doc_id, text, embedder.embed([text])[0]),
        )
        row = conn.execute(
            sql.SQL(
                "select pg_column_toast_chunk_id(text) is not null, pg_column_toast_chunk_id(agentdb_embedding)"
                " is not null, pg_column_toast_chunk_id(agentdb_tsv) is not null from {} where doc_id = %s"
            ).format(docs.table),
            (doc_id,),
        ).fetchone()
        assert row is not None
        return row

    # A row far past a page's TOAST threshold: its text goes out of line, its vector stays.
    rng = np.random.default_rng(7)
    assert out_of_line("long", " ".join(f"w{int(n)}" for n in rng.integers(0, 10**9, 3000)))[:2] == (
        True,
        False,
    )
    # An ordinary chunk (about 1 kB of text, which the default 2 kB target would send out of line beside a
    # 1.5 kB vector): its text and vector stay in the row; its tsvector, computed when read (a virtual
    # column on PostgreSQL 18), is nowhere on disk.
    chunk_text = " ".join(f"w{int(n)}" for n in rng.integers(0, 10**9, 90))
    assert 900 < len(chunk_text) < 1100
    assert out_of_line("plain", chunk_text) == (False, False, False)
    assert conn.execute(
        "select attgenerated from pg_attribute where attrelid = %s::regclass and attname = 'agentdb_tsv'",
        (docs.table.as_string(conn),),
    ).fetchone() == ("v",)
    target_sql = (
        "select s.name, c.reloptions from agentdb.sources s"
        " join pg_class c on c.oid = format('%I.%I', s.table_schema, s.table_name)::regclass order by s.name"
    )
    targets = conn.execute(target_sql).fetchall()
    assert [options for _, options in targets] == [[f"toast_tuple_target={4 * embedder.dim + 8 + 1536}"]] * 3

    # Sources from before the migrations: their column and table are set when they run.
    conn.execute("alter table articles alter column agentdb_embedding set storage external")
    conn.execute("alter table articles reset (toast_tuple_target)")
    conn.execute("delete from agentdb.schema_migrations where version in (18, 20)")
    assert migrate(conn) == [18, 20]
    assert conn.execute(storage_sql).fetchall() == tables
    assert conn.execute(target_sql).fetchall() == targets


# Typed fields --------------------------------------------------------------------------------------------------

GOOD_VALUES: list[tuple[str, Any, Any]] = [
    ("int", 3, 3),
    ("int", -7, -7),
    ("int", 4.0, 4),
    ("float", 1.5, 1.5),
    ("float", 2, 2.0),
    ("string", "x", "x"),
    ("string", "", ""),
    ("bool", True, True),
    ("bool", False, False),
    ("string_set", ["b", "a", "b"], ["a", "b"]),
    ("string_set", (), []),
    ("timestamp", "2020-01-02T03:04:05Z", "2020-01-02T03:04:05Z"),
    ("timestamp", "2020-01-02", "2020-01-02"),
    ("timestamp", datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC), "2020-01-02T03:04:05+00:00"),
]
BAD_VALUES: list[tuple[str, Any]] = [
    ("int", True),
    ("int", "3"),
    ("int", 3.5),
    ("int", None),
    ("int", float("inf")),
    ("float", False),
    ("float", "1.5"),
    ("float", None),
    ("string", 3),
    ("string", ["x"]),
    ("string", None),
    ("bool", 1),
    ("bool", "true"),
    ("bool", None),
    ("string_set", "ab"),
    ("string_set", ["a", 1]),
    ("string_set", None),
    ("timestamp", "yesterday"),
    ("timestamp", 1577836800),
    ("timestamp", None),
]


@pytest.mark.parametrize(("kind", "value", "expected"), GOOD_VALUES)
def test_coerce_value_accepts(kind: str, value: Any, expected: Any) -> None:
    result = coerce_value(FieldSpec(name="f", type=kind), value)  # type: ignore[arg-type]
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(("kind", "value"), BAD_VALUES)
def test_coerce_value_rejects(kind: str, value: Any) -> None:
    with pytest.raises(ValueError):
        coerce_value(FieldSpec(name="f", type=kind), value)  # type: ignore[arg-type]


def test_field_spec_validation() -> None:
    assert FieldSpec(name="rank", type="int", optional=False, default=3.0).default == 3
    assert FieldSpec(name="tags", type="string_set", default=["b", "a"]).default == ["a", "b"]
    for bad in (
        {"name": "has space", "type": "int"},
        {"name": "1st", "type": "int"},
        {"name": "x" * 64, "type": "int"},
        {"name": "f", "type": "integer"},
        {"name": "f", "type": "int", "optional": False},
        {"name": "f", "type": "int", "default": "three"},
        {"name": "f", "type": "int", "unknown": 1},
    ):
        with pytest.raises(ValidationError):
            FieldSpec.model_validate(bad)
