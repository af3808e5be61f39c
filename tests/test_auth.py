"""Principals against a real PostgreSQL: keys, request-level checks, and the grant enforced by the database
itself: a query under the principal's role cannot see a row outside its filter, a field outside its field
grant, or a posting of a chunk it cannot read, even without the application's WHERE and projection."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from agentdb.auth import (
    Principal,
    any_principals,
    authenticate,
    check_fields,
    check_filter,
    check_table,
    check_tool,
    create_principal,
    delete_principal,
    list_principals,
    principal_scope,
)
from agentdb.errors import (
    AgentDBError,
    Conflict,
    Forbidden,
    InvalidParamValue,
    StorageFileNotFound,
    Unauthorized,
    from_db_error,
)
from agentdb.filters import ReadScope
from agentdb.retrieval import retrieve
from agentdb.sources import FieldSpec, create_document_source, drop_source, get_source, register_table
from tests.filter_oracle import filters, matches, sample_metadata

DIM = 8
FIELDS = [
    FieldSpec(name="year", type="int"),
    FieldSpec(name="score", type="float"),
    FieldSpec(name="status", type="string"),
    FieldSpec(name="published", type="bool"),
    FieldSpec(name="tags", type="string_set"),
    FieldSpec(name="created", type="timestamp"),
    FieldSpec(name="rank", type="int", optional=False, default=3),
    FieldSpec(name="lang", type="string", optional=False, default="en"),
]
FIELD_DICTS = [f.model_dump() for f in FIELDS]
WORDS = ["wal", "archive", "vacuum", "index", "replica", "backup", "query", "lock", "tuple", "snapshot"]
N_DOCS = 60
DOC_IDS = [f"d{i:02d}" for i in range(N_DOCS)]
_names = itertools.count()
pytestmark = pytest.mark.usefixtures("drop_principals")  # every test: principals outlive its database


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


@pytest.fixture
def corpus(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    """Source `docs` (60 rows: random metadata, three words each, random unit vectors; a few without a
    vector) and source `other` (3 rows, no fields), both in the row layout, whose postings the principals'
    policies filter row by row (tests/test_blocks.py covers principals on block sources). Returns docs'
    metadata by doc id."""
    create_document_source(
        conn, "docs", embedding_model="m", embedding_dim=DIM, fields=FIELDS, lexical_layout="rows"
    )
    create_document_source(conn, "other", embedding_model="m", embedding_dim=DIM, lexical_layout="rows")
    rng = random.Random(4)
    nprng = np.random.default_rng(4)
    rows = {doc_id: sample_metadata(FIELD_DICTS, rng) for doc_id in DOC_IDS}
    with conn.cursor() as cur:
        cur.executemany(
            "insert into agentdb_docs.docs (doc_id, chunk, title, text, metadata, agentdb_embedding)"
            " values (%s, 0, %s, %s, %s, %s)",
            [
                (
                    doc_id,
                    f"title {doc_id}",
                    " ".join(rng.sample(WORDS, 3)),
                    Jsonb(meta),
                    None if i % 10 == 9 else _unit(nprng),
                )
                for i, (doc_id, meta) in enumerate(rows.items())
            ],
        )
        cur.executemany(
            "insert into agentdb_docs.other (doc_id, chunk, text, agentdb_embedding) values (%s, 0, %s, %s)",
            [(f"o{i}", "wal archive secret", _unit(nprng)) for i in range(3)],
        )
    return rows


def _roles(conn: psycopg.Connection[Any]) -> set[str]:
    oid = _one(conn, "select oid from pg_database where datname = current_database()")
    return {
        r[0]
        for r in conn.execute("select rolname from pg_roles where rolname ~ %s", (rf"^agentdb_p_{oid}_\d+$",))
    }


def _policies(conn: psycopg.Connection[Any]) -> set[tuple[str, str]]:
    return {
        (r[0], r[1])
        for r in conn.execute(
            r"select polrelid::regclass::text, polname from pg_policy where polname ~ '^agentdb_p_\d+$'"
        )
    }


def _one(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _rls(conn: psycopg.Connection[Any], table: str) -> bool:
    return bool(_one(conn, "select relrowsecurity from pg_class where oid = %s::regclass", (table,)))


def _allowed(rows: dict[str, dict[str, Any]], row_filter: dict[str, Any] | None) -> set[str]:
    return {doc_id for doc_id, meta in rows.items() if matches(FIELD_DICTS, row_filter, doc_id, meta)}


def _refused(scoped: psycopg.Connection[Any], statement: str) -> bool:
    """Whether `statement` fails for lack of privilege (in a savepoint, so the scope goes on)."""
    try:
        with scoped.transaction():
            scoped.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


def _postings(conn: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
    """Every posting the connection's current role can read."""
    return set(conn.execute("select source_id, term, chunk_id, tf, dl from agentdb.postings").fetchall())


def _postings_of(conn: psycopg.Connection[Any], source: str, doc_ids: set[str]) -> set[tuple[Any, ...]]:
    """The postings of the chunks of documents `doc_ids` of document source `source`, read as the owner."""
    src = get_source(conn, source)
    query = sql.SQL(
        "select p.source_id, p.term, p.chunk_id, p.tf, p.dl from agentdb.postings p"
        " join {} c on c.agentdb_chunk_id = p.chunk_id where p.source_id = %s and c.doc_id = any(%s)"
    ).format(src.table)
    return set(conn.execute(query, (src.id, sorted(doc_ids))).fetchall())


def _visible(scoped: psycopg.Connection[Any], source: str) -> dict[tuple[str, int], tuple[Any, ...]]:
    """(doc id, chunk) -> (title, text, metadata) of every row the role reads through agentdb.source_relation."""
    relation = _one(
        scoped, "select agentdb.source_relation(s) from agentdb.sources s where s.name = %s", (source,)
    )
    query = sql.SQL("select doc_id, chunk, title, text, metadata from {} c").format(sql.SQL(relation))
    return {(r[0], r[1]): (r[2], r[3], r[4]) for r in scoped.execute(query)}


