"""Hierarchy and graph indexes: declaring them, edges that follow the documents
through every kind of write, the check, explicit edges over HTTP and from files, agentdb.neighbors under a
principal's row security, the HTTP routes' permissions and the `agentdb index` commands."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from agentdb.api import create_app
from agentdb.auth import create_principal, principal_scope
from agentdb.cli import main
from agentdb.cli.demo import DEMO_INDEXES, DEMO_SOURCE, _demo_indexes
from agentdb.config import Settings
from agentdb.errors import Conflict, Forbidden, InvalidParamValue, StorageFileNotFound, StorageKindMismatch
from agentdb.filters import ReadScope
from agentdb.indexes import (
    add_edges,
    check_index,
    check_indexes,
    create_index,
    create_index_from_file,
    drop_index,
    list_indexes,
    neighbors,
    read_edges_file,
    roots,
)
from agentdb.ingest.pipeline import ingest
from agentdb.ingest.readers import Located
from agentdb.sources import FieldSpec, create_document_source, drop_source, get_source, register_table

FIELDS = [
    FieldSpec(name="parent", type="string"),
    FieldSpec(name="links", type="string_set"),
    FieldSpec(name="next", type="string"),
    FieldSpec(name="tenant", type="string"),
    FieldSpec(name="year", type="int"),
]
DERIVED = {
    "sections": ("tree", "parent", "child"),
    "xref": ("graph", "links", "xref"),
    "next": ("graph", "next", "next"),
}
Edge = tuple[str, str, str]


# Helpers ---------------------------------------------------------------------------------------------------


def make_source(conn: psycopg.Connection[Any], name: str = "t") -> None:
    create_document_source(conn, name, embedding_model="m", embedding_dim=3, fields=FIELDS)


def make_indexes(conn: psycopg.Connection[Any], name: str = "t") -> None:
    for index, (kind, field, edge_type) in DERIVED.items():
        create_index(conn, name, index, kind=kind, field=field, edge_type=edge_type)  # type: ignore[arg-type]


def put(
    conn: psycopg.Connection[Any], doc_id: str, meta: dict[str, Any], chunks: int = 1, table: str = "t"
) -> None:
    """A document of `chunks` chunks, each with the same metadata (as ingestion writes them)."""
    conn.execute(
        f"insert into agentdb_docs.{table} (doc_id, chunk, title, text, metadata)"  # noqa: S608 - test table
        " select %s, g, %s, 'text ' || g, %s from generate_series(0, %s - 1) g",
        (doc_id, doc_id, Jsonb(meta), chunks),
    )


def keys_of(value: Any, many: bool) -> list[str]:
    """The keys a field value names (the Python oracle of agentdb.index_value_keys)."""
    values = value if many and isinstance(value, list) else [value]
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, str | int):
            continue
        if str(v) != "":
            out.append(str(v))
    return out


def implied(conn: psycopg.Connection[Any], table: str = "t") -> dict[str, set[Edge]]:
    """The edges the documents imply, computed in Python from each document's chunk 0."""
    rows = conn.execute(f"select doc_id, metadata from agentdb_docs.{table} where chunk = 0").fetchall()  # noqa: S608
    out: dict[str, set[Edge]] = {name: set() for name in DERIVED}
    for doc_id, meta in rows:
        for key in keys_of(meta.get("parent"), many=False):
            out["sections"].add((key, "child", doc_id))
        for key in keys_of(meta.get("links"), many=True):
            out["xref"].add((doc_id, "xref", key))
        for key in keys_of(meta.get("next"), many=True):
            out["next"].add((doc_id, "next", key))
    return out


def stored(conn: psycopg.Connection[Any], index: str, source: str = "t") -> set[Edge]:
    rows = conn.execute(
        "select e.from_key, e.edge_type, e.to_key from agentdb.edges e"
        " join agentdb.indexes i on i.source_id = e.source_id and i.id = e.index_id"
        " join agentdb.sources s on s.id = i.source_id where s.name = %s and i.name = %s",
        (source, index),
    ).fetchall()
    return {(r[0], r[1], r[2]) for r in rows}


def assert_consistent(conn: psycopg.Connection[Any], table: str = "t") -> None:
    expected = implied(conn, table)
    for index in DERIVED:
        assert stored(conn, index, table) == expected[index], index
    checks = check_indexes(conn, table)
    assert [(c.index, c.missing, c.extra) for c in checks if c.index in DERIVED] == [
        (name, 0, 0) for name in sorted(DERIVED)
    ]


def check_row(conn: psycopg.Connection[Any], index: str, source: str = "t") -> dict[str, int]:
    return {
        what: n
        for _, what, n in conn.execute(
            "select * from agentdb.index_check(%s, %s)", (source, index)
        ).fetchall()
    }


# Declaring indexes and deriving edges ---------------------------------------------------------------------


def test_creating_indexes_builds_edges_from_the_documents(conn: psycopg.Connection[Any]) -> None:
    make_source(conn)
    put(conn, "root", {"links": ["a", "b", "a"], "next": "a"}, chunks=3)
    put(conn, "a", {"parent": "root", "links": ["a"], "next": "b"}, chunks=2)  # self-loop
    put(conn, "b", {"parent": "a", "links": [], "next": ""})
    put(conn, "c", {"parent": "", "links": "root"})  # empty parent: a root; one key instead of a list
    make_indexes(conn)
    assert stored(conn, "sections") == {("root", "child", "a"), ("a", "child", "b")}
    # Duplicates once, one edge per document (not per chunk), the self-loop kept, a scalar as one key.
    assert stored(conn, "xref") == {
        ("root", "xref", "a"),
        ("root", "xref", "b"),
        ("a", "xref", "a"),
        ("c", "xref", "root"),
    }
    assert stored(conn, "next") == {("root", "next", "a"), ("a", "next", "b")}
    assert {(i.name, i.kind, i.field, i.edge_type, i.edges) for i in list_indexes(conn, "t")} == {
        ("next", "graph", "next", "next", 2),
        ("sections", "tree", "parent", "child", 2),
        ("xref", "graph", "links", "xref", 4),
    }
    assert_consistent(conn)
    assert [n.key for n in neighbors(conn, "t", "sections", "root")] == ["a"]
    assert [n.key for n in neighbors(conn, "t", "sections", "b", direction="in")] == ["a"]
    assert [n.key for n in neighbors(conn, "t", "xref", "a")] == ["a"]  # the self-loop
    # Roots: documents no other document points to.
    assert roots(conn, "t", "sections") == ["c", "root"]
    assert roots(conn, "t", "sections", max=1) == ["c"]
    assert roots(conn, "t", "xref") == ["c"]
    assert conn.execute("select key from agentdb.index_roots('t', 'next')").fetchall() == [("c",), ("root",)]


