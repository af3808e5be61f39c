-- A saved agent's Retrieve step reads the source named in `source` (source kind "file", the default), or one
-- of its owner's memory stores by name (source kind "name"): `storage` is the store's name, which may be a
-- template over the run's variables (`user_{var.user_id}`), and `schema_name` the record schema the store
-- must have. Structural, like `source`: fixed when the agent is created.
alter table agentdb.saved_agents
    add column source_kind text not null default 'file',
    add column storage     text,
    add column schema_name text,
    alter column source drop not null,
    add constraint saved_agents_source_kind check (
        (source_kind = 'file' and source is not null and storage is null and schema_name is null)
        or (source_kind = 'name' and source is null and storage is not null and schema_name is not null)
    );