def _projected(
    conn: psycopg.Connection[Any], source: str, doc_ids: set[str], grant: list[str] | None
) -> dict[tuple[str, int], tuple[Any, ...]]:
    """The oracle for _visible: the rows of `doc_ids` read as the owner, projected to the field grant."""
    query = sql.SQL("select doc_id, chunk, title, text, metadata from {} where doc_id = any(%s)").format(
        get_source(conn, source).table
    )
    return {
        (r[0], r[1]): (
            r[2] if grant is None or "title" in grant else None,
            r[3] if grant is None or "text" in grant else None,
            r[4] if grant is None else {k: v for k, v in r[4].items() if k in grant},
        )
        for r in conn.execute(query, (sorted(doc_ids),))
    }


# Creating, listing, deleting --------------------------------------------------------------------------


def test_create_list_delete(conn: psycopg.Connection[Any], corpus: dict[str, Any]) -> None:
    assert not any_principals(conn)
    assert not _rls(conn, "agentdb_docs.docs")
    alice, key = create_principal(
        conn,
        "alice",
        tables=["docs"],
        row_filter={"year": {"$gte": 5}},
        fields=["text", "year"],
        tools=["search", "tree_search"],
    )
    assert key.startswith("adb_") and len(key) == 47
    assert alice == Principal(
        id=alice.id,
        name="alice",
        tables=("docs",),
        row_filter={"year": {"$gte": 5}},
        fields=("text", "year"),
        tools=frozenset({"search", "tree_search"}),
        role=alice.role,
    )
    bob, _ = create_principal(conn, "bob", tables=["docs", "other"])
    assert bob.fields is None and bob.row_filter is None and bob.tools == frozenset({"search"})
    assert any_principals(conn)
    assert list_principals(conn) == [alice, bob]
    assert _roles(conn) == {alice.role, bob.role}
    assert _policies(conn) == {
        ("agentdb_docs.docs", f"agentdb_p_{alice.id}"),
        ("agentdb_docs.docs", f"agentdb_p_{bob.id}"),
        ("agentdb_docs.other", f"agentdb_p_{bob.id}"),
        ("agentdb.postings", f"agentdb_p_{alice.id}"),
        ("agentdb.postings", f"agentdb_p_{bob.id}"),
    }
    assert _rls(conn, "agentdb_docs.docs") and _rls(conn, "agentdb_docs.other")
    # The key is stored hashed only.
    stored = conn.execute(
        "select key_hash, key_prefix from agentdb.principals where name = 'alice'"
    ).fetchone()
    assert (
        stored is not None
        and key not in stored[0]
        and stored[0].startswith("sha256$")
        and key.startswith(stored[1])
    )

    delete_principal(conn, "alice")
    assert list_principals(conn) == [bob]
    assert _roles(conn) == {bob.role}
    assert all(name == f"agentdb_p_{bob.id}" for _, name in _policies(conn))
    assert not conn.execute(
        "select 1 from agentdb.principal_grants where principal_id = %s", (alice.id,)
    ).fetchone()
    with pytest.raises(StorageFileNotFound) as err:
        delete_principal(conn, "alice")
    assert err.value.path == "name"
    delete_principal(conn, "bob")
    assert not any_principals(conn) and not _roles(conn) and not _policies(conn)
    # agentdb turned row security on, so it turns it off again with the last policy.
    assert not _rls(conn, "agentdb_docs.docs") and not _rls(conn, "agentdb_docs.other")


def test_owner_still_reads_and_writes_everything(
    conn: psycopg.Connection[Any], corpus: dict[str, Any]
) -> None:
    create_principal(conn, "alice", tables=["docs"], row_filter={"year": 1})
    assert conn.execute("select count(*) from agentdb_docs.docs").fetchone() == (N_DOCS,)
    conn.execute("insert into agentdb_docs.docs (doc_id, chunk, text) values ('new', 0, 'zebra crossing')")
    hits = retrieve(conn, "docs", "zebra", mode="lexical").hits
    assert [h.id for h in hits] == ["new"]


BAD_INPUTS: list[tuple[dict[str, Any], type[AgentDBError], str]] = [
    ({"name": "Not A Name", "tables": ["docs"]}, InvalidParamValue, "name"),
    ({"name": "p", "tables": ["docs", "nope"]}, StorageFileNotFound, "tables[1]"),
    ({"name": "p", "tables": ["docs"], "row_filter": {"nope": 1}}, InvalidParamValue, "row_filter.nope"),
    (
        {"name": "p", "tables": ["docs"], "row_filter": {"year": {"$gt": "x"}}},
        InvalidParamValue,
        "row_filter.year.$gt",
    ),
    # Valid for docs, not for other (which has no fields): the filter must compile for every table.
    (
        {"name": "p", "tables": ["docs", "other"], "row_filter": {"year": 1}},
        InvalidParamValue,
        "row_filter.year",
    ),
    ({"name": "p", "tables": ["docs"], "row_filter": ["year"]}, InvalidParamValue, "row_filter"),
    ({"name": "p", "tables": ["docs"], "fields": ["year", "nope"]}, InvalidParamValue, "fields[1]"),
    ({"name": "p", "tables": ["docs", "other"], "fields": ["text", "year"]}, InvalidParamValue, "fields[1]"),
    ({"name": "p", "tables": ["docs"], "tools": ["search", "fly"]}, InvalidParamValue, "tools[1]"),
    ({"name": "p", "tables": ["docs"], "tools": []}, InvalidParamValue, "tools"),
    ({"name": "p", "tables": "docs"}, InvalidParamValue, "tables"),
]