def test_index_declaration_errors(conn: psycopg.Connection[Any]) -> None:
    make_source(conn)
    create_index(conn, "t", "sections", kind="tree", field="parent")
    cases: list[tuple[dict[str, Any], type[Exception], str | None]] = [
        ({"name": "sections", "kind": "tree", "field": "parent"}, Conflict, "name"),
        ({"name": "Bad-Name", "kind": "tree", "field": "parent"}, InvalidParamValue, "name"),
        ({"name": "x", "kind": "forest", "field": "parent"}, InvalidParamValue, "kind"),
        ({"name": "x", "kind": "tree", "field": "nope"}, InvalidParamValue, "field"),
        (
            {"name": "x", "kind": "tree", "field": "links"},
            InvalidParamValue,
            "field",
        ),  # a list is not one parent
        (
            {"name": "x", "kind": "graph", "field": "links", "edge_type": "bad type"},
            InvalidParamValue,
            "edge_type",
        ),
    ]
    for arguments, error, path in cases:
        with pytest.raises(error) as raised:
            create_index(conn, "t", **arguments)
        assert raised.value.path == path, arguments  # type: ignore[attr-defined]
    with pytest.raises(StorageFileNotFound) as missing:
        create_index(conn, "nope", "x", kind="tree", field="parent")
    assert missing.value.path == "source"
    with pytest.raises(StorageFileNotFound) as unknown:
        drop_index(conn, "t", "nope")
    assert unknown.value.path == "index"
    # From SQL: the same code, name and path.
    with pytest.raises(psycopg.Error) as raw:
        conn.execute("select agentdb.index_create('t', 'x', 'tree', 'nope')")
    assert '"path": "field"' in (raw.value.diag.message_detail or "")
    assert [i.name for i in list_indexes(conn, "t")] == ["sections"]
    # What navigation checks before it reads anything.
    create_index(conn, "t", "g", kind="graph", field="links")
    assert check_index(conn, "t", "sections", "tree").kind == "tree"
    assert check_index(conn, "t", "sections", "graph").kind == "tree"  # a tree may be walked as a graph
    for name, strategy, fields, error in [
        ("nope", "tree", None, StorageFileNotFound),
        ("g", "tree", None, InvalidParamValue),
        ("sections", "tree", ["title", "links"], Forbidden),
    ]:
        with pytest.raises(error) as raised:
            check_index(conn, get_source(conn, "t"), name, strategy, path="nav.index", fields=fields)
        assert raised.value.path == "nav.index"  # type: ignore[attr-defined]


def test_dropping_a_source_drops_its_indexes(conn: psycopg.Connection[Any]) -> None:
    make_source(conn)
    make_source(conn, "other")
    for name in ("t", "other"):
        put(conn, "a", {"links": ["b"]}, table=name)
        make_indexes(conn, name)
    drop_source(conn, "t")
    assert conn.execute("select count(*) from agentdb.indexes").fetchone() == (3,)
    assert conn.execute("select count(distinct source_id), count(*) from agentdb.edges").fetchone() == (1, 1)
    drop_index(conn, "other", "xref")
    assert conn.execute("select count(*) from agentdb.edges").fetchone() == (0,)


def test_edges_follow_inserts_updates_deletes_and_truncate(conn: psycopg.Connection[Any]) -> None:
    make_source(conn)
    put(conn, "a", {"links": ["b"]}, chunks=2)
    make_indexes(conn)
    create_index(conn, "t", "manual", kind="graph")
    add_edges(conn, "t", "manual", [{"from": "a", "to": "b"}, {"from": "x", "to": "y", "type": "see"}])
    assert_consistent(conn)
    steps = [
        "insert into agentdb_docs.t (doc_id, chunk, text, metadata) values"
        ' (\'b\', 0, \'x\', \'{"parent": "a", "links": ["c", "a"], "next": "c"}\'),'
        ' (\'b\', 1, \'x\', \'{"parent": "a", "links": ["c", "a"], "next": "c"}\'),'
        " ('c', 0, 'x', '{\"parent\": \"b\"}')",
        # parent changed (every chunk), links changed (chunk 0 only: the node's row decides)
        "update agentdb_docs.t set metadata = metadata || '{\"parent\": \"c\"}' where doc_id = 'b'",
        "update agentdb_docs.t set metadata = metadata || '{\"links\": [\"b\"]}' where doc_id = 'c' and chunk = 0",
        # an update that changes no index field, and one touching every row
        "update agentdb_docs.t set text = text || '!'",
        "update agentdb_docs.t set metadata = metadata - 'next'",
        # a document renamed: its own edges move, edges naming it now dangle
        "update agentdb_docs.t set doc_id = 'b2' where doc_id = 'b'",
        # chunk 0 deleted alone: the document is no node any more
        "delete from agentdb_docs.t where doc_id = 'a' and chunk = 0",
        "insert into agentdb_docs.t (doc_id, chunk, text, metadata) values ('a', 0, 'x', '{\"parent\": \"c\"}')",
        "delete from agentdb_docs.t where doc_id = 'c'",
        "truncate agentdb_docs.t",
        "insert into agentdb_docs.t (doc_id, chunk, text, metadata) values ('z', 0, 'x', '{\"parent\": \"a\"}')",
    ]
    for statement in steps:
        conn.execute(statement)
        assert_consistent(conn)
    assert stored(conn, "sections") == {("a", "child", "z")}
    # Explicit edges are the caller's: no write of the documents touches them, not even TRUNCATE.
    assert stored(conn, "manual") == {("a", "edge", "b"), ("x", "see", "y")}
    # A rolled-back write leaves the edges as they were.
    with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
        conn.execute('update agentdb_docs.t set metadata = \'{"parent": "q"}\'')
        conn.execute("select 1 / 0")
    assert stored(conn, "sections") == {("a", "child", "z")}


