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