def test_bad_input_changes_nothing(conn: psycopg.Connection[Any], corpus: dict[str, Any]) -> None:
    for kwargs, error, path in BAD_INPUTS:
        with pytest.raises(error) as err:
            create_principal(conn, **kwargs)
        assert err.value.path == path, kwargs
        assert not any_principals(conn) and not _roles(conn) and not _policies(conn)
        assert not _rls(conn, "agentdb_docs.docs")
        assert conn.execute("select count(*) from agentdb.principal_grants").fetchone() == (0,)


def test_conflicts_change_nothing(conn: psycopg.Connection[Any], corpus: dict[str, Any]) -> None:
    alice, _ = create_principal(conn, "alice", tables=["docs"])
    before = (_roles(conn), _policies(conn))
    with pytest.raises(Conflict) as err:
        create_principal(conn, "alice", tables=["other"])
    assert err.value.path == "name"
    assert list_principals(conn) == [alice] and (_roles(conn), _policies(conn)) == before

    # A failure in the database half-way (the role name is taken) rolls back the row and every grant.
    oid = _one(conn, "select oid from pg_database where datname = current_database()")
    next_id = _one(conn, "select nextval(pg_get_serial_sequence('agentdb.principals', 'id'))")
    squatter = f"agentdb_p_{oid}_{next_id + 1}"
    conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(squatter)))
    try:
        with pytest.raises(Conflict):
            create_principal(conn, "bob", tables=["docs", "other"])
        assert list_principals(conn) == [alice] and _policies(conn) == before[1]
        assert not _rls(conn, "agentdb_docs.other")
        assert conn.execute("select count(*) from agentdb.principal_grants").fetchone() == (1,)
    finally:
        conn.execute(sql.SQL("drop role {}").format(sql.Identifier(squatter)))


# Authentication -----------------------------------------------------------------------------------------


def test_authenticate(conn: psycopg.Connection[Any], corpus: dict[str, Any]) -> None:
    alice, key = create_principal(conn, "alice", tables=["docs"])
    bob, bob_key = create_principal(conn, "bob", tables=["docs"])
    assert authenticate(conn, f"Bearer {key}") == alice
    assert authenticate(conn, f"  bearer   {bob_key} ") == bob

    def fails(header: str | None) -> str:
        with pytest.raises(Unauthorized) as err:
            authenticate(conn, header)
        assert err.value.code == 1401 and err.value.http_status == 401
        return err.value.message

    for header in (
        None,
        "",
        "   ",
        "Bearer",
        "Bearer ",
        key,
        f"Basic {key}",
        f"Bearer {key[:-1]}",
        f"Bearer {key}x",
        f"Bearer {key} extra",
        "Bearer adb_" + "!" * 43,
    ):
        fails(header)
    # A well-formed unknown key, a key with a known prefix but a wrong rest, and a deleted principal's key
    # all fail with the same message: nothing tells them apart.
    wrong = "adb_" + "A" * 43
    same_prefix = key[:12] + ("B" if key[12] != "B" else "C") + key[13:]
    messages = {fails(f"Bearer {wrong}"), fails(f"Bearer {same_prefix}")}
    delete_principal(conn, "bob")
    messages.add(fails(f"Bearer {bob_key}"))
    assert messages == {"invalid API key"}
    assert authenticate(conn, f"Bearer {key}") == alice


# Request-level checks ---------------------------------------------------------------------------------------


def test_check_table_fields_tool(conn: psycopg.Connection[Any], corpus: dict[str, Any]) -> None:
    narrow, _ = create_principal(conn, "narrow", tables=["docs"], fields=["text", "year"], tools=["search"])
    wide, _ = create_principal(
        conn, "wide", tables=["docs", "other"], tools=["search", "graph_search", "memory"]
    )

    check_table(narrow, "docs")
    for table in ("other", "nope"):  # unknown and existing-but-not-granted look the same
        with pytest.raises(Forbidden) as err:
            check_table(narrow, table, path="queries[0].table")
        assert err.value.path == "queries[0].table" and err.value.http_status == 403
    check_table(wide, "other")

    assert check_fields(narrow, None) == ["text", "year"]  # no projection asked: project to the grant
    assert check_fields(narrow, ["year"]) == ["year"]
    assert check_fields(narrow, []) == []
    with pytest.raises(Forbidden) as err:
        check_fields(narrow, ["year", "status"], path="queries[1].fields")
    assert err.value.path == "queries[1].fields[1]"
    assert check_fields(wide, None) is None
    assert check_fields(wide, ["status"]) == ["status"]

    check_tool(narrow, "search")
    for tool in ("tree_search", "memory", "ingest"):
        with pytest.raises(Forbidden):
            check_tool(narrow, tool)
    check_tool(wide, "memory")

    docs = get_source(conn, "docs")
    check_filter(conn, narrow, docs, {"year": {"$gt": 3}})
    check_filter(conn, wide, docs, {"status": "beta"})
    with pytest.raises(Forbidden) as err:
        check_filter(conn, narrow, docs, {"$and": [{"year": 1}, {"status": "beta"}]})
    assert err.value.path == "filter.$and[1].status"
    # Under a field grant a field that does not exist answers like a hidden one (403), so that the answer
    # does not tell hidden fields apart; without a grant it is 3007. Other invalid filters are 3007 too.
    with pytest.raises(Forbidden):
        check_filter(conn, narrow, docs, {"nope": 1})
    with pytest.raises(InvalidParamValue):
        check_filter(conn, wide, docs, {"nope": 1})
    with pytest.raises(InvalidParamValue):
        check_filter(conn, narrow, docs, {"year": {"$gt": "x"}})


# Database-level enforcement ----------------------------------------------------------------------------------