def test_dangling_edges_are_kept_and_reported(conn: psycopg.Connection[Any]) -> None:
    make_source(conn)
    put(conn, "a", {"links": ["later", "b"], "parent": "missing"})
    put(conn, "b", {})
    make_indexes(conn)
    assert check_row(conn, "xref") == {"missing": 0, "extra": 0, "dangling": 1}
    assert check_row(conn, "sections") == {"missing": 0, "extra": 0, "dangling": 1}
    # neighbours are documents: the dangling key is not one (yet)
    assert [n.key for n in neighbors(conn, "t", "xref", "a")] == ["b"]
    assert roots(conn, "t", "sections") == ["a", "b"]  # a's parent is no document
    put(conn, "later", {})
    assert check_row(conn, "xref") == {"missing": 0, "extra": 0, "dangling": 0}
    assert [n.key for n in neighbors(conn, "t", "xref", "a")] == ["b", "later"]
    conn.execute("delete from agentdb_docs.t where doc_id = 'b'")
    assert check_row(conn, "xref") == {"missing": 0, "extra": 0, "dangling": 1}
    assert ("a", "xref", "b") in stored(conn, "xref")


def test_check_finds_and_repair_fixes_tampered_edges(conn: psycopg.Connection[Any]) -> None:
    make_source(conn)
    put(conn, "a", {"links": ["b", "c"]})
    put(conn, "b", {"parent": "a"})
    make_indexes(conn)
    conn.execute("delete from agentdb.edges where to_key = 'b'")
    conn.execute(
        "insert into agentdb.edges (source_id, index_id, from_key, edge_type, to_key)"
        " select source_id, id, 'q', 'xref', 'r' from agentdb.indexes where name = 'xref'"
    )
    assert check_row(conn, "xref") == {"missing": 1, "extra": 1, "dangling": 2}
    assert check_row(conn, "sections") == {"missing": 1, "extra": 0, "dangling": 0}
    assert conn.execute("select agentdb.index_rebuild('t')").fetchone() == (3,)
    assert_consistent(conn)


def test_ingestion_keeps_edges_current(conn: psycopg.Connection[Any], embedder: Any) -> None:
    """Through the real pipeline: COPY of new documents, and re-ingestion replacing them (delete + COPY)."""

    def records(docs: list[dict[str, Any]]) -> list[Located]:
        return [Located("docs.jsonl", i + 1, d) for i, d in enumerate(docs)]

    long_text = " ".join(f"word{i}" for i in range(600))  # several chunks
    ingest(
        conn,
        "t",
        records(
            [
                {"_id": "a", "title": "A", "text": long_text, "links": ["b", "c"], "next": "b"},
                {"_id": "b", "title": "B", "text": "bee", "parent": "a", "links": ["a"]},
                {"_id": "c", "title": "C", "text": "sea", "parent": "a"},
            ]
        ),
        embedder,
        progress=False,
    )
    assert conn.execute("select count(*) > 3 from agentdb_docs.t").fetchone() == (True,)
    make_indexes(conn)
    assert_consistent(conn)
    ingest(
        conn,
        "t",
        records(
            [
                {"_id": "c", "title": "C", "text": "sea", "parent": "b", "links": ["a", "a"]},
                {"_id": "d", "title": "D", "text": "dee", "parent": "c", "next": "a"},
            ]
        ),
        embedder,
        progress=False,
    )
    assert_consistent(conn)
    assert stored(conn, "sections") == {("a", "child", "b"), ("b", "child", "c"), ("c", "child", "d")}


def test_registered_table_with_repeated_keys(conn: psycopg.Connection[Any], db_url: str) -> None:
    """A registered table's field columns give the edges; a key may have several rows, each adding edges."""
    conn.execute("create table public.items (id int, parent int, tags text[], body text)")
    conn.execute(
        "insert into public.items values (1, null, '{2,3}', 'one'), (2, 1, '{}', 'two'), (3, 1, '{1,1}', 'three')"
    )
    register_table(
        conn,
        db_url,
        "items",
        table="items",
        id_column="id",
        text_columns=["body"],
        embedding_model="m",
        embedding_dim=3,
    )
    create_index(conn, "items", "tree", kind="tree", field="parent")
    create_index(conn, "items", "tags", kind="graph", field="tags", edge_type="tag")

    def expected() -> tuple[set[Edge], set[Edge]]:
        rows = conn.execute("select id, parent, tags from public.items").fetchall()
        tree = {(str(p), "child", str(i)) for i, p, _ in rows if p is not None}
        tags = {(str(i), "tag", t) for i, _, ts in rows for t in (ts or []) if t}
        return tree, tags

    def check() -> None:
        assert (stored(conn, "tree", "items"), stored(conn, "tags", "items")) == expected()
        assert [(c.missing, c.extra) for c in check_indexes(conn, "items")] == [(0, 0), (0, 0)]

    check()
    for statement in [
        "insert into public.items values (2, 3, '{9}', 'two again')",  # a second row with key 2
        "update public.items set parent = 3 where id = 2 and body = 'two'",
        "delete from public.items where id = 2 and body = 'two again'",  # key 2 keeps the other row's edges
        "update public.items set tags = '{1}' where id = 1",
        "update public.items set id = 4 where id = 3",
        "delete from public.items where id = 1",
        "truncate public.items",
    ]:
        conn.execute(statement)
        check()


def test_index_creation_racing_writers_misses_nothing(conn: psycopg.Connection[Any], db_url: str) -> None:
    make_source(conn)
    put(conn, "seed", {"parent": "root"})
    errors: list[BaseException] = []

    def write(start: int) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as other:
                for i in range(start, start + 40):
                    put(other, f"w{i}", {"parent": f"w{i - 1}", "links": ["seed"]})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    writer = threading.Thread(target=write, args=(0,))
    writer.start()
    make_indexes(conn)
    writer.join()
    assert not errors
    assert_consistent(conn)
    # Dropping an index while documents arrive: no writer trips over the vanishing index.
    writer = threading.Thread(target=write, args=(40,))
    writer.start()
    for name in ("xref", "next"):
        drop_index(conn, "t", name)
    writer.join()
    assert not errors
    assert stored(conn, "sections") == implied(conn)["sections"]


