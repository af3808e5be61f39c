-- Principals: API keys with the sources they may read, a row filter, a field grant and tool permissions.
-- Each principal also has its own NOLOGIN database role (agentdb_p_<database oid>_<id>) holding only the
-- grants it needs plus row-level security policies derived from its row filter; agentdb runs the
-- principal's reads under that role (sql/050_principals.sql, agentdb/auth.py).

create table agentdb.principals (
    id          int generated always as identity primary key,
    name        text not null unique check (name ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    -- "sha256$<salt hex>$<hex digest of salt || key>"; the key itself is shown once and never stored.
    key_hash    text not null,
    -- The first characters of the key, stored in clear to find the row and to tell keys apart in listings.
    key_prefix  text not null,
    -- Source names (agentdb.sources.name) the principal may read.
    tables      text[] not null default '{}',
    -- A filter (any syntax agentdb.compile_filter accepts) ANDed into every read; null = every row.
    row_filter  jsonb,
    -- Projectable fields ("title", "text" and metadata field names); null = all fields.
    fields      text[],
    tools       text[] not null default '{search}'
                check (tools <@ array['search', 'tree_search', 'graph_search', 'memory']),
    role        name not null unique,
    created_at  timestamptz not null default now()
);
create index principals_key_prefix_idx on agentdb.principals (key_prefix);

-- One row per (principal, source) it may read: the values of its compiled row filter for that source.
-- Policies read them through a per-principal SECURITY DEFINER function, so values never appear in policy
-- text (pg_policies is readable by every role) and the principal's role cannot read this table.
create table agentdb.principal_grants (
    principal_id int not null references agentdb.principals (id) on delete cascade,
    source_id    int not null,
    params       jsonb not null default '[]',
    primary key (principal_id, source_id)
);

-- Tables on which agentdb turned row-level security on; it turns it off again when the last principal
-- policy on them goes, so a registered table returns to the state its owner left it in.
create table agentdb.rls_tables (
    relid oid primary key
);

-- The postings reveal which chunk holds which term. Principal roles may read only the postings of the
-- sources they are granted (a restrictive policy per principal, see agentdb.principal_install); every
-- other role keeps the access its grants give it, including the writes the lexical triggers make.
alter table agentdb.postings enable row level security;
create policy agentdb_postings_all on agentdb.postings using (true) with check (true);