def test_role_sees_only_its_rows(conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]) -> None:
    row_filter = {"year": {"$gte": 5}}
    alice, _ = create_principal(conn, "alice", tables=["docs"], row_filter=row_filter)
    # A filter on the document id compiles for both sources (`other` has no metadata fields).
    bob_ids = ["d01", "d07", "o1", "zz"]
    bob, _ = create_principal(conn, "bob", tables=["docs", "other"], row_filter={"ids": bob_ids})
    allowed = _allowed(corpus, row_filter)
    assert 0 < len(allowed) < N_DOCS
    me = conn.execute("select current_user").fetchone()
    docs_id, other_id = get_source(conn, "docs").id, get_source(conn, "other").id

    with principal_scope(conn, alice) as scoped:
        assert scoped.execute("select current_user").fetchone() == (alice.role,)
        # No WHERE at all: the policy alone decides.
        assert {r[0] for r in scoped.execute("select doc_id from agentdb_docs.docs")} == allowed
        assert scoped.execute("select count(*) from agentdb_docs.docs").fetchone() == (len(allowed),)
        # Postings of other sources are hidden too.
        assert {r[0] for r in scoped.execute("select distinct source_id from agentdb.postings")} == {docs_id}
    assert conn.execute("select current_user").fetchone() == me

    forbidden = [
        "select * from agentdb.principals",
        "select * from agentdb.principal_grants",
        "select doc_id from agentdb_docs.other",
        f"select agentdb.principal_params_{bob.id}({docs_id})",  # another principal's filter values
        "insert into agentdb_docs.docs (doc_id, chunk, text) values ('x', 0, 'x')",
        "delete from agentdb_docs.docs",
    ]
    for statement in forbidden:
        with pytest.raises(psycopg.errors.InsufficientPrivilege), principal_scope(conn, alice) as scoped:
            scoped.execute(statement)
        assert conn.execute("select current_user").fetchone() == me
    with principal_scope(conn, bob) as scoped:
        assert {r[0] for r in scoped.execute("select doc_id from agentdb_docs.docs")} == {"d01", "d07"}
        assert {r[0] for r in scoped.execute("select doc_id from agentdb_docs.other")} == {"o1"}
        assert {r[0] for r in scoped.execute("select distinct source_id from agentdb.postings")} == {
            docs_id,
            other_id,
        }


def test_scope_inside_a_transaction_restores_the_role(
    conn: psycopg.Connection[Any], corpus: dict[str, Any]
) -> None:
    alice, _ = create_principal(conn, "alice", tables=["docs"], row_filter={"year": 1})
    me = conn.execute("select current_user").fetchone()
    with conn.transaction():
        with principal_scope(conn, alice) as scoped:
            assert scoped.execute("select current_user").fetchone() == (alice.role,)
        assert conn.execute("select current_user").fetchone() == me
        assert conn.execute("select count(*) from agentdb_docs.docs").fetchone() == (N_DOCS,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege), principal_scope(conn, alice) as scoped:
            scoped.execute("select * from agentdb.principals")
        assert conn.execute("select current_user").fetchone() == me
    # A principal deleted since it was authenticated cannot open a scope.
    delete_principal(conn, "alice")
    with pytest.raises(Unauthorized), principal_scope(conn, alice):
        pass


def test_dropping_a_source_releases_it(conn: psycopg.Connection[Any], corpus: dict[str, Any]) -> None:
    alice, _ = create_principal(
        conn, "alice", tables=["docs", "other"], row_filter={"must_not": {"ids": ["x"]}}
    )
    drop_source(conn, "other")
    [listed] = list_principals(conn)
    assert listed.tables == ("docs",)
    assert ("agentdb_docs.docs", f"agentdb_p_{alice.id}") in _policies(conn)
    assert conn.execute("select count(*) from agentdb.principal_grants").fetchone() == (1,)
    # A new source of the same name is not granted by accident.
    create_document_source(conn, "other", embedding_model="m", embedding_dim=DIM)
    with pytest.raises(psycopg.errors.InsufficientPrivilege), principal_scope(conn, listed) as scoped:
        scoped.execute("select * from agentdb_docs.other")
    # Its postings policy was rewritten without the dropped table: the docs postings still read.
    with principal_scope(conn, listed) as scoped:
        assert _postings(scoped) == _postings_of(conn, "docs", set(DOC_IDS))


