-- Vectors stored in their rows (storage main) instead of out of line in TOAST (pgvector's default, external):
-- the dense leg reads the vector of every row it returns to compute its distance, and the TOAST read cost as
-- much as the HNSW step itself (SciFact, 400 candidates a leg: 6.4 ms against 4.6 ms inline). New sources are
-- created this way (agentdb.sources, sql/080_memory.sql); this sets every existing source's column. Rows keep
-- their storage until they are written again: `VACUUM FULL` on a source's table moves its existing vectors in.
-- (A source whose table is gone is skipped, not an error that would stop every later migration.)
do $$
declare
    t record;
begin
    for t in select s.table_schema, s.table_name from agentdb.sources s
             join pg_attribute a on a.attrelid = to_regclass(format('%I.%I', s.table_schema, s.table_name))
                                and a.attname = 'agentdb_embedding' and not a.attisdropped
    loop
        execute format('alter table %I.%I alter column agentdb_embedding set storage main', t.table_schema, t.table_name);
    end loop;
end;
$$;
