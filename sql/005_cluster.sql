-- What the functions of sql/ need to know of the server they run on: whether it is a Citus coordinator
-- (agentdb/db/distribute.py distributes the sources there and makes the catalog reference tables).

-- Whether Citus is installed in this database.
create or replace function agentdb_internal.on_citus() returns boolean
language sql stable as $$ select exists (select 1 from pg_extension where extname = 'citus') $$;

-- Row trigger `name` after delete on catalog table `tbl`, running trigger function `fn`: not on a Citus
-- coordinator, whose catalog tables are reference tables, which cannot have triggers (there the writer does
-- the trigger's work).
create or replace function agentdb_internal.catalog_delete_trigger(name text, tbl regclass, fn regprocedure)
returns void language plpgsql as $$
begin
    if not agentdb_internal.on_citus() then
        execute format('create or replace trigger %I after delete on %s for each row execute function %s',
                       name, tbl, fn);
    end if;
end;
$$;

-- The anchor key of each shard of the postings' co-location group, by the shard's id in agentdb.postings: of the
-- keys 'shard_1' .. 'shard_1000', the first in text order that hashes to that shard. agentdb.shard_anchors holds
-- them (agentdb/db/distribute.py), and every posting block of a shard carries its anchor as shard_key. A
-- coordinator's only (PL/pgSQL: Citus's function is not known on one node when this is created).
create or replace function agentdb_internal.shard_anchor_keys() returns table (shard bigint, key text)
language plpgsql stable as $$
begin
    return query
        select distinct on (k.shard) k.shard, k.key
        from (select get_shard_id_for_distribution_column('agentdb.postings', 'shard_' || i) as shard, 'shard_' || i as key
              from generate_series(1, 1000) i) k
        order by k.shard, k.key;
end;
$$;

-- The shard of distributed table `tbl` that distribution value `key` hashes to (an anchor key of
-- agentdb.shard_anchors, say), as its relation's name on the node that holds it (schema.table_shardid, quoted
-- as needed). A coordinator's and its workers' only (PL/pgSQL, as above).
create or replace function agentdb_internal.shard_of(tbl regclass, key text) returns text
language plpgsql stable as $$
begin
    return shard_name(tbl, get_shard_id_for_distribution_column(tbl, key));
end;
$$;
