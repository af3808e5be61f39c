"""Principals against a real PostgreSQL: keys, request-level checks, and row security enforced by the
database itself (a query under the principal's role cannot see a row outside its filter, even without
the application's WHERE)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
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
)
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


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


@pytest.fixture
def corpus(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    """Source `docs` (60 rows: random metadata, three words each, random unit vectors; a few without a
    vector) and source `other` (3 rows, no fields). Returns docs' metadata by doc id."""
    create_document_source(conn, "docs", embedding_model="m", embedding_dim=DIM, fields=FIELDS)
    create_document_source(conn, "other", embedding_model="m", embedding_dim=DIM)
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


@pytest.fixture(autouse=True)
def drop_principals(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Roles belong to the whole server, not to the test's database: delete every principal afterwards."""
    yield
    for p in list_principals(conn):
        delete_principal(conn, p.name)


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
    with pytest.raises(InvalidParamValue):  # invalid for the source at all: 3007, not 403
        check_filter(conn, narrow, docs, {"nope": 1})


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
    with principal_scope(conn, alice) as scoped:
        assert {str(r[0]) for r in scoped.execute("select id from shop.products")} == acme
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
    # Seed budget 1 sends the lexical leg through agentdb.bm25_maxscore (pruning) instead of the plain sum.
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
