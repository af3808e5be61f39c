-- Hierarchy and graph indexes over a source (sql/070_indexes.sql): the declared indexes and their edges.
-- The source id leads every key, so both tables can be distributed by source with the source tables.
create table agentdb.indexes (
    source_id  int not null references agentdb.sources (id) on delete cascade,
    id         int generated always as identity,
    name       text not null check (name ~ '^[a-z][a-z0-9_]{0,62}$'),
    kind       text not null check (kind in ('tree', 'graph')),
    -- The metadata field (a column of a registered table) whose values give the edges, kept current by the
    -- source's statement triggers; null for an index of explicit edges (loaded from a file or posted).
    field      text,
    -- The type of the derived edges; for explicit edges, the type of an edge given without one.
    edge_type  text not null check (edge_type ~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,62}$'),
    created_at timestamptz not null default now(),
    primary key (source_id, id),
    unique (source_id, name)
);

-- One row per edge; keys are document ids (a registered table's id column as text). The primary key serves
-- outgoing edges (children of a tree node), edges_in_idx incoming ones (a tree node's parent).
create table agentdb.edges (
    source_id int not null,
    index_id  int not null,
    from_key  text not null,
    edge_type text not null,
    to_key    text not null,
    weight    float8 not null default 1 check (weight > '-Infinity' and weight < 'Infinity'),
    metadata  jsonb not null default '{}',
    primary key (source_id, index_id, from_key, edge_type, to_key),
    foreign key (source_id, index_id) references agentdb.indexes (source_id, id) on delete cascade
);
create index edges_in_idx on agentdb.edges (source_id, index_id, to_key, edge_type, from_key) include (weight);

-- Principals' roles read edges only through agentdb.neighbors, which keeps the keys they may read.
revoke all on agentdb.indexes, agentdb.edges from public;
