-- Ordinary chunk texts kept in their rows beside the vector: toast_tuple_target = the vector plus 1.5 kB on
-- every existing source table (new ones get it from agentdb_internal.store_rows_inline, which says why). Rows
-- keep their layout until they are written again: `VACUUM FULL` on a source's table moves existing texts in.
-- (A source whose table is gone is skipped, as in 0018.)
do $$
declare
    t record;
begin
    for t in select s.table_schema, s.table_name, s.embedding_dim from agentdb.sources s
             join pg_attribute a on a.attrelid = to_regclass(format('%I.%I', s.table_schema, s.table_name))
                                and a.attname = 'agentdb_embedding' and not a.attisdropped
    loop
        execute format('alter table %I.%I set (toast_tuple_target = %s)',
                       t.table_schema, t.table_name, least(8160, 4 * t.embedding_dim + 8 + 1536));
    end loop;
end;
$$;
