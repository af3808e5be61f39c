"""Shared fixtures: one real PostgreSQL per session (embedded, or AGENTDB_TEST_DSN), a migrated template
database, and a fresh database cloned from it for every test that asks for one."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agentdb.auth import delete_principal, list_principals
from agentdb.db.migrate import migrate
from agentdb.db.pool import configure
from agentdb.db.server import start_embedded, stop_embedded

TEMPLATE = "agentdb_test_template"
# The quick loop, `pytest -m "not slow and not cluster and not browser"`, leaves out the tests that take
# minutes: those that load a corpus at scale (marked `corpus`: SciFact, the demo manual) and these modules
# (the wheel built and installed, replicas and failover started as real servers, the README run end to end,
# a first user's walk over the real model); the Citus cluster (built from source, a coordinator and 2
# workers); and the headless-Chromium pages. A full run still runs, and counts, every test.
SLOW_MODULES = frozenset(
    {"test_wheel.py", "test_replicas.py", "test_failover.py", "test_readme.py", "test_first_use.py"}
)
CLUSTER_MODULES = frozenset({"test_cluster.py"})
BROWSER_MODULES = frozenset({"test_playground.py", "test_docs_page.py"})
SCIFACT = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "scifact"
CITUS_SOURCE = Path(__file__).resolve().parents[1].parent / "shared" / "vendor" / "citus-14.0.1.tar.gz"
# Chunk embeddings of fixed public corpora (SciFact), kept between sessions (agentdb/embed_cache.py).
EMBED_CACHE = Path(__file__).resolve().parents[1] / ".agentdb" / "embeddings"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the slow, cluster and browser tests (see SLOW_MODULES) for the quick loop to leave out, and run
    the tests that need SciFact's chunk vectors last: .ci/run embeds them in the background meanwhile
    (`python -m agentdb.embed_cache`), and their cache waits for it (agentdb/embed_cache.py). Their modules go
    last whole, the marked tests at their end: `make test` hands out whole modules to its workers (pytest-xdist,
    `--dist loadfile`), and a module handed out early would hold its worker waiting for the vectors."""
    late_modules = {item.path for item in items if item.get_closest_marker("scifact_vectors")}
    items.sort(
        key=lambda item: (item.path in late_modules, item.get_closest_marker("scifact_vectors") is not None)
    )
    for item in items:
        module = item.path.name
        if module in SLOW_MODULES or item.get_closest_marker("corpus"):
            item.add_marker(pytest.mark.slow)
        if module in CLUSTER_MODULES:
            item.add_marker(pytest.mark.cluster)
        if module in BROWSER_MODULES:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A URL of a database on the test server (used as the maintenance connection). The embedded server's
    data directory is a fresh one of this session's own, outside pytest's rotating temp folders (which a
    concurrent pytest run may delete) and readable by the server's system user; the server is stopped and
    the directory removed when the session ends (each run left about 400 MB in /tmp before)."""
    dsn = os.environ.get("AGENTDB_TEST_DSN")
    if dsn:
        yield dsn
        return
    data_dir = Path(tempfile.mkdtemp(prefix="agentdb-test-"))
    try:
        yield start_embedded(data_dir)
    finally:
        stop_embedded(data_dir, force=True)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def embedded_dir() -> Iterator[Path]:
    """A data directory of this test's own for an embedded server (outside pytest's rotating temp folders,
    like the session server's); whatever server the test leaves running there is stopped, and the directory
    removed, afterwards."""
    path = Path(tempfile.mkdtemp(prefix="agentdb-scratch-"))
    try:
        yield path
    finally:
        stop_embedded(path, force=True)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def template_url(server_url: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(TEMPLATE)))
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(TEMPLATE)))
    url = make_conninfo(server_url, dbname=TEMPLATE)
    with psycopg.connect(url) as conn:
        migrate(conn)
    return url


@pytest.fixture
def db_url(server_url: str, template_url: str) -> Iterator[str]:
    """A fresh, migrated database for one test; dropped afterwards."""
    name = f"agentdb_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("create database {} template {} strategy file_copy").format(
                sql.Identifier(name), sql.Identifier(TEMPLATE)
            )
        )
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A configured autocommit connection (pgvector, orjson) to the test's fresh database; agentdb's own
    `conn.transaction()` blocks are then real transactions, as in the CLI and the API."""
    with psycopg.connect(db_url, autocommit=True) as connection:
        configure(connection)
        yield connection


