-- Saved retrieval agents: the Retrieve step of seeds 000/001 as a named resource.
create table agentdb.saved_agents (
    name        text primary key check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'),
    -- Structural parameters, fixed at creation.
    source      text not null,
    input       text not null default '',
    -- Mutable parameters: filter, top_k, threshold, retrieval_mode, rrf_k.
    params      jsonb not null,
    created_at  timestamptz not null default now(),
    updated_at  timestamptz not null default now()
);
