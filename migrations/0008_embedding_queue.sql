-- The embedding queue of registered tables: rows whose agentdb_embedding is null (new rows, and rows whose
-- text changed: agentdb.clear_stale_embedding) are found through a partial index and embedded by the server.
do $$
declare
    src record;
begin
    for src in select id, table_schema, table_name from agentdb.sources where kind = 'table' loop
        if to_regclass(format('%I.%I', src.table_schema, src.table_name)) is not null then
            execute format('create index if not exists %I on %I.%I (agentdb_chunk_id) where agentdb_embedding is null',
                           'agentdb_pending_' || src.id, src.table_schema, src.table_name);
        end if;
    end loop;
end;
$$;
