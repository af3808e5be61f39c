"""Sources distributed by Citus: on a coordinator (a database with the citus extension), `agentdb migrate`
distributes the lexical index (`agentdb.postings`, by the document id each posting carries) and makes the
catalog reference tables (a copy on every node), and every document source created afterwards is distributed
by document id, co-located with the postings: a chunk and its postings live on one shard, so the lexical
leg's per-chunk sums and the filter's join run on each shard.

The BM25 statistics (`agentdb.term_stats`, `agentdb.corpus_stats`) are reference tables of the catalog: one
set for the whole source, so a document's score never depends on its shard. A distributed table cannot
have triggers, so the writer of a distributed source maintains its postings and statistics itself, in the
writing transaction (`agentdb_internal.lexical_write`, the same statements as the triggers); Citus commits
the transaction on every node it wrote with a two-phase commit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from agentdb.db.cluster import citus_version
from agentdb.errors import DatabaseSetupError

if TYPE_CHECKING:
    from agentdb.sources import Source

log = logging.getLogger(__name__)

# The column a source with a tenant field is distributed by on a coordinator: the field's value, written by the
# ingest pipeline (Citus cannot distribute by a generated column). Its postings carry the same value in their
# distribution column (`agentdb.postings.doc_id`), so they stay co-located with their chunks.
TENANT_COLUMN = "agentdb_tenant"

# Shards of the postings and of every source co-located with them (co-located tables share one shard
# count). A rebalance moves shards between nodes; it does not split them, so this bounds the useful nodes.
SHARD_COUNT = 8


def on_citus(conn: psycopg.Connection[Any]) -> bool:
    """Whether the connected database is a Citus coordinator (has the citus extension)."""
    return citus_version(conn) is not None


def _distributed(conn: psycopg.Connection[Any], table: str) -> bool:
    row = conn.execute(
        "select exists (select 1 from pg_dist_partition where logicalrelid = to_regclass(%s))", (table,)
    ).fetchone()
    return bool(row and row[0])


# The catalog, made reference tables in one transaction (their foreign keys tie them together: Citus turns the
# rest of the graph into coordinator-local Citus tables as soon as one of them is converted), each after the
# tables it references.
CATALOG = (
    "agentdb.sources",
    "agentdb.principals",
    "agentdb.indexes",
    "agentdb.term_stats",
    "agentdb.corpus_stats",
    "agentdb.edges",
    "agentdb.memory_stores",
    "agentdb.principal_grants",
    "agentdb.saved_agents",
)
# What Citus refuses on a reference table, replaced first: the catalog's two row triggers (sql/050, sql/080
# create them only without Citus), and the two policies with subqueries ("Subqueries are not supported in
# policies on distributed tables"). A principal's role may still read a memory store's catalog row only when
# it may read the store's table (the same test, without the subquery), and a source's corpus statistics when
# it may read the source's catalog row (the same test, in a function the policy calls).
_BEFORE_REFERENCE = (
    "drop trigger if exists principals_release_source on agentdb.sources",
    "drop trigger if exists memory_stores_dropped on agentdb.memory_stores",
    "drop policy agentdb_sources_read on agentdb.sources",
    "create policy agentdb_sources_read on agentdb.sources for select using ("
    " table_schema <> 'agentdb_memory' or left(current_user, 10) <> 'agentdb_p_'"
    " or coalesce(has_table_privilege(to_regclass(format('%I.%I', table_schema, table_name))::oid, 'SELECT'),"
    " false))",
    "drop policy agentdb_corpus_stats_read on agentdb.corpus_stats",
    "create policy agentdb_corpus_stats_read on agentdb.corpus_stats for select"
    " using (agentdb_internal.source_visible(source_id))",
)


def prepare(conn: psycopg.Connection[Any]) -> bool:
    """On a coordinator, once (True when done now): the postings distributed by document id, then the catalog
    made reference tables, in one transaction. A distributed table's unique indexes must hold its distribution
    column, so the postings' index becomes a plain one (a posting is unique by construction: the writers add a
    chunk's postings once), and it cannot have a foreign key with a cascade to a table that is not a reference
    table yet, so their foreign key to the catalog goes (dropping a source deletes its postings), and so does the
    posting blocks' (distribute_blocks distributes them)."""
    if not on_citus(conn) or _distributed(conn, "agentdb.sources"):
        return False
    with conn.transaction():
        # One connection per node for the whole transaction: it changes reference tables after a distributed one.
        conn.execute("set local citus.multi_shard_modify_mode to 'sequential'")
        conn.execute("alter table agentdb.postings drop constraint if exists postings_source_id_fkey")
        conn.execute(
            "alter table agentdb.posting_blocks drop constraint if exists posting_blocks_source_id_fkey"
        )
        conn.execute("drop index agentdb.postings_term_idx")
        conn.execute(
            "create index postings_term_idx on agentdb.postings (source_id, term, chunk_id) include (tf, dl)"
        )
        conn.execute(
            "select create_distributed_table('agentdb.postings', 'doc_id', shard_count => %s)", (SHARD_COUNT,)
        )
        for statement in _BEFORE_REFERENCE:
            conn.execute(statement)
        for table in CATALOG:
            conn.execute("select create_reference_table(%s)", (table,))
    log.info(
        "distributed agentdb.postings by doc_id over %d shards; the catalog is reference tables", SHARD_COUNT
    )
    return True