# Property test: any sequence of writes leaves the edges equal to what the documents imply ----------------

KEYS = ["a", "b", "c", "d"]
key_values = st.one_of(st.sampled_from([*KEYS, "zz", ""]), st.integers(0, 2), st.none(), st.booleans())
metadata = st.fixed_dictionaries(
    {},
    optional={
        "parent": key_values,
        "links": st.one_of(st.lists(key_values, max_size=4), key_values),
        "next": key_values,
    },
)
write = st.one_of(
    st.tuples(
        st.just("insert"),
        st.lists(st.tuples(st.sampled_from(KEYS), metadata, st.integers(1, 3)), min_size=1, max_size=3),
    ),
    st.tuples(st.just("update"), st.sampled_from(KEYS), metadata, st.booleans()),
    st.tuples(st.just("update_all"), metadata),
    st.tuples(st.just("rename"), st.sampled_from(KEYS), st.sampled_from(KEYS)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS)),
    st.tuples(st.just("delete_chunk0"), st.sampled_from(KEYS)),
    st.tuples(st.just("delete_children"), st.sampled_from(KEYS)),
    st.tuples(st.just("truncate")),
)


def apply(conn: psycopg.Connection[Any], step: tuple[Any, ...]) -> None:
    kind = step[0]
    if kind == "insert":
        values = [(k, c, Jsonb(m)) for k, m, n in step[1] for c in range(n)]
        conn.execute(
            "insert into agentdb_docs.t (doc_id, chunk, text, metadata)"
            " select d, c, 'x', m from unnest(%s::text[], %s::int[], %s::jsonb[]) u(d, c, m)"
            " on conflict (doc_id, chunk) do nothing",
            ([v[0] for v in values], [v[1] for v in values], [v[2] for v in values]),
        )
    elif kind == "update":
        conn.execute(
            "update agentdb_docs.t set metadata = %s where doc_id = %s and (chunk = 0 or not %s)",
            (Jsonb(step[2]), step[1], step[3]),
        )
    elif kind == "update_all":
        conn.execute("update agentdb_docs.t set metadata = %s", (Jsonb(step[1]),))
    elif kind == "rename":
        conn.execute(
            "update agentdb_docs.t set doc_id = %s where doc_id = %s"
            " and not exists (select 1 from agentdb_docs.t where doc_id = %s)",
            (step[2], step[1], step[2]),
        )
    elif kind == "delete":
        conn.execute("delete from agentdb_docs.t where doc_id = %s", (step[1],))
    elif kind == "delete_chunk0":
        conn.execute("delete from agentdb_docs.t where doc_id = %s and chunk = 0", (step[1],))
    elif kind == "delete_children":
        conn.execute("delete from agentdb_docs.t where metadata->>'parent' = %s", (step[1],))
    else:
        conn.execute("truncate agentdb_docs.t")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    start=st.lists(st.tuples(st.sampled_from(KEYS), metadata, st.integers(1, 3)), max_size=4),
    steps=st.lists(write, min_size=1, max_size=12),
)
def test_any_sequence_of_writes_keeps_edges_consistent(
    conn: psycopg.Connection[Any], start: list[Any], steps: list[Any]
) -> None:
    if conn.execute("select to_regclass('agentdb_docs.t')").fetchone() == (None,):
        make_source(conn)
        make_indexes(conn)
        create_index(conn, "t", "manual", kind="graph")
        add_edges(conn, "t", "manual", [{"from": "a", "to": "b"}])
    conn.execute("truncate agentdb_docs.t")
    for step in [("insert", start), *steps] if start else steps:
        apply(conn, step)
    assert_consistent(conn)
    assert stored(conn, "manual") == {("a", "edge", "b")}


# Explicit edges ---------------------------------------------------------------------------------------------


def test_explicit_edges_are_all_or_nothing_with_paths(conn: psycopg.Connection[Any]) -> None:
    make_source(conn)
    create_index(conn, "t", "flow", kind="graph", edge_type="next")
    assert (
        add_edges(conn, "t", "flow", [{"from": "a", "to": "b", "weight": 2.5, "metadata": {"why": "x"}}]) == 1
    )
    bad_edges: list[tuple[Any, str]] = [
        ("x", "edges[1]"),
        ({"from": "a"}, "edges[1].to"),
        ({"from": "", "to": "b"}, "edges[1].from"),
        ({"from": 1, "to": "b"}, "edges[1].from"),
        ({"from": "a", "to": "b", "weight": "heavy"}, "edges[1].weight"),
        ({"from": "a", "to": "b", "type": "no spaces"}, "edges[1].type"),
        ({"from": "a", "to": "b", "metadata": [1]}, "edges[1].metadata"),
        ({"from": "a", "to": "b", "colour": "red"}, "edges[1].colour"),
        ({"from": "a" * 1025, "to": "b"}, "edges[1].from"),
    ]
    for bad, path in bad_edges:
        with pytest.raises(InvalidParamValue) as raised:
            add_edges(conn, "t", "flow", [{"from": "c", "to": "d"}, bad])
        assert raised.value.path == path, bad
    assert stored(conn, "flow") == {("a", "next", "b")}
    # The position counts across batches too.
    many = [{"from": f"k{i}", "to": f"k{i + 1}"} for i in range(10_005)] + [{"from": "z"}]
    with pytest.raises(InvalidParamValue) as raised:
        add_edges(conn, "t", "flow", many)
    assert raised.value.path == "edges[10005].to"
    assert stored(conn, "flow") == {("a", "next", "b")}
    # Re-posting an edge updates it; the last copy in one call wins.
    add_edges(
        conn, "t", "flow", [{"from": "a", "to": "b", "weight": 1}, {"from": "a", "to": "b", "weight": 3}]
    )
    assert conn.execute("select weight, metadata from agentdb.edges where from_key = 'a'").fetchone() == (
        3.0,
        {},
    )
    # A field-derived index takes no explicit edges; a tree node has one parent.
    create_index(conn, "t", "sections", kind="tree", field="parent")
    with pytest.raises(StorageKindMismatch):
        add_edges(conn, "t", "sections", [{"from": "a", "to": "b"}])
    create_index(conn, "t", "outline", kind="tree")
    add_edges(conn, "t", "outline", [{"from": "a", "to": "b"}, {"from": "a", "to": "c"}])
    with pytest.raises(InvalidParamValue) as second:
        add_edges(conn, "t", "outline", [{"from": "d", "to": "e"}, {"from": "x", "to": "c"}])
    assert second.value.path == "edges[1].to"
    assert stored(conn, "outline") == {("a", "child", "b"), ("a", "child", "c")}


