"""Apply `migrations/NNNN_slug.sql` once each, in order, then re-apply the stored functions in `sql/`."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from typing import Any

import psycopg
from psycopg import sql

from agentdb.db.cluster import citus_version
from agentdb.db.distribute import carry_retrieve_settings, distribute_blocks, ensure_shard_anchors
from agentdb.db.distribute import prepare as prepare_distribution
from agentdb.db.pool import check_connection
from agentdb.errors import DatabaseSetupError
from agentdb.resources import MIGRATIONS, SQL, sql_files

log = logging.getLogger(__name__)

# A fixed advisory lock key so that a second migrator waits instead of racing the first.
MIGRATION_LOCK_KEY = 0x6167_6462  # "agdb"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Traversable


def discover(package: str = MIGRATIONS) -> list[Migration]:
    found = []
    for path in sql_files(package):
        match = _NAME.match(path.name)
        if not match:
            raise ValueError(f"migration file name must look like 0001_slug.sql: {path.name}")
        found.append(Migration(int(match.group(1)), match.group(2), path))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError("two migrations share a version number")
    return found


def migrate(conn: psycopg.Connection[Any]) -> list[int]:
    """Bring the database up to date; return the versions applied now (empty when already current)."""
    conn.autocommit = True
    check_connection(conn)
    require_citus_version(conn)
    conn.execute("select pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        # Only when missing: on a Citus coordinator even a `create ... if not exists` of an existing object is
        # sent to every worker, so an up-to-date database would fail to open while a worker is down.
        tracked = conn.execute(
            "select to_regclass('agentdb.schema_migrations') is not null"
            " and to_regclass('agentdb.schema_functions') is not null"
        ).fetchone()
        if tracked != (True,):
            with conn.transaction():
                _create_tracking_tables(conn)
        done = {row[0] for row in conn.execute("select version from agentdb.schema_migrations")}
        applied = []
        for migration in discover():
            if migration.version in done:
                continue
            log.info("applying migration %04d_%s", migration.version, migration.name)
            with conn.transaction():
                # One query string: on a Citus coordinator, whose catalog tables are reference tables, Citus sends
                # a DDL statement's whole query string to the workers, so a migration that alters them runs its
                # statements from a DO block, where each reaches the workers alone (migrations/0026).
                conn.execute(migration.path.read_text())
                conn.execute(
                    "insert into agentdb.schema_migrations (version, name) values (%s, %s)",
                    (migration.version, migration.name),
                )
            applied.append(migration.version)
        # The stored functions are re-created only when they or the tables changed: re-creating them under
        # a running server (a second agentdb starting, a failover check) fails the statements that other
        # sessions, on this server or its replicas, are running with them ("cache lookup failed").
        row = conn.execute("select digest from agentdb.schema_functions").fetchone()
        if not applied and row is not None and row[0] == functions_digest() and not _accel_behind(conn):
            if prepare_distribution(conn):
                _create_functions(conn)
            carry_retrieve_settings(conn)
            ensure_shard_anchors(conn)
            distribute_blocks(conn)
            return applied
        _create_functions(conn)
        if prepare_distribution(conn):
            # Citus made some catalog tables reference tables by renaming each to its shard on the coordinator
            # (`agentdb.indexes_102019`) under a new table of the old name, so the functions created above
            # with parameters or results of their row types now name the shards' types (a call with the
            # catalog's own row type matched no function). Created again, they name the catalog's.
            _create_functions(conn)
        carry_retrieve_settings(conn)
        ensure_shard_anchors(conn)
        distribute_blocks(conn)
        return applied
    finally:
        conn.execute("select pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


def _create_functions(conn: psycopg.Connection[Any]) -> None:
    """(Re)create the stored functions of sql/, in one transaction, and record their digest."""
    # Load pgvector in this session first: a function's `SET hnsw.*` clause needs the library's parameters to be
    # known when the caller is not a superuser.
    conn.execute("select '[1]'::vector")
    with conn.transaction():
        for path in sql_files(SQL):
            text = path.read_text()
            drop_overloads(conn, text)
            conn.execute(text)
        conn.execute(
            "insert into agentdb.schema_functions (digest) values (%s)"
            " on conflict (singleton) do update set digest = excluded.digest, applied_at = now()",
            (functions_digest(),),
        )


# A stored function that a file of sql/ defines (its schema and name); functions whose names are made at run
# time (a principal's, through format) are not matched.
_DEFINES = re.compile(r"create\s+(?:or\s+replace\s+)?function\s+(agentdb(?:_internal)?)\.(\w+)\s*\(", re.I)


def drop_overloads(conn: psycopg.Connection[Any], text: str) -> None:
    """Before a file of sql/ runs, drop every signature of the functions it defines: `create or replace`
    cannot change a function's parameters or return type, and with new parameters it would leave the older
    overload behind and make calls ambiguous. A function that something holds (a trigger, a policy, an index
    or a view: a dependency in pg_depend) is kept and only replaced, as what holds it names its signature."""
    defined = _DEFINES.findall(text)
    if not defined:
        return
    stale = conn.execute(
        "select p.oid::regprocedure::text from pg_proc p"
        " join pg_namespace n on n.oid = p.pronamespace"
        " join unnest(%s::text[], %s::text[]) d(schema_name, function_name)"
        "   on d.schema_name = n.nspname and d.function_name = p.proname"
        " where not exists (select 1 from pg_depend x"
        "                   where x.refclassid = 'pg_proc'::regclass and x.refobjid = p.oid and x.deptype = 'n')",
        ([schema for schema, _ in defined], [name for _, name in defined]),
    ).fetchall()
    for (signature,) in stale:  # regprocedure's text: the qualified, quoted name and argument types
        conn.execute(sql.SQL("drop function {}").format(sql.SQL(signature)))


def _create_tracking_tables(conn: psycopg.Connection[Any]) -> None:
    conn.execute("create schema if not exists agentdb")
    conn.execute(
        "create table if not exists agentdb.schema_migrations ("
        " version int primary key, name text not null,"
        " applied_at timestamptz not null default now())"
    )
    conn.execute(
        "create table if not exists agentdb.schema_functions ("
        " singleton boolean primary key default true check (singleton), digest text not null,"
        " applied_at timestamptz not null default now())"
    )


def _accel_behind(conn: psycopg.Connection[Any]) -> bool:
    """Whether this database holds the accelerator at a version older than the server offers now (a build that
    came after the functions were created): the sql/ files update it, so they run again."""
    row = conn.execute(
        "select string_to_array(installed_version, '.')::int[] < string_to_array(default_version, '.')::int[]"
        " from pg_available_extensions where name = 'agentdb_accel' and installed_version is not null"
    ).fetchone()
    return bool(row and row[0])


def functions_digest(package: str = SQL) -> str:
    """A digest of the stored functions' source (sql/*.sql), recorded by `migrate`."""
    digest = hashlib.sha256()
    for path in sql_files(package):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def require_current(conn: psycopg.Connection[Any]) -> None:
    """DatabaseSetupError unless every migration and the current stored functions are applied: commands
    that only read or manage principals do not change the schema (a read-only role can run them, and they
    never wait behind a migration lock); they say what to run instead."""
    hint = "run `agentdb migrate` (with a role that may change the schema), then retry"
    if conn.execute("select to_regclass('agentdb.schema_functions')").fetchone() == (None,):
        raise DatabaseSetupError("the database has no agentdb schema yet, or an older one", hint=hint)
    done = {row[0] for row in conn.execute("select version from agentdb.schema_migrations")}
    missing = [f"{m.version:04d}_{m.name}" for m in discover() if m.version not in done]
    if missing:
        raise DatabaseSetupError(f"the database lacks migrations {', '.join(missing)}", hint=hint)
    row = conn.execute("select digest from agentdb.schema_functions").fetchone()
    if row is None or row[0] != functions_digest():
        raise DatabaseSetupError("the database's stored functions are not this agentdb's", hint=hint)


# The first Citus release for PostgreSQL 18, and the one agentdb is tested with on a cluster.
MIN_CITUS_VERSION = (14, 0)


def require_citus_version(conn: psycopg.Connection[Any]) -> None:
    """On a database with the citus extension, DatabaseSetupError unless it is MIN_CITUS_VERSION or later."""
    version = citus_version(conn)
    if version is None:
        return
    found = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if found < MIN_CITUS_VERSION:
        wanted = ".".join(map(str, MIN_CITUS_VERSION))
        raise DatabaseSetupError(
            f"this database has Citus {version}; agentdb needs Citus {wanted} or later on a cluster",
            hint=f"upgrade Citus on every node (ALTER EXTENSION citus UPDATE after installing {wanted}+)",
        )
