-- Saved agents belong to the principal that created them (owner null: created without keys, in local
-- development). Names are unique per owner, so a name taken by someone else is neither a conflict nor a
-- way to learn that it exists; a principal's agents go with it.
alter table agentdb.saved_agents drop constraint saved_agents_pkey;
alter table agentdb.saved_agents
    add column owner_id int references agentdb.principals (id) on delete cascade;
create unique index saved_agents_owner_name_idx on agentdb.saved_agents (coalesce(owner_id, 0), name);