def test_edges_from_files(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    make_source(conn)
    jsonl = tmp_path / "flow.jsonl"
    jsonl.write_text('{"from": "a", "to": "b"}\n\n{"from": "b", "to": "c", "type": "then", "weight": 0.5}\n')
    info = create_index_from_file(conn, "t", "flow", jsonl, edge_type="next")
    assert (info.kind, info.field, info.edges) == ("graph", None, 2)
    assert stored(conn, "flow") == {("a", "next", "b"), ("b", "then", "c")}
    csv_file = tmp_path / "tree.csv"
    csv_file.write_text('from,to,weight,metadata\nroot,a,,\nroot,b,2,"{""note"": ""x""}"\n')
    create_index_from_file(conn, "t", "outline", csv_file, kind="tree")
    assert conn.execute(
        "select to_key, weight, metadata from agentdb.edges where from_key = 'root' order by to_key"
    ).fetchall() == [("a", 1.0, {}), ("b", 2.0, {"note": "x"})]
    # A bad line names the file and line; the index is not created.
    bad = tmp_path / "bad.csv"
    bad.write_text("from,to\na,b\nc,\n")
    with pytest.raises(InvalidParamValue) as raised:
        create_index_from_file(conn, "t", "broken", bad)
    assert raised.value.path == "bad.csv:3.to"
    assert "broken" not in {i.name for i in list_indexes(conn, "t")}
    with pytest.raises(InvalidParamValue) as column:
        read_edges_file(_write(tmp_path / "cols.csv", "from,to,colour\na,b,red\n"))
    assert column.value.path == "cols.csv:1.colour"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# agentdb.neighbors -----------------------------------------------------------------------------------------


def test_neighbors_arguments_order_and_directions(conn: psycopg.Connection[Any]) -> None:
    make_source(conn)
    for key in ["a", "b", "c", "d"]:
        put(conn, key, {"year": 2020})
    create_index(conn, "t", "g", kind="graph")
    add_edges(
        conn,
        "t",
        "g",
        [
            {"from": "a", "to": "b", "weight": 1},
            {"from": "a", "to": "c", "weight": 5, "type": "strong"},
            {"from": "a", "to": "d", "weight": 5},
            {"from": "d", "to": "a", "weight": 2},
        ],
    )
    out = neighbors(conn, "t", "g", "a")
    assert [(n.key, n.edge_type, n.weight) for n in out] == [
        ("c", "strong", 5.0),
        ("d", "edge", 5.0),
        ("b", "edge", 1.0),
    ]
    assert [n.key for n in neighbors(conn, "t", "g", "a", max=1)] == ["c"]
    assert [n.key for n in neighbors(conn, "t", "g", "a", edge_types=["strong"])] == ["c"]
    assert [n.key for n in neighbors(conn, "t", "g", "a", direction="in")] == ["d"]
    # both directions: d is reached both ways with one type, listed once with the larger weight
    assert [(n.key, n.weight) for n in neighbors(conn, "t", "g", "a", direction="both")] == [
        ("c", 5.0),
        ("d", 5.0),
        ("b", 1.0),
    ]
    # the query filter applies to the neighbours
    put(conn, "e", {"year": 1999})
    add_edges(conn, "t", "g", [{"from": "a", "to": "e", "weight": 9}])
    assert [n.key for n in neighbors(conn, "t", "g", "a", scope=ReadScope(filter={"year": 1999}))] == ["e"]
    assert neighbors(conn, "t", "g", "nobody") == []
    for arguments, path in [
        ({"direction": "sideways"}, "direction"),
        ({"max": 0}, "max"),
        ({"max": 257}, "max"),
        ({"edge_types": ["edge", ""]}, "edge_types[1]"),
    ]:
        with pytest.raises(InvalidParamValue) as raised:
            neighbors(conn, "t", "g", "a", **arguments)
        assert raised.value.path == path
    with pytest.raises(StorageFileNotFound) as unknown:
        neighbors(conn, "t", "nope", "a")
    assert unknown.value.path == "index"
    # The SQL door as analysts call it, with named arguments.
    rows = conn.execute(
        "select * from agentdb.neighbors('t', 'g', 'a', direction => 'in', max => 5)"
    ).fetchall()
    assert rows == [("d", "edge", 2.0)]


@pytest.fixture
def tenants(conn: psycopg.Connection[Any]) -> Iterator[Any]:
    """Documents of two tenants linked across tenants, and a principal that may read only acme's."""
    make_source(conn)
    docs = {"a1": "acme", "a2": "acme", "a3": "acme", "g1": "globex", "g2": "globex"}
    links = {"a1": ["a2", "g1", "a3"], "g1": ["a1", "g2"], "a2": ["a1"], "a3": [], "g2": ["a3"]}
    parents = {"a2": "a1", "g1": "a1", "a3": "g1", "g2": "g1"}
    for key, tenant in docs.items():
        put(
            conn,
            key,
            {"tenant": tenant, "links": links[key], **({"parent": parents[key]} if key in parents else {})},
        )
    make_indexes(conn)
    principal, key = create_principal(
        conn,
        "acme",
        tables=["t"],
        row_filter={"tenant": "acme"},
        tools=["search", "tree_search", "graph_search"],
    )
    yield principal, key, docs, links


def test_neighbors_under_a_row_filter_show_only_visible_keys(
    conn: psycopg.Connection[Any], tenants: Any
) -> None:
    principal, _, docs, links = tenants
    visible = {k for k, t in docs.items() if t == "acme"}
    with principal_scope(conn, principal) as scoped:
        for key in docs:
            got = {n.key for n in neighbors(scoped, "t", "xref", key, max=256)}
            # a hidden start node looks like a missing one; a visible one shows only visible neighbours
            assert got == (set(links[key]) & visible if key in visible else set()), key
        assert {n.key for n in neighbors(scoped, "t", "sections", "a1")} == {"a2"}  # g1 is hidden
        assert neighbors(scoped, "t", "sections", "a3", direction="in") == []  # its parent g1 is hidden
        assert neighbors(scoped, "t", "xref", "a1", max=1)[0].key == "a2"  # max counts visible keys only
        # a3's parent g1 is hidden: a3 is a root, as it would be with a parent that names no document
        assert roots(scoped, "t", "sections") == ["a1", "a3"]
        assert roots(scoped, "t", "sections", scope=ReadScope(row_filter={"tenant": "acme"})) == ["a1", "a3"]
    # The role cannot read the edges or the index catalog itself.
    for statement in ["select * from agentdb.edges", "select * from agentdb.indexes"]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege), principal_scope(conn, principal) as scoped:
            scoped.execute(statement)
    # The application (no principal) sees every neighbour.
    assert {n.key for n in neighbors(conn, "t", "sections", "a1")} == {"a2", "g1"}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tenant_of=st.lists(st.sampled_from(["acme", "globex"]), min_size=6, max_size=6),
    edges=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=15),
)
def test_neighbors_never_show_a_key_outside_the_grant(
    conn: psycopg.Connection[Any], tenants: Any, tenant_of: list[str], edges: list[tuple[int, int]]
) -> None:
    principal = tenants[0]
    keys = [f"n{i}" for i in range(6)]
    conn.execute("delete from agentdb_docs.t where doc_id like 'n%'")
    for key, tenant in zip(keys, tenant_of, strict=True):
        put(conn, key, {"tenant": tenant})
    conn.execute("delete from agentdb.edges where from_key like 'n%'")
    if not any(i.name == "p" for i in list_indexes(conn, "t")):
        create_index(conn, "t", "p", kind="graph")
    add_edges(conn, "t", "p", [{"from": keys[a], "to": keys[b]} for a, b in edges])
    visible = {k for k, t in zip(keys, tenant_of, strict=True) if t == "acme"}
    with principal_scope(conn, principal) as scoped:
        for key in keys:
            for direction in ("out", "in", "both"):
                got = {n.key for n in neighbors(scoped, "t", "p", key, direction=direction, max=256)}  # type: ignore[arg-type]
                assert got <= visible
                if key not in visible:
                    assert got == set()
                else:
                    out = {keys[b] for a, b in edges if keys[a] == key}
                    inn = {keys[a] for a, b in edges if keys[b] == key}
                    want = {"out": out, "in": inn, "both": out | inn}[direction]
                    assert got == want & visible