def ensure_shard_anchors(conn: psycopg.Connection[Any]) -> None:
    """On a coordinator, once: `agentdb.shard_anchors`, one row on every shard of the postings' co-location group
    (a key that hashes to that shard), so that a statement over it runs a function once on each shard, on the
    worker holding it, which finds that shard's postings and rows from the key
    (agentdb_internal.shard_maxscore: the lexical leg's MaxScore per shard). A rebalance moves each row with
    its shard; the shards are never split (SHARD_COUNT)."""
    if not on_citus(conn) or _distributed(conn, "agentdb.shard_anchors"):
        return
    with conn.transaction():
        conn.execute("set local citus.multi_shard_modify_mode to 'sequential'")
        conn.execute("create table agentdb.shard_anchors (key text primary key)")
        conn.execute("grant select on agentdb.shard_anchors to public")  # principals' roles read it too
        conn.execute(
            "select create_distributed_table('agentdb.shard_anchors', 'key', colocate_with => 'agentdb.postings')"
        )
        # The first key that hashes to each shard, of 'shard_1', 'shard_2', ...: 1,000 leave none of 8 out
        # but with odds below 1e-57.
        conn.execute(
            "insert into agentdb.shard_anchors (key) select key from agentdb_internal.shard_anchor_keys()"
        )
        row = conn.execute(
            "select (select count(*) from agentdb.shard_anchors),"
            " (select count(*) from pg_dist_shard where logicalrelid = 'agentdb.postings'::regclass)"
        ).fetchone()
        assert row is not None and row[0] == row[1], row


def distribute_blocks(conn: psycopg.Connection[Any]) -> None:
    """On a coordinator, once: `agentdb.posting_blocks` distributed by its shard_key, co-located with the postings
    (migrations/0027_block_shard_key.sql). A block holds chunks of one shard and carries that shard's anchor key
    (agentdb_internal.shard_anchor_keys), so the lexical leg reads a shard's blocks on the worker holding its
    chunks. Its primary key takes the shard key (a distributed table's unique indexes hold its distribution
    column), last: within a shard the key is one value, so the blocks keep their order. A coordinator made
    before this kept the blocks as a reference table, always empty there (its sources kept rows): it is made a
    local table again first, without its foreign key to the catalog, which Citus refuses to undo."""
    if not on_citus(conn):
        return
    row = conn.execute(
        "select partmethod from pg_dist_partition where logicalrelid = 'agentdb.posting_blocks'::regclass"
    ).fetchone()
    if row is not None and row[0] == "h":
        return
    with conn.transaction():
        conn.execute("set local citus.multi_shard_modify_mode to 'sequential'")
        conn.execute(
            "alter table agentdb.posting_blocks drop constraint if exists posting_blocks_source_id_fkey"
        )
        if row is not None:
            held = conn.execute("select exists (select 1 from agentdb.posting_blocks)").fetchone()
            if held != (False,):
                raise DatabaseSetupError(
                    "agentdb.posting_blocks holds blocks on this coordinator, where only distributed sources"
                    " keep postings; they cannot be distributed by shard",
                    hint="move the sources that keep blocks to the row layout"
                    " (`agentdb optimize NAME --layout rows`), then run `agentdb migrate` again",
                )
            conn.execute("select undistribute_table('agentdb.posting_blocks')")
        conn.execute("alter table agentdb.posting_blocks drop constraint posting_blocks_pkey")
        conn.execute(
            "alter table agentdb.posting_blocks add constraint posting_blocks_pkey"
            " primary key (source_id, term, first_chunk, shard_key) include (last_chunk, max_tf, min_dl)"
        )
        conn.execute(
            "select create_distributed_table('agentdb.posting_blocks', 'shard_key',"
            " colocate_with => 'agentdb.postings')"
        )
    log.info("distributed agentdb.posting_blocks by shard, co-located with the postings")