def test_registered_table(conn: psycopg.Connection[Any], db_url: str) -> None:
    """A table registered in place: SELECT and a policy on it, USAGE on its schema; dropping the source
    takes them off again and returns the table to its owner's state."""
    conn.execute("create schema shop")
    conn.execute("create table shop.products (id int primary key, body text, tenant text, price float8)")
    conn.execute(
        "insert into shop.products select g, 'wal archive ' || g, case when g % 3 = 0 then 'acme' else 'umbrella' end,"
        " g from generate_series(1, 12) g"
    )
    register_table(
        conn,
        db_url,
        "products",
        table="products",
        schema="shop",
        id_column="id",
        text_columns=["body"],
        embedding_model="m",
        embedding_dim=DIM,
    )
    alice, _ = create_principal(
        conn, "alice", tables=["products"], row_filter={"tenant": "acme"}, fields=["text", "tenant"]
    )
    acme = {str(g) for g in range(1, 13) if g % 3 == 0}
    products = get_source(conn, "products")
    acme_postings = set(
        conn.execute(
            "select p.source_id, p.term, p.chunk_id, p.tf, p.dl from agentdb.postings p"
            " join shop.products c on c.agentdb_chunk_id = p.chunk_id where p.source_id = %s and c.tenant = 'acme'",
            (products.id,),
        ).fetchall()
    )
    with principal_scope(conn, alice) as scoped:
        assert {str(r[0]) for r in scoped.execute("select id from shop.products")} == acme
        assert {r[0] for r in scoped.execute("select body || tenant from shop.products")} == {
            f"wal archive {g}acme" for g in acme
        }
        # price is a field outside the grant: its column is not readable, and null in the relation.
        assert _refused(scoped, "select price from shop.products")
        assert _refused(scoped, "select * from shop.products")
        relation = _one(
            scoped, "select agentdb.source_relation(s) from agentdb.sources s where s.name = 'products'"
        )
        rows = scoped.execute(
            sql.SQL("select id, tenant, price from {} c").format(sql.SQL(relation))
        ).fetchall()
        assert {(str(r[0]), r[1], r[2]) for r in rows} == {(g, "acme", None) for g in acme}
        assert _postings(scoped) == acme_postings
        result = retrieve(
            scoped, "products", "wal archive", mode="lexical", top_k=20, fields=check_fields(alice, None)
        )
    assert {h.id for h in result.hits} == acme
    assert all(set(h.metadata) <= {"tenant"} and h.title is None for h in result.hits)
    assert result.diagnostics["parameters"]["raw_result_count"] == len(acme)

    drop_source(conn, "products")
    assert not _policies(conn) - {("agentdb.postings", f"agentdb_p_{alice.id}")}
    assert not _rls(conn, "shop.products")
    assert not conn.execute(
        "select 1 from information_schema.role_table_grants where grantee = %s and table_schema = 'shop'",
        (alice.role,),
    ).fetchone()


TENANT_FIELDS = [FieldSpec(name="tenant", type="string"), FieldSpec(name="secret", type="string")]
TENANTS = ("acme", "umbrella", "initech")


