-- The accelerated lexical leg: agentdb's own C extension (ext/, agentdb_accel) computes the exact BM25 top k
-- over the same postings the plain SQL path reads, with the weights and statistics the SQL side passes it;
-- these wrappers choose the path and apply the query's filters. Both paths return the same chunks and scores.

-- Create the extension where the server offers it (agentdb/db/accel.py builds and configures it for the
-- embedded server). A server that offers it but cannot load it, or a role that may not create it, keeps the
-- plain SQL path: the warning says why, and the migration goes on.
do $$
begin
    if exists (select 1 from pg_available_extensions where name = 'agentdb_accel')
       and not exists (select 1 from pg_extension where extname = 'agentdb_accel') then
        begin
            create extension agentdb_accel;
        exception when others then
            raise warning 'agentdb_accel is not loaded, lexical retrieval uses the plain SQL path: %', sqlerrm;
        end;
    end if;
end;
$$;

-- The path the current session's lexical legs take: 'accel' when the extension is installed and the current
-- role may call it (the application's role; a principal's role may not: the cursor reads every chunk's
-- postings, and row security cannot apply inside it), and the setting agentdb.lexical_path is not 'sql'
-- (AGENTDB_LEXICAL_PATH=sql writes it into the embedded server's configuration); else 'sql'.
create or replace function agentdb_internal.lexical_path() returns text
language sql stable as $$
select case when coalesce(current_setting('agentdb.lexical_path', true), '') = 'sql' then 'sql'
            when exists (select 1 from pg_proc p join pg_namespace n on n.oid = p.pronamespace
                         where n.nspname = 'agentdb_accel' and p.proname = 'bm25_topk'
                           and has_schema_privilege(n.oid, 'usage') and has_function_privilege(p.oid, 'execute'))
            then 'accel'
            else 'sql' end
$$;

-- The lexical leg of agentdb.retrieve on the accelerated path: the exact BM25 top `cand` of the query terms
-- (with their weights and statistics, as agentdb_internal.bm25_maxscore takes them) among the chunks that pass
-- `filter_sql` ('' or a join and where clause on alias s, with retrieve's parameter positions: $5 filter, $6
-- row filter, $14 excluded document, $17 filter_query, $18 exclusion_query). The C cursor returns the best k
-- chunks of all that hold a term, in order (score desc, chunk id); the filter keeps a prefix of that order,
-- so when cand of them pass, or the cursor returned every chunk it has, they are the exact answer; otherwise
-- k grows eightfold and the cursor runs again. A filter is checked on candidates, never compiled into the
-- cursor: the same predicate, row security and column grants as the SQL path, whatever the filter holds, at
-- the cost of a rerun when it keeps few of the best chunks.
create or replace function agentdb_internal.bm25_accel(
    source_id int, blocks boolean, terms text[], weights float8[], dfs bigint[], max_tfs int[], min_dls int[],
    max_spans bigint[], cand int, avgdl float8, k1 float8, b float8,
    filter_sql text, filter_params jsonb, row_params jsonb, exclude_doc text, fq_params jsonb, ex_params jsonb
) returns table (cid bigint, bm25 float8)
language plpgsql stable as $$
declare
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
    if filter_sql = '' then
        return query select t.cid, t.bm25
                     from agentdb_accel.bm25_topk(source_id, blocks, terms, weights, dfs, max_tfs, min_dls, max_spans,
                                                  cand, avgdl, k1, b) t;
        return;
    end if;
    loop
        select coalesce(array_agg(t.cid), '{}'), coalesce(array_agg(t.bm25), '{}') into ids, scores
        from agentdb_accel.bm25_topk(source_id, blocks, terms, weights, dfs, max_tfs, min_dls, max_spans, k, avgdl,
                                     k1, b) t;
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