def index_views(scoped: psycopg.Connection[Any]) -> dict[str, Any]:
    """Everything an index shows the connection's role: roots, edge counts, checks, and the internal readers'
    edges and roots as an analyst's SQL (or a principal's role) would call them."""
    source_id = scoped.execute("select id from agentdb.sources where name = 't'").fetchone()[0]  # type: ignore[index]
    keys = [f"n{i}" for i in range(5)] + ["a1", "a2", "a3", "g1", "g2", "zz"]
    return {
        "roots": roots(scoped, "t", "sections"),
        "counts": {i.name: i.edges for i in list_indexes(scoped, "t")},
        "checks": {c.index: (c.missing, c.extra, c.dangling) for c in check_indexes(scoped, "t")},
        "root_keys": sorted(
            r[0]
            for r in scoped.execute(
                "select key from agentdb_internal.index_root_keys(%s, 'sections')", (source_id,)
            ).fetchall()
        ),
        "edges": sorted(
            (index, key, *r)
            for index in ("sections", "xref")
            for key in keys
            for r in scoped.execute(
                "select neighbor, edge_type from agentdb_internal.index_edges(%s, %s, %s, 'both', null)",
                (source_id, index, key),
            ).fetchall()
        ),
    }


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tenant_of=st.lists(st.sampled_from(["acme", "globex"]), min_size=5, max_size=5),
    parent_of=st.lists(st.one_of(st.none(), st.integers(0, 4), st.just(9)), min_size=5, max_size=5),
    links_of=st.lists(st.lists(st.one_of(st.integers(0, 4), st.just(9)), max_size=3), min_size=5, max_size=5),
)
def test_every_view_of_an_index_is_computed_over_the_callers_rows(
    conn: psycopg.Connection[Any],
    tenants: Any,
    tenant_of: list[str],
    parent_of: list[int | None],
    links_of: list[list[int]],
) -> None:
    """A principal's roots, edge counts, checks and internal edge readers are those of a database holding its
    rows only: a document it cannot read is exactly a key that names no document (9: `zz`)."""
    principal = tenants[0]
    name = [f"n{i}" for i in range(5)] + ["", "", "", "", "zz"]

    def load(target: psycopg.Connection[Any], only_acme: bool) -> None:
        target.execute("delete from agentdb_docs.t")
        for i, tenant in enumerate(tenant_of):
            if only_acme and tenant != "acme":
                continue
            meta: dict[str, Any] = {"tenant": tenant, "links": [name[k] for k in links_of[i]]}
            if parent_of[i] is not None:
                meta["parent"] = name[parent_of[i]]  # type: ignore[index]
            put(target, name[i], meta)

    with conn.transaction(force_rollback=True):
        load(conn, only_acme=False)
        with principal_scope(conn, principal) as scoped:
            seen = index_views(scoped)
    with conn.transaction(force_rollback=True):
        load(conn, only_acme=True)  # the same documents without the rows acme cannot read
        with principal_scope(conn, principal) as scoped:
            alone = index_views(scoped)
    assert seen == alone