def carry_retrieve_settings(conn: psycopg.Connection[Any]) -> None:
    """On a coordinator: the settings `agentdb.retrieve` runs under (its SET clauses: the HNSW iterative scan and
    its limits, jit, work_mem) made this database's defaults, which Citus carries to every worker. A function's
    SET clauses stay on the coordinator, so without them the statements it sends to the shards ran with the
    workers' defaults (an HNSW scan without iterative scan returns at most ef_search rows a shard)."""
    if not on_citus(conn):
        return
    row = conn.execute(
        "select proconfig from pg_proc where proname = 'retrieve' and pronamespace = 'agentdb'::regnamespace"
    ).fetchone()
    database = conn.execute("select current_database()").fetchone()
    assert row is not None and database is not None
    held = conn.execute(
        "select coalesce(setconfig, '{}') from pg_db_role_setting"
        " where setrole = 0 and setdatabase = (select oid from pg_database where datname = current_database())"
    ).fetchone()
    # Already the defaults: nothing is sent (ALTER DATABASE reaches every worker, and one may be down).
    for item in set(row[0] or []) - set(held[0] if held else []):
        name, _, value = item.partition("=")
        conn.execute(
            sql.SQL("alter database {} set {} = {}").format(
                sql.Identifier(database[0]),
                sql.SQL(".").join(sql.Identifier(part) for part in name.split(".")),
                sql.Literal(value),
            )
        )


def routed_by_tenant(source: Source) -> bool:
    """Whether `source` is distributed by its tenant field (a coordinator's document source with one)."""
    return source.distributed and source.tenant_field is not None


def tenant_of(source: Source, metadata: dict[str, Any]) -> str | None:
    """A document's tenant under `source`'s tenant field: the field's value when it is a non-empty string,
    else None (such a document is refused: ingest's check)."""
    assert source.tenant_field is not None
    value = metadata.get(source.tenant_field)
    return value if isinstance(value, str) and value else None


def _constraint(conn: psycopg.Connection[Any], source: Source, kind: str) -> sql.Identifier:
    """The name of `source`'s table's one constraint of kind `kind` (p: primary key, u: unique)."""
    row = conn.execute(
        "select conname from pg_constraint where conrelid = format('%%I.%%I', %s::text, %s::text)::regclass"
        " and contype = %s",
        (source.table_schema, source.table_name, kind),
    ).fetchone()
    assert row is not None
    return sql.Identifier(row[0])


def distribute_source(conn: psycopg.Connection[Any], source: Source) -> None:
    """Distribute a new (empty) document source's table, co-located with the postings, in the caller's
    transaction (which inserted its catalog row with `distributed` true): by doc_id, or by its tenant column
    when it has a tenant field. Citus needs the distribution column in every unique constraint: the primary
    key becomes (doc_id, agentdb_chunk_id), or (agentdb_tenant, agentdb_chunk_id) with the (doc_id, chunk)
    constraint widened to (agentdb_tenant, doc_id, chunk) and a plain index on (doc_id, chunk) for the reads
    and deletes by document (the identity still hands out chunk ids on the coordinator), with an index on the
    chunk id for the reads by chunk. A tenant source's document id is then unique per tenant in the database;
    the writer keeps it unique in the source by deleting a document's chunks by id, on every shard, before it
    writes them (two writers racing over one id under different tenants could leave both)."""
    table = source.table
    key = TENANT_COLUMN if routed_by_tenant(source) else "doc_id"
    # Constraints by the names PostgreSQL chose and indexes named by it (a long table name is shortened in them,
    # so names made here from the table's could exceed 63 bytes and, cut there, collide).
    conn.execute(sql.SQL("alter table {} drop constraint {}").format(table, _constraint(conn, source, "p")))
    conn.execute(
        sql.SQL("alter table {} add primary key ({}, agentdb_chunk_id)").format(table, sql.Identifier(key))
    )
    if key == TENANT_COLUMN:
        conn.execute(
            sql.SQL("alter table {} drop constraint {}").format(table, _constraint(conn, source, "u"))
        )
        conn.execute(
            sql.SQL("alter table {} add unique ({}, doc_id, chunk)").format(table, sql.Identifier(key))
        )
        conn.execute(sql.SQL("create index on {} (doc_id, chunk)").format(table))
    conn.execute(sql.SQL("create index on {} (agentdb_chunk_id)").format(table))
    conn.execute(
        "select create_distributed_table(format('%%I.%%I', %s::text, %s::text), %s,"
        " colocate_with => 'agentdb.postings')",
        (source.table_schema, source.table_name, key),
    )
