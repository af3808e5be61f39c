-- Memory stores (sql/080_memory.sql, agentdb/memory/): named stores of records written at run time, each with
-- its own entity graph. A store's records table is a document source (registered in agentdb.sources as
-- agentdb_mem_<id>), so the lexical triggers, the HNSW index, agentdb.read and agentdb.retrieve serve it as
-- they serve any source; its entities, relations and mentions are three more tables of the store's own. All of
-- a store's tables live in schema agentdb_memory and are named s<id>_<what>.
--
-- A store belongs to its owner: the principal that wrote it (owner = the principal's id), or the application
-- itself (owner null: local use, the CLI). Names are per owner, so two principals may each have a store
-- called `notes` and neither can learn that the other's exists. The owner's database role alone is granted
-- its tables (agentdb.memory_grant); other principals' roles have no privilege on them at all.
create schema agentdb_memory;
revoke all on schema agentdb_memory from public;

create table agentdb.memory_stores (
    id            int generated always as identity primary key,
    -- The owning principal, or null for the application. A principal's stores go with it.
    owner         int references agentdb.principals (id) on delete cascade,
    name          text not null check (name ~ '^[a-z][a-z0-9_]{0,62}$'),
    -- The source of the records table; dropping that source drops the store.
    source_id     int not null unique references agentdb.sources (id) on delete cascade,
    -- The name of the record schema the store was created with (Retrieve's `schema`), if one was given.
    schema_name   text check (schema_name ~ '^[a-z][a-z0-9_]{0,62}$'),
    -- Predicates that hold one object per subject at a time: a new relation closes the current one.
    single_valued text[] not null default '{}',
    created_at    timestamptz not null default now()
);
create unique index memory_stores_owner_name_idx on agentdb.memory_stores (coalesce(owner, 0), name);
create index memory_stores_owner_idx on agentdb.memory_stores (owner);
-- Principals' roles resolve their own stores through agentdb_internal.memory_store (a lookup by name, never
-- a listing).
revoke all on agentdb.memory_stores from public;

-- Another principal's store must not even be listed or counted at the database level: the catalog rows of a
-- memory store's source (and its corpus statistics) are visible to a principal's role only when that role may
-- read the store's table, i.e. when it owns the store. Everything else stays as visible as before; the table
-- owner (agentdb itself) bypasses row security as usual.
alter table agentdb.sources enable row level security;
create policy agentdb_sources_read on agentdb.sources for select using (
    table_schema <> 'agentdb_memory'
    or left(current_user, 10) <> 'agentdb_p_'
    or coalesce(has_table_privilege((select c.oid from pg_catalog.pg_class c
                                     join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                                     where n.nspname = sources.table_schema and c.relname = sources.table_name),
                                    'SELECT'), false));
create policy agentdb_sources_insert on agentdb.sources for insert with check (true);
create policy agentdb_sources_update on agentdb.sources for update using (true) with check (true);
create policy agentdb_sources_delete on agentdb.sources for delete using (true);

alter table agentdb.corpus_stats enable row level security;
create policy agentdb_corpus_stats_read on agentdb.corpus_stats for select using (
    exists (select 1 from agentdb.sources s where s.id = corpus_stats.source_id));
create policy agentdb_corpus_stats_insert on agentdb.corpus_stats for insert with check (true);
create policy agentdb_corpus_stats_update on agentdb.corpus_stats for update using (true) with check (true);
create policy agentdb_corpus_stats_delete on agentdb.corpus_stats for delete using (true);
