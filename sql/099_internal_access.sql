-- Applied last on every migrate: the functions of agentdb_internal (dropped and created again by the files
-- before this one) are executable by agentdb itself and by the principal roles it reads under, not by
-- PUBLIC. A database role that calls agentdb's SQL functions directly (an analyst's login) needs the same:
--   grant usage on schema agentdb_internal to analyst;
--   grant execute on all functions in schema agentdb_internal to analyst;
do $$
declare
    p record;
begin
    revoke execute on all functions in schema agentdb_internal from public;
    for p in select pr.role from agentdb.principals pr join pg_roles r on r.rolname = pr.role loop
        execute format('grant usage on schema agentdb_internal to %I', p.role);
        execute format('grant execute on all functions in schema agentdb_internal to %I', p.role);
    end loop;
end;
$$;
