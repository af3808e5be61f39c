-- 1.3: statements prepared once per backend (agentdb_accel_plans.c): agentdb.retrieve executes its statement
-- through execute_cached instead of PL/pgSQL's EXECUTE, which parsed, analysed and planned it on every call.
\echo Use "ALTER EXTENSION agentdb_accel UPDATE TO '1.3'" to load this file. \quit

-- The one row of `statement` with the values bound as $1..$n, prepared once per backend, planned once for all
-- values when generic_plan, else as plan_cache_mode chooses (the caller names the columns:
-- ... as t(a json, b bigint)). It runs with the caller's rights only, as if the caller had sent the statement:
-- every role may call it (principals' roles call agentdb.retrieve).
create function execute_cached(statement text, generic_plan boolean, variadic args "any") returns record
as 'MODULE_PATHNAME', 'agentdb_accel_execute_cached'
language c volatile;

-- This backend's prepared statements, the most recently executed first: how often each ran, the custom plans
-- built so far, whether a generic plan is kept, whether its queries are valid now, and the memory it holds.
create function cached_plans()
returns table (statement text, executions bigint, custom_plans bigint, generic_plan boolean, valid boolean,
               bytes bigint)
as 'MODULE_PATHNAME', 'agentdb_accel_cached_plans'
language c volatile;

grant usage on schema @extschema@ to public;
grant execute on function execute_cached(text, boolean, "any") to public;
revoke all on function cached_plans() from public;