@pytest.fixture
def drop_principals(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Roles belong to the whole server, not to the test's database: delete every principal afterwards."""
    yield
    for p in list_principals(conn):
        delete_principal(conn, p.name)


@pytest.fixture(scope="session")
def embedder() -> Any:
    """The real bundled MiniLM embedder, loaded once."""
    from agentdb.embed import load_embedder

    return load_embedder()


def scifact_path() -> Path:
    if not (SCIFACT / "corpus.jsonl.gz").exists():
        pytest.skip(f"SciFact is not present at {SCIFACT}; the quality gates need ../shared/datasets/scifact")
    return SCIFACT


@pytest.fixture
def fake() -> Iterator[tuple[Any, str]]:
    """A fake Anthropic Messages API served on 127.0.0.1 (tests/fake_anthropic.py) and its base URL."""
    from fake_anthropic import FakeAnthropicAPI, serve

    api = FakeAnthropicAPI()
    with serve(api) as url:
        yield api, url


def without_autovacuum(conn: psycopg.Connection[Any]) -> None:
    """Turn autovacuum off for every table that exists now in `conn`'s database outside the system catalogs.
    A VACUUM frees a deleted row version, or marks a page all-visible, only once no transaction that may
    still see the old state is running, and an autovacuum ANALYZE holds such a snapshot while it samples a
    table: a test that asserts what a VACUUM of agentdb's achieved would then fail whenever one ran at the
    same moment (more often under load, when both take longer). The catalogs cannot be switched off; their
    ANALYZE samples a few hundred rows."""
    for schema, table in conn.execute(
        "select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where c.relkind in ('r', 'm') and n.nspname not in ('pg_catalog', 'information_schema')"
        " and n.nspname not like 'pg\\_toast%'"
    ).fetchall():
        conn.execute(
            sql.SQL("alter table {} set (autovacuum_enabled = false)").format(sql.Identifier(schema, table))
        )


def citus_source() -> Path:
    """The Citus source tarball the cluster tests build: AGENTDB_CITUS_SOURCE, else ../shared/vendor's."""
    from agentdb.db.citus import SOURCE_ENV

    return Path(os.environ.get(SOURCE_ENV) or CITUS_SOURCE)


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[Path]:
    """The data directory of a Citus coordinator with 2 workers, made by `agentdb start --workers 2` in a fresh
    directory of this session's own and stopped and removed afterwards. Citus is built from AGENTDB_CITUS_SOURCE
    (default: ../shared/vendor's tarball) once into AGENTDB_CITUS_CACHE (default: this checkout's
    .agentdb/citus), and reused by later sessions."""
    from agentdb.cli import main
    from agentdb.db.citus import CACHE_ENV, SOURCE_ENV

    source = citus_source()
    if not source.is_file():
        pytest.skip(f"no Citus source tarball at {source}: the cluster tests need one (set {SOURCE_ENV})")
    os.environ.setdefault(CACHE_ENV, str(Path(__file__).resolve().parents[1] / ".agentdb" / "citus"))
    data_dir = Path(tempfile.mkdtemp(prefix="agentdb-cluster-"))
    try:
        assert (
            main(["start", "--workers", "2", "--citus-source", str(source), "--data-dir", str(data_dir)]) == 0
        )
        yield data_dir
    finally:
        from agentdb.db.cluster import stop_workers

        stop_workers(data_dir)
        stop_embedded(data_dir, force=True)
        shutil.rmtree(data_dir, ignore_errors=True)
