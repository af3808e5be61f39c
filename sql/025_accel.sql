-- The accelerated lexical leg: agentdb's own C extension (ext/, agentdb_accel) computes the exact BM25 top k
-- over the same postings the plain SQL path reads, with the weights and statistics the SQL side passes it;
-- these wrappers choose the path and apply the query's filters. Both paths return the same chunks and scores.

-- Create the extension where the server offers it (agentdb/db/accel.py builds and configures it for the
-- embedded server), or update it to the version the server offers. A server that offers it but cannot load
-- it, or a role that may not create it, keeps the plain SQL path: the warning says why, and the migration
-- goes on.
do $$
declare
    x record;
begin
    select default_version, installed_version into x from pg_available_extensions where name = 'agentdb_accel';
    if x.default_version is not null and x.installed_version is distinct from x.default_version then
        begin
            if x.installed_version is null then
                create extension agentdb_accel;
            else
                alter extension agentdb_accel update;
            end if;
        exception when others then
            raise warning 'agentdb_accel is not loaded, lexical retrieval uses the plain SQL path: %', sqlerrm;
        end;
    end if;
end;
$$;

-- The path the current session's lexical legs take on a source in the block layout (a source in the row
-- layout always takes the plain SQL path, sql/040_retrieve.sql): 'accel' when the extension is installed and
-- its caller may call it, and the setting agentdb.lexical_path is not 'sql' (AGENTDB_LEXICAL_PATH=sql writes
-- it into the embedded server's configuration); else 'sql'. The caller is the current role, or for a
-- principal's role the owner of agentdb_internal.principal_bm25_topk (the role migrating now, which drops and
-- re-creates it: agentdb.db.migrate.drop_overloads; written in
-- below), through which principals reach the cursor. It runs on every retrieve: one index probe of pg_proc
-- (a name lookup such as to_regproc would need the role's USAGE of the schema, which principals lack) and the
-- privilege checks.
do $$
begin
    execute format($f$
create or replace function agentdb_internal.lexical_path() returns text
language sql stable as $b$
select case when coalesce(current_setting('agentdb.lexical_path', true), '') = 'sql' or p is null
                 or not agentdb_internal.accel_current() then 'sql'
            when left(current_user, 10) = 'agentdb_p_'
            then case when has_function_privilege(%1$L, p, 'execute')
                           and has_schema_privilege(%1$L, 'agentdb_accel', 'usage') then 'accel' else 'sql' end
            when has_function_privilege(p, 'execute') and has_schema_privilege('agentdb_accel', 'usage')
            then 'accel'
            else 'sql' end
from (select (select x.oid from pg_catalog.pg_proc x
               where x.proname = 'bm25_topk' and x.pronamespace = to_regnamespace('agentdb_accel')
                 and x.pronargs = 11) as p) f
$b$ $f$, current_user);
end;
$$;

-- A principal's way to the C cursor: the best `cand` chunks by (score desc, chunk id) among those of block
-- source `source_id` that the active principal may read, scored as agentdb_accel.bm25_topk scores (whose
-- arguments it takes). The cursor reads every chunk's postings and principals' roles may not read the blocks,
-- so it runs with its owner's rights and keeps the chunks that pass the principal's policy predicate
-- (agentdb.principal_block_predicate, the one the SQL path's agentdb_internal.principal_block_postings
-- applies): a prefix of the cursor's order, so when cand of them pass, or the cursor returned every chunk it
-- has, they are the exact answer; otherwise k grows eightfold and the cursor runs again. Nothing for anyone
-- else. With `shard_anchor`, on a Citus worker: of the shard of a distributed source that anchor key hashes to
-- (agentdb_internal.shard_maxscore), its blocks and rows read directly; the shards are found from the key and
-- the catalog, never named by the caller.
create or replace function agentdb_internal.principal_bm25_topk(
    source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[], min_dls int[],
    max_spans bigint[], cand int, avgdl float8, k1 float8, b float8, shard_anchor text default null
) returns table (cid bigint, bm25 float8)
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
declare
    v record;
    k int := cand;
    ids bigint[];
    scores float8[];
    kept_ids bigint[];
    kept_scores float8[];
    docs text;
begin
    select * into v from agentdb.principal_block_predicate(principal_bm25_topk.source_id);
    if v.pred is null then
        return;
    end if;
    if shard_anchor is not null then
        docs := agentdb_internal.shard_of(v.rel::regclass, shard_anchor);
        v.pred := replace(v.pred, v.rel, docs);
        v.rel := docs;
    end if;
    loop
        if shard_anchor is null then
            select coalesce(array_agg(t.cid), '{}'), coalesce(array_agg(t.bm25), '{}') into ids, scores
            from agentdb_accel.bm25_topk(principal_bm25_topk.source_id, terms, weights, dfs, max_tfs, min_dls,
                                         max_spans, k, avgdl, k1, b) t;
        else
            select coalesce(array_agg(t.cid), '{}'), coalesce(array_agg(t.bm25), '{}') into ids, scores
            from agentdb_accel.bm25_topk(principal_bm25_topk.source_id, terms, weights, dfs, max_tfs, min_dls,
                                         max_spans, k, avgdl, k1, b,
                                         agentdb_internal.shard_of('agentdb.posting_blocks', shard_anchor)::regclass) t;
        end if;
        exit when v.pred = 'true';
        -- The source table keeps its name (no alias): the predicate refers to its columns as schema.table.column.
        execute format($q$
            select coalesce(array_agg(x.chunk_id order by x.known desc, x.chunk_id), '{}'),
                   coalesce(array_agg(x.known order by x.known desc, x.chunk_id), '{}')
            from (select s.chunk_id, s.known from unnest($1::bigint[], $2::float8[]) as s(chunk_id, known)
                  join %1$s on %1$s.agentdb_chunk_id = s.chunk_id where %2$s
                  order by s.known desc, s.chunk_id limit $3) x $q$, v.rel, v.pred)
            into kept_ids, kept_scores using ids, scores, cand;
        exit when cardinality(kept_ids) >= cand or cardinality(ids) < k or k > 2^27;
        k := k * 8;
    end loop;
    return query select u.cid, u.bm25
                 from unnest(case when v.pred = 'true' then ids else kept_ids end,
                             case when v.pred = 'true' then scores else kept_scores end) as u(cid, bm25);
end;
$$;

-- The lexical leg of agentdb.retrieve on the accelerated path, for a source in the block layout: the exact
-- BM25 top `cand` of the query terms (with their weights and statistics, as agentdb_internal.bm25_maxscore
-- takes them) among the chunks that pass `filter_sql` ('' or a join and where clause on alias s, with
-- retrieve's parameter positions: $5 filter, $6 row filter, $14 excluded document, $17 filter_query, $18
-- exclusion_query). The C cursor (for a principal's role, agentdb_internal.principal_bm25_topk) returns the
-- best k chunks of all that hold a term (that the principal may read), in order (score desc, chunk id); the
-- filter keeps a prefix of that order, so when cand of them pass, or the cursor returned every chunk it has,
-- they are the exact answer; otherwise k grows eightfold and the cursor runs again. A filter is checked on
-- candidates, never compiled into the cursor: the same predicate, row security and column grants as the SQL
-- path, whatever the filter holds, at the cost of a rerun when it keeps few of the best chunks. With
-- `shard_anchor`, on a Citus worker (agentdb_internal.shard_maxscore), the cursor reads the shard of
-- agentdb.posting_blocks that anchor key hashes to, and a principal's the shard of its rows too.
create or replace function agentdb_internal.bm25_accel(
    source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[], min_dls int[],
    max_spans bigint[], cand int, avgdl float8, k1 float8, b float8,
    filter_sql text, filter_params jsonb, row_params jsonb, exclude_doc text, fq_params jsonb, ex_params jsonb,
    shard_anchor text default null
) returns table (cid bigint, bm25 float8)
language plpgsql stable as $$
declare
    principal constant boolean := left(current_user, 10) = 'agentdb_p_';
    blocks constant regclass := case when shard_anchor is not null
                                     then agentdb_internal.shard_of('agentdb.posting_blocks', shard_anchor) end;
    k int := cand;
    ids bigint[];
    scores float8[];
    kept_ids bigint[];
    kept_scores float8[];
    keep constant text := format($q$
        select coalesce(array_agg(x.chunk_id order by x.known desc, x.chunk_id), '{}'),
               coalesce(array_agg(x.known order by x.known desc, x.chunk_id), '{}')
        from (select s.chunk_id, s.known from unnest($1::bigint[], $2::float8[]) as s(chunk_id, known) %s
              order by s.known desc, s.chunk_id limit $3) x $q$, filter_sql);
begin
    if filter_sql = '' and not principal and blocks is null then
        return query select t.cid, t.bm25
                     from agentdb_accel.bm25_topk(source_id, terms, weights, dfs, max_tfs, min_dls, max_spans,
                                                  cand, avgdl, k1, b) t;
        return;
    elsif filter_sql = '' and not principal then
        return query select t.cid, t.bm25
                     from agentdb_accel.bm25_topk(source_id, terms, weights, dfs, max_tfs, min_dls, max_spans,
                                                  cand, avgdl, k1, b, blocks) t;
        return;
    elsif filter_sql = '' then
        return query select t.cid, t.bm25
                     from agentdb_internal.principal_bm25_topk(source_id, terms, weights, dfs, max_tfs, min_dls,
                                                               max_spans, cand, avgdl, k1, b, shard_anchor) t;
        return;
    end if;
    loop
        if principal then
            select coalesce(array_agg(t.cid), '{}'), coalesce(array_agg(t.bm25), '{}') into ids, scores
            from agentdb_internal.principal_bm25_topk(source_id, terms, weights, dfs, max_tfs, min_dls,
                                                      max_spans, k, avgdl, k1, b, shard_anchor) t;
        elsif blocks is null then
            select coalesce(array_agg(t.cid), '{}'), coalesce(array_agg(t.bm25), '{}') into ids, scores
            from agentdb_accel.bm25_topk(source_id, terms, weights, dfs, max_tfs, min_dls, max_spans, k, avgdl,
                                         k1, b) t;
        else
            select coalesce(array_agg(t.cid), '{}'), coalesce(array_agg(t.bm25), '{}') into ids, scores
            from agentdb_accel.bm25_topk(source_id, terms, weights, dfs, max_tfs, min_dls, max_spans, k, avgdl,
                                         k1, b, blocks) t;
        end if;
        execute keep into kept_ids, kept_scores
            using ids, scores, cand, null::text[], filter_params, row_params, null::float8[], null::float8, source_id,
                  null::float8, null::float8, null::float8, null::bigint, exclude_doc, null::text[], null::float8[],
                  fq_params, ex_params;
        exit when cardinality(kept_ids) >= cand or cardinality(ids) < k or k > 2^27;
        k := k * 8;
    end loop;
    return query select u.cid, u.bm25 from unnest(kept_ids, kept_scores) as u(cid, bm25);
end;
$$;

-- Whether agentdb.retrieve executes its statement prepared once per backend (agentdb_accel.execute_cached,
-- ext/agentdb_accel_plans.c) rather than by EXECUTE, which parses, analyses and plans it on every call: when the
-- extension offers it to the current role, and neither agentdb.lexical_path is 'sql' (the plain SQL path,
-- AGENTDB_LEXICAL_PATH=sql) nor agentdb.plan_cache is 'off' (bench/accel_plans.py compares the two).
create or replace function agentdb_internal.plans_cached() returns boolean
language sql stable as $$
select coalesce(current_setting('agentdb.lexical_path', true), '') <> 'sql'
       and coalesce(current_setting('agentdb.plan_cache', true), '') <> 'off'
       and coalesce((select has_function_privilege(x.oid, 'execute')
                            and has_schema_privilege(x.pronamespace, 'usage')
                     from pg_catalog.pg_proc x
                     where x.proname = 'execute_cached' and x.pronamespace = to_regnamespace('agentdb_accel')),
                    false)
$$;