def test_a_hidden_parent_looks_like_a_missing_one_over_http(
    conn: psycopg.Connection[Any], tenants: Any, client: TestClient
) -> None:
    """The issue's probe: acme's documents under a hidden parent and under a missing one count alike."""
    _, key, _, _ = tenants
    auth = {"Authorization": f"Bearer {key}"}
    before = client.get("/sources/t/indexes/sections/check", headers=auth).json()["dangling"]
    counts = {i["name"]: i["edges"] for i in client.get("/sources/t/indexes", headers=auth).json()}
    put(conn, "a7", {"tenant": "acme", "parent": "g2"})  # g2 exists, for globex
    hidden = client.get("/sources/t/indexes/sections/check", headers=auth).json()["dangling"]
    hidden_counts = {i["name"]: i["edges"] for i in client.get("/sources/t/indexes", headers=auth).json()}
    conn.execute("delete from agentdb_docs.t where doc_id = 'a7'")
    put(conn, "a7", {"tenant": "acme", "parent": "g99"})  # no such document
    missing = client.get("/sources/t/indexes/sections/check", headers=auth).json()["dangling"]
    missing_counts = {i["name"]: i["edges"] for i in client.get("/sources/t/indexes", headers=auth).json()}
    assert hidden == missing == before + 1
    assert hidden_counts == missing_counts and missing_counts["sections"] == counts["sections"] + 1
    # acme reads 3 documents, and counts only the edges they own (the application counts all)
    assert counts == {"next": 0, "sections": 2, "xref": 4}
    assert {i.name: i.edges for i in list_indexes(conn, "t")}["xref"] == 7


# HTTP ------------------------------------------------------------------------------------------------------


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=db_url)), base_url="http://127.0.0.1") as c:
        yield c