@pytest.fixture
def tenants(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Source `tenants` (row layout): 30 documents of 3 chunks, each of one tenant with a secret. Returns doc id
    -> tenant."""
    create_document_source(
        conn, "tenants", embedding_model="m", embedding_dim=DIM, fields=TENANT_FIELDS, lexical_layout="rows"
    )
    rng = random.Random(8)
    nprng = np.random.default_rng(8)
    owners = {f"t{i:02d}": TENANTS[i % 3] for i in range(30)}
    with conn.cursor() as cur:
        cur.executemany(
            "insert into agentdb_docs.tenants (doc_id, chunk, title, text, metadata, agentdb_embedding)"
            " values (%s, %s, %s, %s, %s, %s)",
            [
                (
                    doc_id,
                    chunk,
                    f"title {doc_id}",
                    " ".join(rng.sample(WORDS, 3)) + f" {tenant}word{chunk}",
                    Jsonb({"tenant": tenant, "secret": f"secret of {doc_id}"}),
                    _unit(nprng),
                )
                for doc_id, tenant in owners.items()
                for chunk in range(3)
            ],
        )
    return owners


def test_the_role_reads_neither_hidden_fields_nor_other_rows_postings(
    conn: psycopg.Connection[Any], corpus: dict[str, Any], tenants: dict[str, str]
) -> None:
    """The attack of the issue: under the role of a reader with row filter {"tenant": "acme"} and fields
    title, text, tenant, `select metadata->>'secret'` read acme's secrets and `select * from
    agentdb.postings` every tenant's postings (enough to rebuild their bags of words). Now the metadata
    column is refused (the role reads the projection of its grant), the postings are those of acme's
    chunks only, and term statistics are a lookup of named terms, not a vocabulary listing."""
    reader, _ = create_principal(
        conn, "reader", tables=["tenants"], row_filter={"tenant": "acme"}, fields=["title", "text", "tenant"]
    )
    acme = {d for d, t in tenants.items() if t == "acme"}
    src = get_source(conn, "tenants")
    with principal_scope(conn, reader) as scoped:
        for statement in (
            "select metadata->>'secret' from agentdb_docs.tenants",
            "select metadata from agentdb_docs.tenants",
            "select * from agentdb_docs.tenants",
            "select agentdb_tsv from agentdb_docs.tenants",
            "select * from agentdb.term_stats",
            "select term from agentdb.term_stats where source_id = 1",
        ):
            assert _refused(scoped, statement), statement
        assert {r[0] for r in scoped.execute("select distinct doc_id from agentdb_docs.tenants")} == acme
        postings = _postings(scoped)
        visible = _visible(scoped, "tenants")
        stats = set(
            scoped.execute(
                "select term, df from agentdb.principal_term_stats(%s, %s)",
                (src.id, ["acmeword0", "umbrellaword1", "wal", "zebra"]),
            ).fetchall()
        )
        # agentdb.similar reads the stored vector through the role's relation too.
        similar = {r[0] for r in scoped.execute("select id from agentdb.similar('tenants', 't00', 30)")}
        assert similar and similar <= acme - {"t00"}
        # A source the role may not read gives no statistics at all.
        other = get_source(conn, "other").id
        assert not scoped.execute(
            "select * from agentdb.principal_term_stats(%s, %s)", (other, ["wal"])
        ).fetchall()
    assert postings == _postings_of(conn, "tenants", acme)
    assert {p[1] for p in postings} >= {"acmeword0"} and not {p[1] for p in postings} & {"umbrellaword0"}
    assert visible == _projected(conn, "tenants", acme, ["title", "text", "tenant"])
    assert all(meta == {"tenant": "acme"} for _, _, meta in visible.values())
    # Global statistics stay global (the documented trade-off), for the named terms only.
    assert stats == set(
        conn.execute(
            "select term, df from agentdb.term_stats where source_id = %s and term = any(%s)",
            (src.id, ["acmeword0", "umbrellaword1", "wal", "zebra"]),
        ).fetchall()
    )
    assert {t for t, _ in stats} == {"acmeword0", "umbrellaword1", "wal"}


def test_postings_of_a_principal_without_row_filter(
    conn: psycopg.Connection[Any], corpus: dict[str, Any]
) -> None:
    """A principal whose row filter lets every row through reads every posting of its sources without a
    probe per posting; a restrictive policy added to the table by hand narrows its postings with its rows."""
    everyone, _ = create_principal(conn, "everyone", tables=["docs"], fields=["text"])
    with principal_scope(conn, everyone) as scoped:
        assert _postings(scoped) == _postings_of(conn, "docs", set(DOC_IDS))
    conn.execute(
        "create policy not_d01 on agentdb_docs.docs as restrictive for select to public using (doc_id <> 'd01')"
    )
    with principal_scope(conn, everyone) as scoped:
        assert {r[0] for r in scoped.execute("select doc_id from agentdb_docs.docs")} == set(DOC_IDS) - {
            "d01"
        }
        assert _postings(scoped) == _postings_of(conn, "docs", set(DOC_IDS) - {"d01"})
    conn.execute("drop policy not_d01 on agentdb_docs.docs")


def test_the_role_reads_only_its_fields(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]
) -> None:
    """Column privileges follow the field grant: title and text when granted, of the metadata only the
    granted keys (a shared virtual column), the whole metadata only without a grant."""
    row_filter = {"year": {"$gte": 5}}
    allowed = _allowed(corpus, row_filter)
    grants: list[list[str] | None] = [["year", "tags"], ["title", "text"], ["tags", "year", "text"], None, []]
    for i, grant in enumerate(grants):
        principal, _ = create_principal(conn, f"f{i}", tables=["docs"], row_filter=row_filter, fields=grant)
        with principal_scope(conn, principal) as scoped:
            refused = {
                column: _refused(scoped, f"select {column} from agentdb_docs.docs")  # noqa: S608 - constant
                for column in ("doc_id", "title", "text", "metadata", "agentdb_tsv")
            }
            assert refused == {
                "doc_id": False,
                "title": grant is not None and "title" not in grant,
                "text": grant is not None and "text" not in grant,
                "metadata": grant is not None,
                "agentdb_tsv": True,
            }, grant
            visible = _visible(scoped, "docs")
        assert visible == _projected(conn, "docs", allowed, grant), grant
    # One projection column per set of metadata keys, shared: ["year", "tags"] and ["tags", "year", "text"].
    projections = conn.execute(
        "select count(*) from pg_attribute where attrelid = 'agentdb_docs.docs'::regclass"
        " and attname like 'agentdb\\_meta\\_%' and not attisdropped"
    ).fetchone()
    assert projections == (1,)


def test_expansion_and_document_fetch_under_the_role(
    conn: psycopg.Connection[Any], corpus: dict[str, Any], tenants: dict[str, str]
) -> None:
    """Neighbour expansion and the document fetch read through the role's relation: windows only over its
    rows (its row filter reads a field outside its grant), no text without "text", no hidden key."""
    from agentdb.agent.expansion import expand
    from agentdb.api.documents import get_document

    acme = sorted(d for d, t in tenants.items() if t == "acme")
    hits = [{"id": acme[0], "chunk": 1, "rank": 1}, {"id": "t01", "chunk": 1, "rank": 2}]  # t01 is umbrella's
    for grant, with_text in ((["title"], False), (["text", "secret"], True)):
        principal, _ = create_principal(
            conn, f"x{int(with_text)}", tables=["tenants"], row_filter={"tenant": "acme"}, fields=grant
        )
        fields = check_fields(principal, None)
        with principal_scope(conn, principal) as scoped:
            expanded = expand(
                scoped, "tenants", hits, 3, scope=ReadScope(row_filter=principal.row_filter), fields=fields
            )
        assert [h.chunks for h in expanded] == [[0, 1, 2], []]
        assert (expanded[0].text is not None) == with_text
        if with_text:
            assert "acmeword0" in (expanded[0].text or "") and "acmeword2" in (expanded[0].text or "")
        document = get_document("tenants", acme[0], conn, principal)
        assert [c["chunk"] for c in document.chunks] == [0, 1, 2]
        assert all((c["text"] is not None) == with_text for c in document.chunks)
        assert document.metadata == ({"secret": f"secret of {acme[0]}"} if with_text else {})
        with pytest.raises(StorageFileNotFound):
            get_document("tenants", "t01", conn, principal)


def test_migrate_converts_principals_installed_before(
    conn: psycopg.Connection[Any], corpus: dict[str, Any], tenants: dict[str, str]
) -> None:
    """A principal installed by the earlier grants (table-wide SELECT, every postings row of its sources, all
    of agentdb.term_stats) is re-installed by migrate, keeping its role and key."""
    from agentdb.db.migrate import migrate

    reader, key = create_principal(
        conn, "reader", tables=["tenants"], row_filter={"tenant": "acme"}, fields=["title", "text", "tenant"]
    )
    # What the earlier install left: broad grants, a postings policy by source only, no recorded version, and
    # the earlier agentdb's stored functions (another digest).
    conn.execute(
        sql.SQL(
            "grant select on agentdb_docs.tenants, agentdb.term_stats to {role};"
            " drop policy {obj} on agentdb.postings;"
            " create policy {obj} on agentdb.postings as restrictive for select to {role}"
            " using (source_id = any (array[{sid}]));"
            " update agentdb.principals set install_version = 0;"
            " update agentdb.schema_functions set digest = 'an earlier agentdb'"
        ).format(
            role=sql.Identifier(reader.role),
            obj=sql.Identifier(f"agentdb_p_{reader.id}"),
            sid=sql.Literal(get_source(conn, "tenants").id),
        )
    )
    with principal_scope(conn, reader) as scoped:
        assert not _refused(scoped, "select metadata from agentdb_docs.tenants")
        assert len(_postings(scoped)) > len(
            _postings_of(conn, "tenants", {d for d, t in tenants.items() if t == "acme"})
        )
    assert migrate(conn) == []
    assert _one(conn, "select install_version from agentdb.principals where id = %s", (reader.id,)) == 2
    assert authenticate(conn, f"Bearer {key}") == reader
    with principal_scope(conn, reader) as scoped:
        assert _refused(scoped, "select metadata from agentdb_docs.tenants")
        assert _refused(scoped, "select * from agentdb.term_stats")
        assert _postings(scoped) == _postings_of(
            conn, "tenants", {d for d, t in tenants.items() if t == "acme"}
        )


# Through agentdb.retrieve -------------------------------------------------------------------------------------


def _lexical_matches(conn: psycopg.Connection[Any], query: str) -> set[str]:
    """Doc ids (read as the owner) whose text holds a term of `query`."""
    return {
        r[0]
        for r in conn.execute(
            "select doc_id from agentdb_docs.docs c where exists (select 1 from unnest(c.agentdb_tsv) t"
            " where t.lexeme = any (array(select lexeme from unnest(to_tsvector('english', %s)))))",
            (query,),
        )
    }


def _embedded(conn: psycopg.Connection[Any]) -> set[str]:
    return {
        r[0] for r in conn.execute("select doc_id from agentdb_docs.docs where agentdb_embedding is not null")
    }


def _check_result(
    result: Any, mode: str, allowed: set[str], lexical: set[str], embedded: set[str], fields: list[str] | None
) -> None:
    """No hit, field or count reveals a row outside `allowed`."""
    ids = {h.id for h in result.hits}
    assert ids <= allowed
    dense_bound = len(allowed & embedded)
    sparse_bound = len(allowed & lexical)
    p = result.diagnostics["parameters"]
    assert p["result_count"] == len(result.hits) <= len(allowed)
    if mode == "dense":
        assert p["raw_result_count"] <= dense_bound
    elif mode == "lexical":
        assert p["raw_result_count"] <= sparse_bound
        assert ids <= lexical
        assert p["sparse_raw_count"] <= sparse_bound and p["dense_raw_count"] == 0
        assert p["fused_candidate_count"] == 0
    else:
        assert p["dense_raw_count"] <= dense_bound and p["sparse_raw_count"] <= sparse_bound
        assert p["raw_result_count"] <= dense_bound + sparse_bound
        assert p["fused_candidate_count"] <= len(allowed & (embedded | lexical))
    if fields is not None:
        for h in result.hits:
            assert set(h.metadata) <= set(fields)
            assert ("title" in fields) or h.title is None
            assert ("text" in fields) or h.text is None


def test_retrieve_under_the_role(conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]) -> None:
    """Each mode, once without passing the row filter (the database alone enforces it) and once with it."""
    row_filter = {"$or": [{"year": {"$lt": 3}}, {"tags": "red"}]}
    alice, _ = create_principal(
        conn, "alice", tables=["docs"], row_filter=row_filter, fields=["text", "year"]
    )
    allowed = _allowed(corpus, row_filter)
    assert 0 < len(allowed) < N_DOCS
    query = "wal archive vacuum"
    lexical, embedded = _lexical_matches(conn, query), _embedded(conn)
    assert lexical - allowed  # the query does match rows the principal may not see
    fields = check_fields(alice, None)
    # With top_k above the corpus size, each leg returns every allowed candidate it has.
    expected = {
        "lexical": allowed & lexical,
        "dense": allowed & embedded,
        "hybrid": allowed & (lexical | embedded),
    }
    # Seed budget 1 sends the lexical leg through agentdb_internal.bm25_maxscore (pruning) instead of the plain sum.
    for mode, pass_row_filter, seed_postings in itertools.product(
        ["lexical", "dense", "hybrid"], [False, True], ["20000", "1"]
    ):
        with principal_scope(conn, alice) as scoped:
            scoped.execute("select set_config('agentdb.lexical_seed_postings', %s, false)", (seed_postings,))
            result = retrieve(
                scoped,
                "docs",
                query,
                mode=mode,  # type: ignore[arg-type]
                query_embedding=_unit(np.random.default_rng(1)),
                threshold=0,
                top_k=N_DOCS,
                row_filter=alice.row_filter if pass_row_filter else None,
                fields=fields,
            )
        _check_result(result, mode, allowed, lexical, embedded, fields)
        assert {h.id for h in result.hits} == expected[mode], (mode, pass_row_filter, seed_postings)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_hit_field_or_count_outside_the_row_filter(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]], data: st.DataObject
) -> None:
    row_filter = data.draw(filters(FIELD_DICTS, DOC_IDS), label="row_filter")
    words = data.draw(st.lists(st.sampled_from([*WORDS, "zebra"]), min_size=1, max_size=3), label="query")
    query = " ".join(words)
    mode = data.draw(st.sampled_from(["lexical", "dense", "hybrid"]), label="mode")
    top_k = data.draw(st.integers(1, N_DOCS), label="top_k")
    grant = data.draw(
        st.none() | st.lists(st.sampled_from(["title", "text", "year", "status", "tags"]), unique=True),
        label="fields",
    )
    seed = data.draw(st.integers(0, 2**16), label="seed")
    seed_postings = data.draw(st.sampled_from(["20000", "1", "5"]), label="lexical_seed_postings")
    principal, _ = create_principal(
        conn, f"p{next(_names)}", tables=["docs"], row_filter=row_filter, fields=grant
    )
    try:
        allowed = _allowed(corpus, row_filter)
        fields = check_fields(principal, None)
        with principal_scope(conn, principal) as scoped:
            seen = {r[0] for r in scoped.execute("select doc_id from agentdb_docs.docs")}
            # The role reads exactly the oracle's rows, postings and granted fields.
            assert _refused(scoped, "select metadata from agentdb_docs.docs") == (grant is not None)
            assert _postings(scoped) == _postings_of(conn, "docs", allowed)
            visible = _visible(scoped, "docs")
            scoped.execute("select set_config('agentdb.lexical_seed_postings', %s, false)", (seed_postings,))
            result = retrieve(
                scoped,
                "docs",
                query,
                mode=mode,  # type: ignore[arg-type]
                query_embedding=_unit(np.random.default_rng(seed)),
                threshold=0,
                top_k=top_k,
                fields=fields,
            )
        assert seen == allowed
        assert visible == _projected(conn, "docs", allowed, grant)
        _check_result(result, mode, allowed, _lexical_matches(conn, query), _embedded(conn), fields)
    finally:
        delete_principal(conn, principal.name)


def test_a_malformed_seed_setting_is_a_clear_error(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]]
) -> None:
    """agentdb.lexical_seed_postings is read by retrieve; a value that is not a count fails loudly rather than
    silently falling back to the default."""
    conn.execute("set agentdb.lexical_seed_postings = 'lots'")
    with pytest.raises(InvalidParamValue) as err:
        retrieve(conn, "docs", "wal archive", mode="lexical")
    assert err.value.path == "agentdb.lexical_seed_postings" and "whole number" in str(err.value)
    conn.execute("set agentdb.lexical_seed_postings = 123456789012345678")
    assert retrieve(conn, "docs", "wal archive", mode="lexical").hits


# The one scoped reader ---------------------------------------------------------------------------------


def _excluded(meta: dict[str, Any], doc_id: str, exclusion: dict[str, Any] | None) -> bool:
    return exclusion not in (None, {}) and matches(FIELD_DICTS, exclusion, doc_id, meta)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_scoped_reader_returns_exactly_the_visible_projected_rows(
    conn: psycopg.Connection[Any], corpus: dict[str, dict[str, Any]], data: st.DataObject
) -> None:
    """agentdb.read, called from SQL under a principal's role with random row filters, query filters,
    exclusions, field grants and keys (some missing, some repeated, some with chunk ranges): the rows are
    exactly the oracle's, projected to the grant, and a hidden key looks like a missing one."""
    row_filter = data.draw(filters(FIELD_DICTS, DOC_IDS), label="row_filter")
    grant = data.draw(
        st.none() | st.lists(st.sampled_from(["title", "text", "year", "status", "tags"]), unique=True),
        label="fields",
    )
    # Query filters name granted fields only, as check_filter requires before any read (under the role a
    # hidden field reads as absent, so a filter on it matches nothing rather than leaking).
    readable = [f for f in FIELD_DICTS if grant is None or f["name"] in grant]
    query_filter = data.draw(st.none() | filters(readable, DOC_IDS), label="filter")
    exclusion = data.draw(st.none() | filters(readable, DOC_IDS), label="exclusion_query")
    keys = data.draw(st.lists(st.sampled_from([*DOC_IDS, "missing"]), max_size=12), label="keys")
    ranged = data.draw(st.booleans(), label="ranged")
    chunk_from = [data.draw(st.sampled_from([None, 0, 1])) for _ in keys] if ranged else None
    principal, _ = create_principal(
        conn, f"r{next(_names)}", tables=["docs"], row_filter=row_filter, fields=grant
    )
    try:
        fields = check_fields(principal, None)
        with principal_scope(conn, principal) as scoped:
            got = scoped.execute(
                "select ord, doc_id, chunk, title, text, metadata from agentdb.read('docs', %s, %s,"
                " scope => %s, fields => %s)",
                (
                    keys,
                    chunk_from,
                    Jsonb({"filter": query_filter, "exclusion_query": exclusion}),
                    fields,
                ),
            ).fetchall()
        allowed = _allowed(corpus, row_filter)
        projected = _projected(conn, "docs", allowed, grant)
        expected = [
            (i + 1, key, 0, *projected[(key, 0)])
            for i, key in enumerate(keys)
            if key in allowed
            and matches(FIELD_DICTS, query_filter, key, corpus[key])
            and not _excluded(corpus[key], key, exclusion)
            and (chunk_from is None or (chunk_from[i] or 0) == 0)
        ]
        assert [tuple(r) for r in got] == expected
    finally:
        delete_principal(conn, principal.name)


def test_the_scoped_reader_refuses_bad_arguments(
    conn: psycopg.Connection[Any], corpus: dict[str, Any]
) -> None:
    """Unknown sources, fields and scope keys, a scope that is not an object, bad filters in it, and ranges
    that do not match the keys, are errors with a path (a filter's path starts at its key in the scope)."""
    cases = [
        ("select * from agentdb.read('nope', array['d00'])", "source"),
        ("""select * from agentdb.read('docs', array['d00'], scope => '{"filters": {}}')""", "scope.filters"),
        ("""select * from agentdb.read('docs', array['d00'], scope => '"year"')""", "scope"),
        (
            """select * from agentdb.read('docs', array['d00'], scope => '{"filter": {"nope": 1}}')""",
            "filter.nope",
        ),
        (
            """select * from agentdb.read('docs', array['d00'], scope => '{"row_filter": {"nope": 1}}')""",
            "row_filter.nope",
        ),
        ("select * from agentdb.read('docs', array['d00'], fields => array['secret'])", "fields[0]"),
        ("select * from agentdb.read('docs', array['d00', 'd01'], array[0])", "chunk_from"),
        ("select * from agentdb.read('docs', array['d00'], null, array[0, 1])", "chunk_to"),
    ]
    for statement, path in cases:
        with pytest.raises(psycopg.Error) as raised, conn.transaction():
            conn.execute(statement)
        error = from_db_error(raised.value)
        assert error is not None and error.path == path, (statement, error)