def test_http_indexes(conn: psycopg.Connection[Any], client: TestClient) -> None:
    make_source(conn)
    put(conn, "a", {"links": ["b"]})
    put(conn, "b", {"parent": "a"})
    created = client.post("/sources/t/indexes", json={"name": "sections", "kind": "tree", "field": "parent"})
    assert created.status_code == 201, created.text
    assert created.json()["edges"] == 1
    assert (
        client.post(
            "/sources/t/indexes", json={"name": "sections", "kind": "tree", "field": "parent"}
        ).status_code
        == 409
    )
    unknown_field = client.post("/sources/t/indexes", json={"name": "x", "kind": "graph", "field": "nope"})
    assert unknown_field.status_code == 400
    assert unknown_field.json()["error"]["code"] == 3007 and unknown_field.json()["error"]["path"] == "field"
    bad_kind = client.post("/sources/t/indexes", json={"name": "x", "kind": "forest"})
    assert bad_kind.status_code == 400 and bad_kind.json()["error"]["path"] == "kind"
    bad_name = client.post("/sources/t/indexes", json={"name": "X y", "kind": "graph"})
    assert bad_name.status_code == 400 and bad_name.json()["error"]["path"] == "name"
    missing = client.post("/sources/nope/indexes", json={"name": "x", "kind": "graph"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 3010

    assert (
        client.post(
            "/sources/t/indexes", json={"name": "flow", "kind": "graph", "edge_type": "next"}
        ).status_code
        == 201
    )
    posted = client.post(
        "/sources/t/indexes/flow/edges",
        json=[{"from": "a", "to": "b"}, {"from": "b", "to": "zz", "weight": 2}],
    )
    assert posted.status_code == 200, posted.text
    assert posted.json() == {"index": "flow", "written": 2, "edges": 2}
    bad = client.post(
        "/sources/t/indexes/flow/edges",
        json=[{"from": "a", "to": "c"}, {"from": "c", "to": "d"}, {"from": "d", "to": "e"}, {"from": "e"}],
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == 3007 and bad.json()["error"]["path"] == "edges[3].to"
    assert stored(conn, "flow") == {("a", "next", "b"), ("b", "next", "zz")}
    not_a_list = client.post("/sources/t/indexes/flow/edges", json={"from": "a", "to": "b"})
    assert not_a_list.status_code == 400 and not_a_list.json()["error"]["path"] == "edges"
    derived = client.post("/sources/t/indexes/sections/edges", json=[{"from": "a", "to": "b"}])
    assert derived.status_code == 409 and derived.json()["error"]["code"] == 3011
    assert client.post("/sources/t/indexes/nope/edges", json=[]).json()["error"]["path"] == "index"

    listed = client.get("/sources/t/indexes").json()
    assert [(i["name"], i["kind"], i["field"], i["edges"]) for i in listed] == [
        ("flow", "graph", None, 2),
        ("sections", "tree", "parent", 1),
    ]
    assert client.get("/sources/t/indexes/flow/check").json() == {
        "index": "flow",
        "missing": 0,
        "extra": 0,
        "dangling": 1,
        "ok": True,
    }
    assert client.get("/sources/t/indexes/nope/check").status_code == 404
    assert client.get("/sources/t/indexes/sections/neighbors", params={"key": "a"}).json() == [
        {"key": "b", "edge_type": "child", "weight": 1.0}
    ]
    bad_direction = client.get(
        "/sources/t/indexes/sections/neighbors", params={"key": "a", "direction": "up"}
    )
    assert bad_direction.status_code == 400
    assert client.delete("/sources/t/indexes/flow").status_code == 204
    assert client.delete("/sources/t/indexes/flow").status_code == 404
    assert conn.execute("select count(*) from agentdb.edges where to_key = 'zz'").fetchone() == (0,)


def test_http_permissions(conn: psycopg.Connection[Any], tenants: Any, client: TestClient) -> None:
    _, acme_key, _, _ = tenants
    reader = create_principal(conn, "reader", tables=["t"], tools=["search"])[1]
    writer = create_principal(conn, "writer", tables=["t"], tools=["search", "ingest"])[1]
    narrow = create_principal(
        conn,
        "narrow",
        tables=["t"],
        fields=["title", "text", "links"],
        tools=["search", "ingest", "tree_search"],
    )[1]
    acme_writer = create_principal(
        conn, "acmew", tables=["t"], row_filter={"tenant": "acme"}, tools=["ingest"]
    )[1]

    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    new = {"name": "flow", "kind": "graph"}
    assert client.post("/sources/t/indexes", json=new).status_code == 401
    denied = client.post("/sources/t/indexes", json=new, headers=auth(reader))
    assert denied.status_code == 403
    assert client.get("/sources/t/indexes", headers=auth(reader)).status_code == 200
    assert client.get("/sources/t/indexes/xref/check", headers=auth(reader)).json()["ok"] is True
    assert client.delete("/sources/t/indexes/xref", headers=auth(reader)).status_code == 403
    # a field outside the grant answers like an unknown one
    assert [i["name"] for i in client.get("/sources/t/indexes", headers=auth(narrow)).json()] == ["xref"]
    assert (
        client.get(
            "/sources/t/indexes/sections/neighbors", params={"key": "a1"}, headers=auth(narrow)
        ).status_code
        == 403
    )
    # creating and dropping an index is an administrator's act, whatever the principal's tools
    for key in (writer, narrow, acme_writer, acme_key):
        refused = client.post("/sources/t/indexes", json=new, headers=auth(key))
        assert refused.status_code == 403 and refused.json()["error"]["code"] == 1403, refused.text
        assert client.delete("/sources/t/indexes/xref", headers=auth(key)).status_code == 403
    assert [i.name for i in list_indexes(conn, "t")] == ["next", "sections", "xref"]
    create_index(conn, "t", "flow", kind="graph")  # the administrator's door: agentdb index create
    assert (
        client.post(
            "/sources/t/indexes/flow/edges", json=[{"from": "a1", "to": "g1"}], headers=auth(writer)
        ).status_code
        == 200
    )
    # a writer limited to some rows links only documents it can read (a missing one answers alike)
    for edge, path in [
        ({"from": "a1", "to": "g2"}, "edges[1].to"),
        ({"from": "nope", "to": "a1"}, "edges[1].from"),
    ]:
        refused = client.post(
            "/sources/t/indexes/flow/edges",
            json=[{"from": "a1", "to": "a2"}, edge],
            headers=auth(acme_writer),
        )
        assert refused.status_code == 403 and refused.json()["error"]["path"] == path
    assert (
        client.post(
            "/sources/t/indexes/flow/edges", json=[{"from": "a1", "to": "a2"}], headers=auth(acme_writer)
        ).status_code
        == 200
    )
    assert stored(conn, "flow") == {("a1", "edge", "g1"), ("a1", "edge", "a2")}
    # neighbours over HTTP keep to the caller's rows, and need the navigation tool of the index's kind
    shown = client.get("/sources/t/indexes/sections/neighbors", params={"key": "a1"}, headers=auth(acme_key))
    assert shown.json() == [{"key": "a2", "edge_type": "child", "weight": 1.0}]
    assert (
        client.get(
            "/sources/t/indexes/xref/neighbors", params={"key": "a1"}, headers=auth(reader)
        ).status_code
        == 403
    )
    assert client.delete("/sources/t/indexes/flow", headers=auth(writer)).status_code == 403


# CLI -------------------------------------------------------------------------------------------------------


def test_cli_index_commands(
    conn: psycopg.Connection[Any], db_url: str, monkeypatch: Any, capsys: Any, tmp_path: Path
) -> None:
    make_source(conn)
    put(conn, "a", {"links": ["b"], "next": "b"})
    put(conn, "b", {"parent": "a"})
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert main(["index", "create", "t", "sections", "--tree", "parent"]) == 0
    assert "1 edges" in capsys.readouterr().out
    assert main(["index", "create", "t", "xref", "--graph", "links", "--edge-type", "xref"]) == 0
    edges = _write(tmp_path / "e.jsonl", '{"from": "a", "to": "b"}\n')
    assert main(["index", "create", "t", "flow", "--edges", str(edges), "--kind", "tree"]) == 0
    assert main(["index", "create", "t", "bad", "--graph", "nope"]) == 2
    assert "3007" in capsys.readouterr().err
    assert main(["index", "create", "t", "bad", "--graph", "links", "--kind", "tree"]) == 2
    capsys.readouterr()
    assert main(["index", "list", "t"]) == 0
    out = capsys.readouterr().out
    assert "sections" in out and "(explicit)" in out
    assert main(["index", "check", "t"]) == 0
    assert "match the documents" in capsys.readouterr().out
    conn.execute("delete from agentdb.edges where edge_type = 'xref'")
    assert main(["index", "check", "t", "xref"]) == 2
    captured = capsys.readouterr()
    assert "1 missing" in captured.out and "--repair" in captured.err
    assert main(["index", "check", "t", "--repair"]) == 0
    assert "repaired" in capsys.readouterr().out
    assert main(["index", "drop", "t", "flow"]) == 0
    assert main(["index", "drop", "t", "flow"]) == 2
    assert {i.name for i in list_indexes(conn, "t")} == {"sections", "xref"}


def test_demo_indexes(conn: psycopg.Connection[Any], capsys: Any) -> None:
    """The demo's three indexes over a source shaped like the pgdocs pack (parent, links, next)."""
    make_source(conn, DEMO_SOURCE)
    put(conn, "index.html", {"next": "preface.html", "links": ["preface.html"]}, table=DEMO_SOURCE)
    put(conn, "preface.html", {"parent": "index.html", "next": "intro.html"}, table=DEMO_SOURCE)
    put(conn, "intro.html", {"parent": "preface.html", "links": ["index.html"]}, table=DEMO_SOURCE)
    _demo_indexes(conn)
    _demo_indexes(conn)  # idempotent: a loaded demo gets the ones it lacks
    assert {(i.name, i.kind, i.field, i.edge_type) for i in list_indexes(conn, DEMO_SOURCE)} == {
        (name, kind, field, edge_type) for name, kind, field, edge_type in DEMO_INDEXES
    }
    assert [n.key for n in neighbors(conn, DEMO_SOURCE, "sections", "index.html")] == ["preface.html"]
    assert [n.key for n in neighbors(conn, DEMO_SOURCE, "next", "preface.html")] == ["intro.html"]
    assert all(c.ok and c.dangling == 0 for c in check_indexes(conn, DEMO_SOURCE))
