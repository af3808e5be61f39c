-- Retrieval: the dense leg (HNSW, cosine, iterative scan), the lexical leg (exact Okapi BM25 over the
-- postings) and their fusion (Reciprocal Rank Fusion, or a convex combination of normalised scores), in ONE
-- dynamic SQL statement. agentdb.retrieve is the one implementation; agentdb.search, agentdb.similar, the
-- Python API, the CLI and HTTP all go through it.

-- A source table keeps in its rows what the read path reads: the vector (storage main: the dense leg computes
-- the distance of every row it returns, and reading it from TOAST cost as much as the HNSW step) and the text
-- of an ordinary chunk (every hit's JSON carries it). PostgreSQL moves columns out of line, the largest first,
-- only while a row is longer than toast_tuple_target, 2 kB by default, which a 384-dimension vector (1.5 kB)
-- leaves almost no room beside: so the target is the vector plus 1.5 kB, and a longer row still sends its
-- largest columns out first, usually the tsvector, which no query reads (the lexical leg reads the postings).
-- So a typical chunk's text stays in the row, and a page of hits reads it without a TOAST fetch each, for a
-- larger heap and an unchanged table with its TOAST. Rows keep their layout until they are written again
-- (VACUUM FULL rewrites them all).
create or replace function agentdb_internal.store_rows_inline(source_id int) returns void
language plpgsql as $$
declare
    src agentdb.sources;
begin
    select * into strict src from agentdb.sources s where s.id = store_rows_inline.source_id;
    execute format('alter table %I.%I alter column agentdb_embedding set storage main, set (toast_tuple_target = %s)',
                   src.table_schema, src.table_name, least(8160, 4 * src.embedding_dim + 8 + 1536));
end;
$$;

-- Row expressions of a source table aliased c: document id, chunk position, title, text and metadata.
create or replace function agentdb_internal.source_row_sql(src agentdb.sources)
returns table (doc_id text, chunk text, title text, body text, metadata text)
language plpgsql stable as $$
declare
    f jsonb;
    parts text[] := '{}';
begin
    if src.kind = 'documents' then
        return query select 'c.doc_id'::text, 'c.chunk'::text, 'c.title'::text, 'c.text'::text, 'c.metadata'::text;
        return;
    end if;
    for f in select * from jsonb_array_elements(src.fields) loop
        parts := parts || format('%L, c.%I', f->>'name', f->>'column');
    end loop;
    return query select
        format('c.%I::text', src.id_column),
        '0'::text,
        case when src.title_column is null then $q$''::text$q$
             else format($q$coalesce(c.%I::text, '')$q$, src.title_column) end,
        format('concat_ws(E''\n'', %s)', (select string_agg(format('c.%I', col), ', ') from unnest(src.text_columns) col)),
        case when cardinality(parts) = 0 then $q$'{}'::jsonb$q$
             else format('jsonb_strip_nulls(jsonb_build_object(%s))', array_to_string(parts, ', ')) end;
end;
$$;

-- The lexical leg of agentdb.retrieve for queries whose postings exceed the seed budget: the exact BM25 top
-- `cand` by MaxScore, over the query terms the source holds with their weights and statistics as the caller
-- read them once (agentdb_internal.query_terms, a principal's role its own). Each term t adds wk_t * tf / (tf + k1 * (1 - b) + k1 * b / avgdl * dl) to a chunk holding
-- it (wk_t = idf_t * (k1 + 1) * qtf_t), at most ub_t (the same at term_stats.max_tf and min_dl). Terms are taken in
-- descending ub. The state is the set of chunks that may still rank, each with its exact score over the terms
-- taken so far (`known`), and theta, the cand-th best known score among chunks that pass the filter: a lower
-- bound of the final cand-th score. A chunk whose known score plus the bounds of the terms not taken yet is
-- below theta cannot rank and is dropped.
--   1. Seed: the terms whose postings fit the budget are summed. theta is primed with exact scores: the best
--      chunks of those sums (`prime_chunks` more than cand) have their other terms looked up, and theta becomes
--      the cand-th of their full scores. On real text the best chunks of the rarest terms hold most of the
--      other terms too, so that theta is close to the final one and fewer terms are essential (scifact-text,
--      1M chunks: 3.2M essential postings over 25 queries without priming, 1.8M with it, 1.75M knowing the
--      final theta in advance).
--   2. Essential: while the bounds of the remaining terms sum to theta or more, a chunk holding none of the
--      terms taken so far could still rank, so the next terms' postings are summed as well (and theta primed
--      again from their best chunks); the chunks that can still reach theta are held.
--   3. The rest (their bounds sum below theta) can only add to chunks already held: each is looked up for the
--      chunks still in play; theta rises as scores grow and the set shrinks.
-- Returns the best cand chunks by (score desc, chunk id). filter_sql is '' or a join and where clause on alias s
-- written with retrieve's parameter positions ($5 filter, $6 row filter, $14 excluded document, $17
-- filter_query, $18 exclusion_query); every statement here passes those values at the same positions.
create or replace function agentdb_internal.bm25_maxscore(
    source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[], min_dls int[], max_spans bigint[],
    cand int, avgdl float8, k1 float8, b float8, seed_budget bigint,
    filter_sql text, filter_params jsonb, row_params jsonb, exclude_doc text, fq_params jsonb, ex_params jsonb,
    shard_anchor text default null, shard_blocks boolean default false
) returns table (cid bigint, bm25 float8)
language plpgsql stable as $$
declare
    k_len float8 := k1 * (1 - b);          -- the chunk-length part of the BM25 denominator:
    k_dl float8 := k1 * b / avgdl;         --   tf + k_len + k_dl * dl
    t_term text[];
    t_wk float8[];
    t_ub float8[];
    t_df bigint[];
    t_span bigint[];
    -- The postings read: agentdb.postings (and the blocks), or with `shard_anchor` the shard of them that key
    -- hashes to (agentdb_internal.shard_maxscore, on the worker holding it), read directly: of
    -- agentdb.posting_blocks when `shard_blocks`, else of agentdb.postings. A principal's role reads a shard's
    -- blocks through agentdb_internal.principal_block_postings, as the postings of the chunks it may read.
    postings_rel constant text := case when shard_anchor is not null then agentdb_internal.shard_of(
        case when shard_blocks then 'agentdb.posting_blocks' else 'agentdb.postings' end, shard_anchor) end;
    postings constant text := case when shard_blocks then 'agentdb.postings' else coalesce(postings_rel, 'agentdb.postings') end;
    blocks_rel constant text := case when shard_blocks then postings_rel else 'agentdb.posting_blocks' end;
    term_postings constant text := case
        when postings_rel is null then 'agentdb_internal.term_postings($9, $4, $7)'
        when shard_blocks and left(current_user, 10) = 'agentdb_p_' then format($q$
            (select t.term, x.chunk_id, t.wk, x.tf, x.dl
             from unnest($4::text[], $7::float8[]) as t(term, wk)
             join agentdb_internal.principal_block_postings($9, $4, %L) x on x.term = t.term) $q$, shard_anchor)
        when shard_blocks then format($q$
            (select u.term, u.first_chunk + u.off as chunk_id, u.wk, u.tf::int as tf, u.dl
             from (select t.term, b.first_chunk, t.wk, unnest(agentdb_internal.block_ints(b.offs, b.narrow_offs)) as off,
                          unnest(b.tfs) as tf, unnest(agentdb_internal.block_ints(b.dls, b.narrow_dls)) as dl
                   from unnest($4::text[], $7::float8[]) as t(term, wk)
                   join %s b on b.source_id = $9 and b.term = t.term) u) $q$, postings_rel)
        else format('(select t.term, p.chunk_id, t.wk, p.tf, p.dl from unnest($4::text[], $7::float8[]) as t(term, wk)'
                    ' join %s p on p.source_id = $9 and p.term = t.term)', postings_rel) end;
    -- Whether the source keeps blocks (read in the body: on a shard the catalog is not read, as a reference
    -- table there would be a distributed query of its own).
    blocks boolean := shard_blocks;
    -- A principal's role reads no block itself (its block postings come through term_postings): it joins, and
    -- primes theta from its sums alone (a lookup in the blocks would find nothing).
    blocks_hidden boolean;
    after float8[];                        -- after[i]: the sum of ub over the terms after i
    nt int;
    i int;
    j int;
    ids bigint[] := '{}';
    known float8[] := '{}';
    theta float8 := 0;
    seen bigint := 0;
    -- The chunks holding any of the terms $4 (weights $7) with their scores over those terms.
    scores constant text := format($q$
        select p.chunk_id, sum(p.wk * p.tf / (p.tf + $8 + $10 * p.dl)) as known
        from %s p
        group by p.chunk_id $q$, term_postings);
    -- Add the postings of the one term $4[1] to the held chunks only: by lookups while the held chunks are
    -- fewer than a share of its postings, else by a hash join with all of them. In the row layout the lookup
    -- is one index scan with the held chunk ids as an array condition, and the share is a half (below it the
    -- lookups are the faster, above it the join). In the block layout each held chunk is looked up in the
    -- blocks that may hold it (block_lookup below), which costs far more a chunk than decoding and joining a
    -- posting does, so the share is a sixteenth: a lookup per held chunk is cheaper than decoding every block
    -- only when few are held.
    add_term_join constant text := format($q$
        select coalesce(array_agg(h.chunk_id), '{}'), coalesce(array_agg(h.known + coalesce(x.c, 0)), '{}')
        from unnest($1::bigint[], $2::float8[]) as h(chunk_id, known)
        left join (select p.chunk_id, $7[1] * p.tf / (p.tf + $8 + $10 * p.dl) as c
                   from %s p) x on x.chunk_id = h.chunk_id
        where h.known + coalesce(x.c, 0) + $12 >= $11 $q$, term_postings);
    add_term_lookup constant text := replace(add_term_join, format('from %s p)', term_postings),
        format('from %s p where p.source_id = $9 and p.term = $4[1] and p.chunk_id = any($1))', postings));
    -- The contribution to chunk %1$s of term %2$s (weight %3$s, max_span %4$s), or null, read in the row or the
    -- block layout. In the block layout the blocks that may hold the chunk (first chunk within the term's
    -- max_span below it) are read by one index scan and the chunk is found in the block's offsets. Each is a
    -- scalar subquery so that every lookup is one index scan: as a lateral join the planner reads every block
    -- of the term once and tests each chunk against each block.
    row_lookup constant text := replace($q$
        (select %3$s * p.tf / (p.tf + $8 + $10 * p.dl) from agentdb.postings p
         where p.source_id = $9 and p.term = %2$s and p.chunk_id = %1$s) $q$, 'agentdb.postings', postings);
    block_lookup constant text := replace($q$
        (select %3$s * b.tfs[k.i] / (b.tfs[k.i] + $8 + $10 * coalesce(b.dls[k.i], b.narrow_dls[k.i]))
         from agentdb.posting_blocks b
         cross join lateral (select array_position(agentdb_internal.block_ints(b.offs, b.narrow_offs),
                                                   (%1$s - b.first_chunk)::int4) as i) k
         where b.source_id = $9 and b.term = %2$s and b.first_chunk between %1$s - %4$s and %1$s
           and b.last_chunk >= %1$s and k.i is not null
         limit 1) $q$, 'agentdb.posting_blocks', blocks_rel);
    add_term_block_lookup constant text := format($q$
        select coalesce(array_agg(h.chunk_id), '{}'), coalesce(array_agg(h.known + coalesce(h.c, 0)), '{}')
        from (select h.chunk_id, h.known, %s as c from unnest($1::bigint[], $2::float8[]) as h(chunk_id, known)) h
        where h.known + coalesce(h.c, 0) + $12 >= $11 $q$, format(block_lookup, 'h.chunk_id', '$4[1]', '$7[1]', '$13'));
    -- The held chunks, as a relation s(chunk_id, known).
    held constant text := 'unnest($1::bigint[], $2::float8[]) as s(chunk_id, known)';
    -- theta ($11), or the cand-th best known score in relation %s (aliased s) among chunks that pass the filter
    -- if greater (0 if fewer pass), a hair lower (relatively, and by more than the 1e-9 grid of
    -- agentdb_internal.bm25_round) so that neither float rounding nor the rounding of scores drops a tie.
    kth constant text := $q$
        select greatest($11, coalesce((select s.known from %s %s order by s.known desc offset $3 - 1 limit 1), 0) * (1 - 1e-9) - 1e-9) $q$;
    -- How many chunks beyond cand the seed and essential steps score exactly to prime theta (each costs one
    -- lookup a term after the step).
    prime_chunks constant int := 100;
    -- Sum the postings of the terms $4 (weights $7) into known scores; take the best cand + prime_chunks of them
    -- that pass the filter, and add to each the contributions of the terms after the step ($15, weights $16,
    -- max_spans $13), looked up: their exact scores. theta becomes the greater of $11 and the cand-th of those;
    -- when the bound $12 of the terms after the step is below it (or 0: no terms after them), the chunks that
    -- can still reach it are held (ids, known), else ids and known are null.
    sum_and_hold text;  -- (made in the body, by the layout)
    -- Every statement here takes the same parameters: $1 $2 the held chunks, $3 cand, $4 $7 the terms of the
    -- step and their weights, $8 $10 the length constants, $9 the source, $11 theta, $12 the bound of the
    -- terms after the step, $13 the step's term's max_span (block layout; in sum_and_hold the max_spans of
    -- the terms after the step, $15, with their weights $16), and the filter's values at retrieve's positions.
    step_terms text[];
    step_wk float8[];
    bound float8;
begin
    if postings_rel is null then
        blocks := (select s.lexical_layout = 'blocks' from agentdb.sources s where s.id = bm25_maxscore.source_id);
    end if;
    blocks_hidden := blocks and left(current_user, 10) = 'agentdb_p_';
    sum_and_hold := format($q$
        with g as materialized (%s),
             best as materialized (select s.chunk_id, s.known from g s %s order by s.known desc limit $3 + %s),
             exact as (select best.known + coalesce((select sum(%s) from unnest($15::text[], $16::float8[], $13::bigint[])
                                                     as t(term, wk, span)), 0) as known
                       from best),
             -- materialized: as a subquery theta would be computed once for each of its three uses below, and
             -- with it every lookup of `exact`
             t(theta) as materialized (%s)
        select t.theta, h.ids, h.known
        from t
        left join lateral (select coalesce(array_agg(g.chunk_id), '{}') as ids, coalesce(array_agg(g.known), '{}') as known
                           from g where g.known + $12 >= t.theta) h on $12 < t.theta or $12 = 0 $q$,
        scores, filter_sql, prime_chunks,
        case when blocks_hidden then 'null::float8'
             else format(case when blocks then block_lookup else row_lookup end, 'best.chunk_id', 't.term', 't.wk', 't.span') end,
        format(kth, 'exact s', ''));

    -- The query terms by bound, highest first.
    select array_agg(x.term order by x.ub desc, x.term), array_agg(x.wk order by x.ub desc, x.term),
           array_agg(x.ub order by x.ub desc, x.term), array_agg(x.df order by x.ub desc, x.term),
           array_agg(x.max_span order by x.ub desc, x.term)
    into t_term, t_wk, t_ub, t_df, t_span
    from (select u.term, u.df, u.max_span, u.wk, u.wk * u.max_tf / (u.max_tf + k_len + k_dl * u.min_dl) as ub
          from unnest(terms, weights, dfs, max_tfs, min_dls, max_spans)
               as u(term, wk, df, max_tf, min_dl, max_span)) x;
    nt := coalesce(cardinality(t_term), 0);
    if nt = 0 then
        return;
    end if;
    after := array_fill(0::float8, array[nt]);
    for i in reverse nt - 1 .. 1 loop
        after[i] := after[i + 1] + t_ub[i + 1];
    end loop;

    -- 1. Seed: the first term, then the next ones while their postings in all stay under the budget (the first
    --    term that would pass it is not taken: if the seed did not hold, that large list would be summed
    --    twice); theta from
    --    their scores, primed. When the bounds of the terms after the seed already sum below that theta (often
    --    all of them: the seed holds every term), the seed's terms are the essential ones: the same statement
    --    holds the chunks that can still reach theta, and step 2 is skipped (it would sum the same postings
    --    again).
    i := 1;
    seen := t_df[1];
    while i < nt and seen + t_df[i + 1] < seed_budget loop
        i := i + 1;
        seen := seen + t_df[i];
    end loop;
    step_terms := t_term[1:i];
    step_wk := t_wk[1:i];
    bound := after[i];
    execute sum_and_hold into theta, ids, known
        using ids, known, cand, step_terms, filter_params, row_params, step_wk, k_len, source_id, k_dl,
              theta, bound, t_span[i + 1:], exclude_doc, t_term[i + 1:], t_wk[i + 1:], fq_params, ex_params;

    -- 2. Essential: the seed and the next terms, up to the first whose successors' bounds sum below theta; their
    --    postings are summed (the seed's again), theta rises to the cand-th of those sums, and the chunks that
    --    can still reach it are held.
    j := i;
    if ids is null then
        while j < nt and after[j] >= theta loop
            j := j + 1;
        end loop;
        step_terms := t_term[1:j];
        step_wk := t_wk[1:j];
        bound := after[j];
        execute sum_and_hold into theta, ids, known
            using ids, known, cand, step_terms, filter_params, row_params, step_wk, k_len, source_id, k_dl,
                  theta, bound, t_span[j + 1:], exclude_doc, t_term[j + 1:], t_wk[j + 1:], fq_params, ex_params;
    end if;

    -- 3. The rest, one term at a time.
    for i in j + 1 .. nt loop
        step_terms := t_term[i:i];
        step_wk := t_wk[i:i];
        bound := after[i];
        execute case when cardinality(ids) * case when blocks then 16 else 2 end >= t_df[i] or blocks_hidden
                     then add_term_join
                     when blocks then add_term_block_lookup else add_term_lookup end
            into ids, known
            using ids, known, cand, step_terms, filter_params, row_params, step_wk, k_len, source_id, k_dl,
                  theta, bound, t_span[i], exclude_doc, null, null, fq_params, ex_params;
        if cardinality(ids) > cand then
            execute format(kth, held, filter_sql) into theta
                using ids, known, cand, step_terms, filter_params, row_params, step_wk, k_len, source_id, k_dl,
                      theta, bound, null, exclude_doc, null, null, fq_params, ex_params;
        end if;
    end loop;

    return query execute format('select s.chunk_id, agentdb_internal.bm25_round(s.known) as known from %s %s'
                                ' order by known desc, chunk_id limit $3',
                                held, filter_sql)
        using ids, known, cand, step_terms, filter_params, row_params, step_wk, k_len, source_id, k_dl,
              theta, bound, null, exclude_doc, null, null, fq_params, ex_params;
end;
$$;

-- The lexical leg's MaxScore on one shard of a source distributed by Citus (agentdb/db/distribute.py), on the
-- worker that holds it: agentdb.retrieve asks `select agentdb_internal.shard_maxscore(a.key, ...) from
-- agentdb.shard_anchors a`, which Citus runs on every shard of the anchors, and each anchor's key hashes to the
-- co-located shards of the postings and of the source's table `docs` (schema.table, quoted) on that worker.
-- bm25_maxscore reads those shards directly (a query on the distributed tables, from a shard, would be a
-- distributed query of its own, which Citus refuses there); `filter_sql` names `docs`, replaced by its shard,
-- whose row security, column grants and policies Citus keeps as the table's. The shard's best cand chunks by
-- (score desc, chunk id), with their scores; the coordinator merges the shards' lists. The statistics in the
-- weights and avgdl are the source's, so a chunk scores as on one node. `layout` is the source's: in blocks the
-- shard's posting blocks are read, by the C cursor when `path` (the caller's agentdb_internal.lexical_path) is
-- 'accel' and the worker has the accelerator, else by MaxScore in SQL. A principal's role reads them through
-- the readers of its block postings (agentdb_internal.principal_bm25_topk and principal_block_postings), which
-- find the shards from `anchor` and keep the chunks its policy lets it read.
create or replace function agentdb_internal.shard_maxscore(
    anchor text, docs text, layout text, path text, source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[],
    min_dls int[], max_spans bigint[], cand int, avgdl float8, k1 float8, b float8, seed_budget bigint,
    filter_sql text, filter_params jsonb, row_params jsonb, exclude_doc text, fq_params jsonb, ex_params jsonb,
    out ids bigint[], out scores float8[]
)
language plpgsql stable as $$
declare
    -- the shard of the source's postings in its layout (`layout`: the catalog is not read on a shard)
    docs_shard constant text := agentdb_internal.shard_of(docs::regclass, anchor);
begin
    -- The C cursor over the shard's blocks when the caller's session takes the accelerated path (`path`) and this
    -- worker has an accelerator that reads a given table (1.6); else MaxScore in SQL. The same answers.
    if layout = 'blocks' and path = 'accel' and agentdb_internal.lexical_path() = 'accel'
       and exists (select 1 from pg_catalog.pg_extension x
                   where x.extname = 'agentdb_accel' and string_to_array(x.extversion, '.')::int[] >= '{1,6}') then
        select coalesce(array_agg(m.cid order by m.bm25 desc, m.cid), '{}'),
               coalesce(array_agg(m.bm25 order by m.bm25 desc, m.cid), '{}')
        into ids, scores
        from agentdb_internal.bm25_accel(source_id, terms, weights, dfs, max_tfs, min_dls, max_spans, cand, avgdl,
                                         k1, b, replace(filter_sql, docs, docs_shard), filter_params, row_params,
                                         exclude_doc, fq_params, ex_params, anchor) m;
        return;
    end if;
    select coalesce(array_agg(m.cid order by m.bm25 desc, m.cid), '{}'),
           coalesce(array_agg(m.bm25 order by m.bm25 desc, m.cid), '{}')
    into ids, scores
    from agentdb_internal.bm25_maxscore(source_id, terms, weights, dfs, max_tfs, min_dls, max_spans, cand, avgdl, k1,
                                        b, seed_budget, replace(filter_sql, docs, docs_shard), filter_params,
                                        row_params, exclude_doc, fq_params, ex_params, anchor,
                                        layout = 'blocks') m;
end;
$$;

-- The query terms that source `source_id` holds, as the caller may see them (a principal's role reads no
-- term_stats row itself, but its own through agentdb.principal_term_stats), with their statistics (df, max_tf,
-- min_dl, max_span), each term's BM25 weight over `n_chunks` chunks, and their postings in all; the arrays in
-- one order. What the lexical leg of agentdb.retrieve (summed, or agentdb_internal.bm25_maxscore) and
-- agentdb.score_keys know of the query's terms. `query` is the query's tsvector: its lexemes are the terms,
-- and a term's weight is idf x (k1 + 1) x qtf, qtf its number of positions in the query (how often the query
-- says it; 1 without positions). So a query that repeats a word scores as the sum over its words, each
-- occurrence once, as Lucene scores a BooleanQuery of repeated TermQuery clauses (it sums their boosts) and
-- bm25s a query of repeated tokens: Okapi BM25's query-frequency factor (k3 + 1) qtf / (k3 + qtf) with k3
-- unbounded. The weight is computed here only; every scorer takes it as given.
create or replace function agentdb_internal.query_terms(
    source_id int, query tsvector, n_chunks float8, k1 float8,
    out held text[], out weights float8[], out postings bigint,
    out dfs bigint[], out max_tfs int[], out min_dls int[], out max_spans bigint[]
)
language plpgsql stable as $$
declare
    terms text[] := tsvector_to_array(query);
begin
    if agentdb.current_principal() is not null then
        select array_agg(ts.term), array_agg(ts.df), array_agg(ts.max_tf), array_agg(ts.min_dl), array_agg(ts.max_span)
        into held, dfs, max_tfs, min_dls, max_spans
        from agentdb.principal_term_stats(query_terms.source_id, terms) ts;
    else
        select array_agg(ts.term), array_agg(ts.df), array_agg(ts.max_tf), array_agg(ts.min_dl), array_agg(ts.max_span)
        into held, dfs, max_tfs, min_dls, max_spans
        from agentdb.term_stats ts where ts.source_id = query_terms.source_id and ts.term = any(terms);
    end if;
    weights := array(select ln(1 + (n_chunks - d.df + 0.5) / (d.df + 0.5)) * (k1 + 1)
                            * (select coalesce(cardinality(q.positions), 1) from unnest(query) q where q.lexeme = d.term)
                     from unnest(held, dfs) with ordinality d(term, df, n) order by d.n);
    postings := coalesce((select sum(d) from unnest(dfs) d), 0);
end;
$$;

-- The RRF constant k that hybrid fusion uses when the caller names none: the one default of every SQL function
-- taking rrf_k (Python's is agentdb.config.RRF_K, which the tests hold equal to it).
create or replace function agentdb_internal.default_rrf_k() returns int
language sql immutable parallel safe
as $$ select 60 $$;

-- SET LOCAL the setting `name` (quoted part by part) to `value`, for agentdb.retrieve. A SET LOCAL
-- statement, not set_config: with citus.propagate_set_commands 'local', Citus records a SET LOCAL to send to
-- the workers at the start of their part of the transaction, which set_config, a function call, is not. It
-- records one run in an explicit transaction block or inside a function called from a query, which a
-- statement of retrieve's own body is not (Citus counts executor levels): hence this function. Where SET
-- commands are not propagated (one node, or a source that is not distributed) set_config does the same
-- without parsing a statement on every call.
create or replace function agentdb_internal.set_local(name text, value text) returns void
language plpgsql as $$
begin
    if coalesce(current_setting('citus.propagate_set_commands', true), 'none') = 'none' then
        perform set_config(name, value, true);
        return;
    end if;
    execute format('set local %s = %s',
                   (select string_agg(quote_ident(part), '.') from unnest(string_to_array(name, '.')) part),
                   quote_literal(value));
end;
$$;

-- Search one source. Returns {"route", "hits": [...], "diagnostics": {...}} as json, each hit's keys in the
-- order id, chunk, rank, score, distance, bm25_score, rank_dense, rank_sparse, title, text, metadata (cast it
-- to jsonb for jsonb's operators). The page is written once, as text: built as jsonb, every number went
-- through numeric, and the page was copied into each enclosing object and written out again.
--   mode: 'dense' | 'lexical' | 'hybrid'; dense and hybrid need query_embedding (made with the source's model).
--   threshold: maximum cosine distance on the dense leg only (0 = no limit); in hybrid it gates dense
--     candidates before fusion and BM25-only hits pass ungated; inert in lexical mode.
--   Candidate rule: in hybrid mode (or with group_by_doc) each leg fetches
--     candidates = coalesce(candidates, greatest(100, 4 * top_k)) rows (at most 4000) before fusion;
--     otherwise the single leg fetches top_k rows.
--   scope: the query filters and the row filter (a principal's), one jsonb object (sql/035_scope.sql), compiled
--     by agentdb_internal.compile_filter and applied to both legs.
--   fusion: how hybrid mode fuses its legs (inert in dense and lexical mode, whose score is 1 - distance or BM25):
--     'rrf' (the default): score = sum over legs of 1 / (rrf_k + rank), rank 1-based within the leg.
--     'convex': score = alpha * bm25_norm + (1 - alpha) * sim_norm, where each leg's score (BM25; cosine
--       similarity 1 - distance) is min-max normalised over that leg's candidate pool as it enters fusion:
--       the lexical leg's candidates, and the dense leg's after the threshold (the threshold gates exactly as
--       with RRF, and a gated candidate neither scores nor sets the range). The best candidate of a leg gets 1,
--       its worst 0; a pool whose scores are all equal (one candidate, say) gives each 1, since each is that
--       leg's best. A chunk absent from a leg gets 0 from it. alpha (0..1, default 0.5) weighs BM25: 1 is
--       the lexical leg alone, 0 the dense leg alone (each over the fused candidates).
--     RRF stays the default: convex measured better on SciFact (bench/scifact.py), but on no second
--     BEIR-format dataset yet.
--   fields: projection of the returned metadata/title/text (null = everything).
--   Under a principal's role (SET ROLE) the source is read through agentdb.source_relation, so columns
--   outside the field grant read as null; the row filter is then applied by the role's row security, and
--   `row_filter` is compiled only when it is not the principal's own (it can only hide more rows).
create or replace function agentdb.retrieve(
    source text,
    query text default '',
    query_embedding vector default null,
    mode text default 'hybrid',
    top_k int default 10,
    rrf_k int default agentdb_internal.default_rrf_k(),
    threshold float8 default 0.5,
    scope jsonb default null,
    model text default null,
    group_by_doc boolean default false,
    ef_search int default 100,
    candidates int default null,
    fields text[] default null,
    exclude_doc text default null,
    fusion text default 'rrf',
    alpha float8 default 0.5,
    -- diagnostics.output.results repeats every hit with its text (the funnel's last stage); false leaves it
    -- out, for callers that do not show diagnostics (it saves writing every hit's text twice).
    output_results boolean default true
) returns json
language plpgsql
set hnsw.iterative_scan = 'relaxed_order'
-- The default of the ef_search argument, which each call sets: on a coordinator this is the database's default
-- (agentdb.db.distribute.carry_retrieve_settings), which a shard statement runs under when the call's own SET
-- LOCAL does not reach it (a statement on one shard, outside a transaction block).
set hnsw.ef_search = 100
set hnsw.max_scan_tuples = 100000
-- Turned off below for an unfiltered dense leg; restored when the function returns.
set enable_seqscan = on
-- JIT compilation pays off for long analytic queries; here its tens of milliseconds of compiling would dwarf
-- the query (it starts at a plan cost that large corpora reach). The lexical leg's per-chunk sums over a
-- million chunks need more than the default 4 MB to stay in memory.
set jit = off
set work_mem = '32MB'
as $$
declare
    src agentdb.sources := agentdb_internal.source_named(retrieve.source);
    r record;
    query_tsv tsvector;  -- the query's lexemes and their positions (none in dense mode)
    stats agentdb.corpus_stats;
    pred text;
    pred_params jsonb;
    row_pred text;
    row_params jsonb;
    fq_params jsonb;
    ex_params jsonb;
    use_dense boolean := mode in ('dense', 'hybrid');
    use_sparse boolean := mode in ('lexical', 'hybrid');
    cand int;
    score_sql text;
    fused_sql text;
    range_sql text;
    keyed_sql text;     -- the fused candidates (fs) with their document and chunk: the dense leg's, else looked up
    dense_sql text;
    sparse_sql text;
    stmt text;
    hits json;          -- the page
    results json;       -- diagnostics.output.results (output_results)
    n_hits bigint;
    dense_raw bigint;   -- the funnel's counts: each leg's candidates, those the threshold kept, the fused ones
    dense_kept bigint;
    sparse_raw bigint;
    fused_count bigint;
    diag jsonb;
    sc record;
    avgdl float8;
    filter_join text;
    -- Postings the lexical leg scans before it knows a score threshold (see the lexical leg below): the
    -- setting agentdb.lexical_seed_postings, else 4% of the chunks and at least 20000. It changes speed only:
    -- a larger budget seeds a higher threshold at the cost of scanning more postings first.
    seed_budget bigint;
    setting text;
    qt record;          -- the query terms the source holds, their weights and postings
    principal boolean;
    rel text;           -- the relation read for the current role (agentdb.source_relation)
    open_rows boolean;  -- no filter, no row filter, and no row-level security in force for the current role
    lexical_path text;  -- 'accel': agentdb's C cursor (sql/025_accel.sql) serves the lexical leg; 'sql': plain SQL
    tenant text;        -- the tenant the read is fixed to, on a source distributed by its tenant field ($27)
    route_c text;       -- the condition on the rows (c) and on the postings (p) that names the tenant's shard
    route_p text;
    -- The relation the fusion statement reads the candidates' rows through, and its condition: rel and route_c,
    -- or on a source distributed by Citus the candidates' rows read beforehand ($28..$33), with the legs' hits
    -- ($34..$39): see below.
    rows_rel text;
    rows_route text;
    d_cids bigint[];    -- on a distributed source: the dense leg's hits,
    d_distances float8[];
    d_docs text[];
    d_chunks int[];
    s_cids bigint[];    -- the lexical leg's,
    s_scores float8[];
    k_cids bigint[];    -- and the rows of all their candidates
    k_docs text[];
    k_chunks int[];
    k_titles text[];
    k_texts text[];
    k_metadata jsonb[];
begin
    if mode is null or mode not in ('dense', 'lexical', 'hybrid') then
        perform agentdb.invalid_param(
            format('retrieval_mode must be dense, lexical or hybrid, not %L', mode), 'retrieval_mode');
    end if;
    perform agentdb_internal.check_between(top_k, 1, 1000, 'top_k');
    perform agentdb_internal.check_between(rrf_k, 1, 1000, 'rrf_k');
    if threshold is null or threshold < 0 or threshold > 2 then
        perform agentdb.invalid_param(
            'threshold must be between 0 and 2 (a cosine distance; 0 = no limit)', 'threshold');
    end if;
    if fusion is null or fusion not in ('rrf', 'convex') then
        perform agentdb.invalid_param(
            format('fusion must be rrf or convex, not %L', fusion), 'fusion');
    end if;
    perform agentdb_internal.check_between(alpha, 0, 1, 'alpha');
    perform agentdb_internal.check_between(ef_search, 1, 1000, 'ef_search');
    if candidates is not null and (candidates < 1 or candidates > 4000) then
        perform agentdb.invalid_param('candidates must be between 1 and 4000', 'candidates');
    end if;
    if model is not null and model <> src.embedding_model then
        perform agentdb.content_mismatch(
            format('source %L was embedded with %L but the query uses %L', src.name, src.embedding_model, model),
            'embedding_model', 'query with the source''s model, or re-ingest the source with the new model');
    end if;
    if use_dense and query_embedding is null and coalesce(btrim(query), '') <> '' then
        perform agentdb.invalid_param(
            format('retrieval_mode %L needs query_embedding (a vector from the source''s model %L)', mode, src.embedding_model),
            'query_embedding',
            'pass query_embedding => ..., call agentdb.similar(source, id) to reuse a stored vector, or use mode => ''lexical''');
    end if;
    if query_embedding is not null and vector_dims(query_embedding) <> src.embedding_dim then
        perform agentdb.content_mismatch(
            format('query_embedding has dimension %s but source %L has dimension %s',
                   vector_dims(query_embedding), src.name, src.embedding_dim), 'query_embedding');
    end if;

    perform agentdb.check_projection(src, fields);

    principal := agentdb.current_principal() is not null;
    rel := agentdb.source_relation(src);
    select * into r from agentdb_internal.source_row_sql(src);
    select * into sc from agentdb_internal.scope_predicate(src, scope, array['$5', '$6', '$17', '$18']);
    pred := sc.pred;
    pred_params := sc.filter_params;
    row_pred := sc.row_pred;
    row_params := sc.row_params;
    fq_params := sc.fq_params;
    ex_params := sc.ex_params;
    if exclude_doc is not null then
        pred := format('(%s) and %s is distinct from $14', pred, r.doc_id);
    end if;
    -- Tenant routing (agentdb/db/distribute.py): on a source distributed by its tenant field, a read whose
    -- filter, filter query or row filter (the one passed, or the active principal's own) requires that field
    -- to equal a string reads only that tenant's rows, so every statement on the source's rows and postings
    -- also names the tenant's value in their distribution columns and Citus sends it to that one shard. The
    -- condition only restates what the filter requires (the filter is applied as before).
    if agentdb_internal.route_column(src) = 'agentdb_tenant' then
        tenant := coalesce(
            agentdb_internal.filter_fixed_value(src.fields, scope->'filter', src.tenant_field),
            agentdb_internal.filter_fixed_value(src.fields, scope->'filter_query', src.tenant_field),
            agentdb_internal.filter_fixed_value(src.fields, scope->'row_filter', src.tenant_field),
            case when principal then
                agentdb_internal.filter_fixed_value(src.fields, agentdb.principal_row_filter(), src.tenant_field) end);
    end if;
    route_c := case when tenant is null then 'true' else 'c.agentdb_tenant = $27' end;
    route_p := case when tenant is null then '' else ' and p.doc_id = $27' end;

    diag := jsonb_build_object(
        'source', src.name, 'top_k', top_k,
        'threshold', case when threshold = 0 then to_jsonb('inf'::text) else to_jsonb(threshold) end,
        'retrieval_mode', mode, 'rrf_k', rrf_k, 'filter', coalesce(nullif(scope->'filter', 'null')::text, ''),
        'fusion', fusion)
        || case when fusion = 'convex' then jsonb_build_object('alpha', alpha) else '{}'::jsonb end
        || (select coalesce(jsonb_object_agg(k, scope->k), '{}')
            from unnest(array['filter_query', 'exclusion_query']) k where nullif(scope->k, 'null') is not null);

    -- Empty input: nothing to search with.
    if coalesce(btrim(query), '') = '' and query_embedding is null then
        return (jsonb_build_object('route', 'not_found', 'hits', '[]'::jsonb, 'diagnostics', jsonb_build_object(
            'parameters', diag || jsonb_build_object('raw_result_count', 0, 'filtered_count', 0, 'result_count', 0)
                || case when mode = 'dense' then '{}'::jsonb else jsonb_build_object('dense_raw_count', 0,
                   'dense_filtered_count', 0, 'sparse_raw_count', 0, 'fused_candidate_count', 0) end,
            'input', '{}'::jsonb)
            || case when output_results then jsonb_build_object('output', jsonb_build_object('results', '[]'::jsonb))
                    else '{}'::jsonb end))::json;
    end if;

    -- The query's terms (none in dense mode: its statistics are then not read either).
    query_tsv := case when use_sparse then to_tsvector(src.ts_config, coalesce(query, '')) else ''::tsvector end;
    select * into stats from agentdb.corpus_stats s where s.source_id = src.id;
    avgdl := greatest(coalesce(stats.total_len, 0)::float8 / greatest(coalesce(stats.n_chunks, 0), 1), 1e-9);
    setting := nullif(btrim(current_setting('agentdb.lexical_seed_postings', true)), '');
    if setting !~ '^\d{1,18}$' then
        perform agentdb.invalid_param(
            format('agentdb.lexical_seed_postings must be a whole number of postings, not %L', setting),
            'agentdb.lexical_seed_postings', 'reset agentdb.lexical_seed_postings to use the default');
    end if;
    seed_budget := coalesce(setting::bigint, greatest(20000, coalesce(stats.n_chunks, 0) / 25));
    cand := case when mode = 'hybrid' or group_by_doc then least(coalesce(candidates, greatest(100, 4 * top_k)), 4000)
                 else top_k end;
    -- The iterative scan (relaxed order, re-sorted exactly below) goes on past ef_search until `cand` rows are
    -- found, so ef_search need not grow with the candidates: a small ef finds the same rows as a large one,
    -- sooner.
    -- The call's settings are SET LOCAL statements (agentdb_internal.set_local), which on a source distributed
    -- by Citus, with citus.propagate_set_commands 'local' (for this call: the function's SET clauses restore it
    -- on return), go to the workers too, at the start of each worker's transaction: the shards run the legs
    -- under them as well. They are reset after the statement (below). Only a dense leg needs them: a lexical
    -- read on a distributed source then sends the workers no transaction block of its own.
    if src.distributed and use_dense then
        perform set_config('citus.propagate_set_commands', 'local', true);
    end if;
    if use_dense then
        perform agentdb_internal.set_local('hnsw.ef_search', ef_search::text);
    end if;
    -- Deep pages: asked for a few hundred candidates of a few thousand chunks, the planner prefers an exact
    -- scan of every vector (detoasting each) to the HNSW index, which is faster there and ranks as well.
    -- Without a filter or row security the index is always the better plan; with them the planner keeps its
    -- choice (an exact scan is right when the filter keeps few rows).
    open_rows := pred = 'true' and row_pred = 'true' and not principal
                 and not row_security_active(format('%I.%I', src.table_schema, src.table_name)::regclass);
    if use_dense and open_rows then
        perform agentdb_internal.set_local('enable_seqscan', 'off');
    end if;

    -- The dense leg reads each row it returns anyway, so it carries the row's document and chunk: only the
    -- lexical leg's other candidates are looked up by key below (r). At SciFact's top 100 that is about 330
    -- reads of 730 candidates instead of all of them.
    if use_dense and query_embedding is not null then
        dense_sql := format($q$
            select c.agentdb_chunk_id as cid, (c.agentdb_embedding <=> $1)::float8 as distance,
                   %s as doc_id, %s as chunk
            from %s c
            where c.agentdb_embedding is not null and %s and (%s) and (%s)
            order by c.agentdb_embedding <=> $1
            limit $3 $q$, r.doc_id, r.chunk, rel, route_c, pred, row_pred);
    else
        dense_sql := 'select null::bigint as cid, null::float8 as distance, null::text as doc_id, null::int as chunk'
                     ' where false';
    end if;

    -- The lexical leg: exact BM25, the best `cand` chunks. When the query terms' postings fit the seed budget
    -- they are summed here; beyond it agentdb_internal.bm25_maxscore prunes (same scores, same order).
    -- The lexical leg may skip the join to the source table only when no row can be hidden from it: no
    -- filter, and no row-level security in force for the current role, or a principal's role, which
    -- reads only the postings of chunks it can read (its policy on agentdb.postings).
    -- On a source distributed by Citus a principal's policy on the postings names its sources only (a policy
    -- there takes no subquery), so its lexical leg always joins the rows it can read.
    filter_join := case when open_rows or (principal and not src.distributed and pred = 'true' and row_pred = 'true')
                   then ''
                   else format('join %s c on %sc.agentdb_chunk_id = s.chunk_id where %s and (%s) and (%s)',
                               rel, case when src.distributed
                                         then format('c.%I = s.doc_id and ', agentdb_internal.route_column(src)) end,
                               route_c, pred, row_pred) end;
    select * into qt from agentdb_internal.query_terms(src.id, query_tsv, coalesce(stats.n_chunks, 0)::float8, src.bm25_k1);
    -- The C cursor reads the block layout; a source in rows takes the SQL path (sql/025_accel.sql). On a source
    -- distributed by Citus it runs on each shard (agentdb_internal.shard_maxscore) when this session may take it
    -- and the shard's worker has it.
    lexical_path := case when use_sparse and src.lexical_layout = 'blocks'
                         then agentdb_internal.lexical_path() else 'sql' end;
    if not use_sparse or qt.postings = 0 then
        sparse_sql := 'select null::bigint as cid, null::float8 as bm25 where false';
    elsif src.distributed and src.table_schema <> 'agentdb_memory'
          and (src.lexical_layout = 'blocks' or (qt.postings > seed_budget and tenant is null)) then
        -- A source distributed by Citus whose query's postings exceed the seed budget, or that keeps blocks (a
        -- block holds chunks of many documents, so its postings cannot be summed by document on each shard):
        -- MaxScore on every shard (agentdb_internal.shard_maxscore, one call a shard of agentdb.shard_anchors,
        -- run by the worker holding it), each shard's best cand merged here by score; a read routed to one
        -- tenant's shard calls it on that shard's anchor alone. Rows routed to a tenant, and a memory store's
        -- records (a reference table, a copy on every node), sum as below.
        sparse_sql := format($q$
            select u.cid, u.bm25
            from (select agentdb_internal.shard_maxscore(a.key, %L, %L, %L, $9, $2, $21, $22, $23, $24, $25, $3,
                                                         $11, $12, $13, $19, %L, $5, $6, $14, $17, $18) as m
                  from agentdb.shard_anchors a%s) x
            cross join lateral unnest((x.m).ids, (x.m).scores) as u(cid, bm25)
            order by u.bm25 desc, u.cid
            limit $3 $q$,
            format('%I.%I', src.table_schema, src.table_name), src.lexical_layout, lexical_path,
            case when open_rows then '' else format('join %s c on c.agentdb_chunk_id = s.chunk_id where (%s) and (%s)',
                                                    rel, pred, row_pred) end,
            -- the anchor key of the tenant's shard, one of agentdb's own keys (a constant, so Citus prunes)
            case when tenant is not null then format(' where a.key = %L',
                (select a.key from agentdb_internal.shard_anchor_keys() a
                 where a.shard = get_shard_id_for_distribution_column('agentdb.postings', tenant))) end);
    elsif src.distributed then
        -- A source distributed by Citus (agentdb/db/distribute.py): each shard sums the postings of its own
        -- chunks (grouped by the distribution column, so Citus runs the whole statement on every shard, the
        -- filter's join co-located) and returns its best cand; the coordinator merges them by score. The
        -- statistics in the weights and $11 are the source's, not the shard's.
        sparse_sql := format($q$
            select s.chunk_id as cid, agentdb_internal.bm25_round(s.known) as bm25
            from (select p.doc_id, p.chunk_id,
                         sum(t.wk * p.tf / (p.tf + ($12 * (1 - $13)) + ($12 * $13 / $11) * p.dl)) as known
                  from unnest($2, $21) as t(term, wk)
                  join agentdb.postings p on p.source_id = $9 and p.term = t.term%s
                  group by p.doc_id, p.chunk_id) s
            %s
            order by bm25 desc, cid
            limit $3 $q$, route_p, filter_join);
    elsif lexical_path = 'accel' then
        sparse_sql := format(
            'select m.cid, m.bm25 from agentdb_internal.bm25_accel($9, $2, $21, $22, $23, $24, $25, $3, $11, $12,'
            ' $13, %L, $5, $6, $14, $17, $18) m', filter_join);
    elsif qt.postings <= seed_budget then
        sparse_sql := format($q$
            select s.chunk_id as cid, agentdb_internal.bm25_round(s.known) as bm25
            from (select p.chunk_id, sum(p.wk * p.tf / (p.tf + ($12 * (1 - $13)) + ($12 * $13 / $11) * p.dl)) as known
                  from agentdb_internal.term_postings($9, $2, $21) p
                  group by p.chunk_id) s
            %s
            order by bm25 desc, cid
            limit $3 $q$, filter_join);
    else
        sparse_sql := format(
            'select m.cid, m.bm25 from agentdb_internal.bm25_maxscore($9, $2, $21, $22, $23, $24, $25, $3, $11, $12,'
            ' $13, $19, %L, $5, $6, $14, $17, $18) m', filter_join);
    end if;

    -- The fused score is computed for the chosen fusion only, and in float8 (numeric division and its cast
    -- back would cost more a candidate). RRF is one division of exact integers, 1 / (k + r) or
    -- (2k + r1 + r2) / ((k + r1)(k + r2)), so it is the correctly rounded sum and equal sums stay equal (ties
    -- then go by document and chunk): 1/(k+57) + 1/(k+330) and 1/(k+30) are both exactly 1/90 at k 60,
    -- which two separately rounded terms would tell apart. Only convex fusion needs each leg's range.
    score_sql := case when mode = 'dense' then '1 - f.distance' when mode = 'lexical' then 'f.bm25' else 'f.fused' end;
    fused_sql := case
        when mode <> 'hybrid' then 'null::float8'
        when fusion = 'convex' then
            '$20 * case when s.cid is null then 0 when s.hi > s.lo then (s.bm25 - s.lo) / (s.hi - s.lo) else 1 end'
            ' + (1 - $20) * case when d.cid is null then 0 when d.hi > d.lo then (d.hi - d.distance) / (d.hi - d.lo)'
            ' else 1 end'
        else 'case when s.cid is null then 1::float8 / ($8 + d.rank_dense)'
             ' when d.cid is null then 1::float8 / ($8 + s.rank_sparse)'
             ' else (2 * $8 + d.rank_dense + s.rank_sparse)::float8 / (($8 + d.rank_dense) * ($8 + s.rank_sparse)) end' end;
    range_sql := case when mode = 'hybrid' and fusion = 'convex' then 'min(%1$s) over () as lo, max(%1$s) over () as hi'
                      else 'null::float8 as lo, null::float8 as hi' end;

    -- Deep pages (SciFact top 100, 400 candidates a leg) spend what top 10 does not on the candidates' keys
    -- and on the page's JSON. Only the candidates that can make the page have their keys looked up (`near`):
    -- those scoring at least the top_k-th candidate (ties included), or with group_by_doc the (2 x top_k)-th,
    -- and every other one only when those hold fewer than top_k documents (each document's best chunk then
    -- lies among them; a document absent from them scores below every one of them): a top 100 looks up a few
    -- dozen keys instead of every candidate's. r groups documents by byte equality (collate "C": the same
    -- groups under any deterministic collation, a cheaper sort); the page keeps the source's collation for its
    -- order. The metadata projection is called only when `fields` asks for one (as a function with a subquery
    -- it is not inlined, a call a hit).
    -- keyed_sql is a template: %1$s, the condition on fs that the candidates must meet. A plain join is slower
    -- than the lateral, which keeps each lookup one index probe.
    --
    -- On a source distributed by Citus the legs run first, each a statement of its own (one step on every
    -- shard, or on the tenant's), then the rows of all their candidates are read in one more, and the statement
    -- below reads those (rows_rel: the same columns as the table's) and no distributed table. Run as one
    -- statement over the distributed table, Citus planned each of its CTEs as a subplan with an intermediate
    -- result, and looked the rows up in two more multi-shard steps (docs/scale-out.md, "The coordinator's
    -- steps").
    rows_rel := case when src.distributed
                     then '(select * from unnest($28::bigint[], $29::text[], $30::int[], $31::text[], $32::text[],'
                          ' $33::jsonb[]) as c(agentdb_chunk_id, doc_id, chunk, title, text, metadata))'
                     else rel end;
    rows_route := case when src.distributed then 'true' else route_c end;
    keyed_sql := format($q$
        select fs.*, k.doc_id, k.chunk from fs cross join lateral (
            select fs.dense_doc_id as doc_id, fs.dense_chunk as chunk where fs.rank_dense is not null
            union all
            select %s, %s from %s c where fs.rank_dense is null and c.agentdb_chunk_id = fs.cid) k
        where (%%1$s) $q$, r.doc_id, r.chunk, rows_rel);
    if src.distributed then
        execute format('select coalesce(array_agg(x.cid), ''{}''), coalesce(array_agg(x.distance), ''{}''),'
                       ' coalesce(array_agg(x.doc_id), ''{}''), coalesce(array_agg(x.chunk), ''{}'') from (%s) x',
                       dense_sql)
            into d_cids, d_distances, d_docs, d_chunks
            using query_embedding, qt.held, cand, threshold, pred_params, row_params, top_k, rrf_k, src.id,
            coalesce(stats.n_chunks, 0)::float8, avgdl, src.bm25_k1, src.bm25_b, exclude_doc, group_by_doc, fields,
            fq_params, ex_params, seed_budget, alpha, qt.weights, qt.dfs, qt.max_tfs, qt.min_dls, qt.max_spans,
            output_results, tenant;
        execute format('select coalesce(array_agg(x.cid), ''{}''), coalesce(array_agg(x.bm25), ''{}'') from (%s) x',
                       sparse_sql)
            into s_cids, s_scores
            using query_embedding, qt.held, cand, threshold, pred_params, row_params, top_k, rrf_k, src.id,
            coalesce(stats.n_chunks, 0)::float8, avgdl, src.bm25_k1, src.bm25_b, exclude_doc, group_by_doc, fields,
            fq_params, ex_params, seed_budget, alpha, qt.weights, qt.dfs, qt.max_tfs, qt.min_dls, qt.max_spans,
            output_results, tenant;
        execute format('select coalesce(array_agg(c.agentdb_chunk_id), ''{}''), coalesce(array_agg(c.doc_id), ''{}''),'
                       ' coalesce(array_agg(c.chunk), ''{}''), coalesce(array_agg(c.title), ''{}''),'
                       ' coalesce(array_agg(c.text), ''{}''), coalesce(array_agg(c.metadata), ''{}'')'
                       ' from %s c where %s and c.agentdb_chunk_id = any ($28)', rel, route_c)
            into k_cids, k_docs, k_chunks, k_titles, k_texts, k_metadata
            using query_embedding, qt.held, cand, threshold, pred_params, row_params, top_k, rrf_k, src.id,
            coalesce(stats.n_chunks, 0)::float8, avgdl, src.bm25_k1, src.bm25_b, exclude_doc, group_by_doc, fields,
            fq_params, ex_params, seed_budget, alpha, qt.weights, qt.dfs, qt.max_tfs, qt.min_dls, qt.max_spans,
            output_results, tenant, d_cids || s_cids;
        dense_sql := 'select * from unnest($34::bigint[], $35::float8[], $36::text[], $37::int[])'
                     ' as x(cid, distance, doc_id, chunk)';
        sparse_sql := 'select * from unnest($38::bigint[], $39::float8[]) as x(cid, bm25)';
    end if;
    stmt := format($q$
        with dense as materialized (%s),
        sparse as materialized (%s),
        d as (select cid, distance, doc_id, chunk, row_number() over (order by distance, cid) as rank_dense, %s
              from dense where $4 = 0 or distance <= $4),
        s as (select cid, bm25, row_number() over (order by bm25 desc, cid) as rank_sparse, %s
              from sparse),
        f as (select coalesce(d.cid, s.cid) as cid, d.doc_id as dense_doc_id, d.chunk as dense_chunk,
                     d.distance, s.bm25, d.rank_dense, s.rank_sparse, (%s)::float8 as fused
              from d full join s on d.cid = s.cid),
        fs as (select f.*, (%s)::float8 as score from f),
        edge(score) as (select coalesce((select fs.score from fs order by fs.score desc
                                         offset case when $15 then 2 * $7 else $7 end - 1 limit 1), '-infinity')),
        near as materialized (%s),
        r as (select x.*, row_number() over (partition by x.doc_id collate "C" order by x.score desc, x.chunk) as doc_rank
              from (select * from near %s) x),
        top as (select r.*, row_number() over (order by score desc, doc_id, chunk) as rank
                from r where not $15 or doc_rank = 1
                order by score desc, doc_id, chunk limit $7),
        page as (
            select t.doc_id as id, t.chunk, t.rank, t.score, t.distance, t.bm25 as bm25_score,
                   t.rank_dense, t.rank_sparse,
                   case when $16::text[] is null or 'title' = any($16) then %s end as title,
                   case when $16::text[] is null or 'text' = any($16) then %s end as text,
                   case when $16::text[] is null then %s else agentdb.project_metadata(%s, $16) end as metadata
            from top t join %s c on %s and c.agentdb_chunk_id = t.cid)
        select coalesce((select json_agg(p order by p.rank) from page p), '[]'),
               -- each result: its hit without rank, score, title and metadata
               case when $26 then coalesce((
                   select json_agg((select o from (select p.id, p.chunk, p.distance, p.bm25_score, p.rank_dense,
                                                          p.rank_sparse, p.text) o) order by p.rank)
                   from page p), '[]') end,
               (select count(*) from page), (select count(*) from dense), (select count(*) from d),
               (select count(*) from sparse), (select count(*) from f)
        $q$,
        dense_sql, sparse_sql,
        format(range_sql, 'distance'), format(range_sql, 'bm25'), fused_sql,
        score_sql, format(keyed_sql, 'fs.score >= (select score from edge)'),
        case when group_by_doc then 'union all ' || format(keyed_sql,
            'fs.score < (select score from edge) and (select count(distinct near.doc_id collate "C") from near) < $7')
            else '' end,
        r.title, r.body, r.metadata, r.metadata,
        rows_rel, rows_route);

    -- With the accelerator the statement is prepared once per backend and shape (agentdb_internal.plans_cached):
    -- its text depends only on the request's shape, and the planner setting chosen above is part of it, as a
    -- kept plan is not planned again when a setting changes. Without a query or row filter in the statement
    -- it is planned once for all values (a generic plan: the values left are depths, the query's terms and
    -- vector, which choose no other plan); with one, as plan_cache_mode chooses, by default a custom plan for the
    -- filter's values until a generic one is estimated to cost no more (a selective filter may want another
    -- plan than the one the generic plan guessed). Else EXECUTE parses and plans it each call; so does a source
    -- distributed by Citus, where kept statements are not tested.
    if not src.distributed and agentdb_internal.plans_cached() then
        if use_dense and open_rows then
            stmt := '/* enable_seqscan off */' || stmt;
        end if;
        select * into hits, results, n_hits, dense_raw, dense_kept, sparse_raw, fused_count
        from agentdb_accel.execute_cached(stmt, sc.pred = 'true' and sc.row_pred = 'true',
            query_embedding, qt.held, cand, threshold, pred_params, row_params, top_k, rrf_k, src.id,
            coalesce(stats.n_chunks, 0)::float8, avgdl, src.bm25_k1, src.bm25_b, exclude_doc, group_by_doc, fields,
            fq_params, ex_params, seed_budget, alpha, qt.weights, qt.dfs, qt.max_tfs, qt.min_dls, qt.max_spans,
            output_results, tenant)
            as t(hits json, results json, n_hits bigint, dense_raw bigint, dense_kept bigint, sparse_raw bigint,
                 fused_count bigint);
    else
        execute stmt into hits, results, n_hits, dense_raw, dense_kept, sparse_raw, fused_count using
            query_embedding, qt.held, cand, threshold, pred_params, row_params, top_k, rrf_k, src.id,
            coalesce(stats.n_chunks, 0)::float8, avgdl, src.bm25_k1, src.bm25_b, exclude_doc, group_by_doc, fields,
            fq_params, ex_params, seed_budget, alpha, qt.weights, qt.dfs, qt.max_tfs, qt.min_dls, qt.max_spans,
            output_results, tenant, k_cids, k_docs, k_chunks, k_titles, k_texts, k_metadata,
            d_cids, d_distances, d_docs, d_chunks, s_cids, s_scores;
    end if;
    if src.distributed and use_dense then
        -- On the workers a SET LOCAL lasts until their transaction ends, so a caller's transaction block would
        -- keep these for its later statements. RESET, which Citus sends to them only in a transaction block,
        -- gives them the database's defaults there again (retrieve's own SET clauses:
        -- agentdb.db.distribute.carry_retrieve_settings); here the function's return restores them.
        reset hnsw.ef_search;
        reset enable_seqscan;
    end if;

    diag := diag || jsonb_build_object(
        'raw_result_count', case mode when 'dense' then dense_raw when 'lexical' then sparse_raw
                                      else dense_raw + sparse_raw end,
        'filtered_count', case when mode = 'lexical' then 0 else dense_raw - dense_kept end,
        'result_count', n_hits);
    if mode <> 'dense' then
        diag := diag || jsonb_build_object(
            'dense_raw_count', dense_raw,
            'dense_filtered_count', dense_raw - dense_kept,
            'sparse_raw_count', sparse_raw,
            'fused_candidate_count', case when mode = 'hybrid' then fused_count else 0 end,
            'lexical_path', lexical_path);
    end if;

    return json_build_object(
        'route', case when n_hits > 0 then 'found' else 'not_found' end,
        'hits', hits,
        'diagnostics', case when output_results
            then json_build_object('parameters', diag, 'input', json_build_object('query', query),
                                   'output', json_build_object('results', results))
            else json_build_object('parameters', diag, 'input', json_build_object('query', query)) end);
end;
$$;

-- One row per hit, for analysts: select * from agentdb.search('docs', 'wal archiving', mode => 'lexical').
-- Hybrid fusion as in agentdb.retrieve: fusion => 'convex', alpha => 0.5 for the convex combination.
create or replace function agentdb.search(
    source text,
    query text,
    query_embedding vector default null,
    mode text default null,
    top_k int default 10,
    rrf_k int default agentdb_internal.default_rrf_k(),
    threshold float8 default 0.5,
    filter jsonb default null,
    fusion text default 'rrf',
    alpha float8 default 0.5
) returns table (
    id text, chunk int, rank int, score float8, distance float8, bm25_score float8,
    rank_dense int, rank_sparse int, text text, metadata jsonb
)
language plpgsql as $$
#variable_conflict use_column
begin
    -- Without a mode: hybrid when a query vector is given, else lexical (a plain SQL call has no embedder).
    if mode is null and query_embedding is null then
        raise notice 'agentdb.search: no query_embedding, so mode => ''lexical''; pass a vector from the source''s model for hybrid';
    end if;
    return query
    select h.id, h.chunk, h.rank, h.score, h.distance, h.bm25_score, h.rank_dense, h.rank_sparse, h.text, h.metadata
    from json_to_recordset(
        agentdb.retrieve(source => source, query => query, query_embedding => query_embedding,
                         mode => coalesce(mode, case when query_embedding is null then 'lexical' else 'hybrid' end),
                         top_k => top_k, rrf_k => rrf_k, threshold => threshold,
                         scope => jsonb_build_object('filter', filter), fusion => fusion,
                         alpha => alpha, output_results => false) -> 'hits'
    ) as h(id text, chunk int, rank int, score float8, distance float8, bm25_score float8,
           rank_dense int, rank_sparse int, text text, metadata jsonb)
    order by h.rank;
end;
$$;

-- Documents similar to a stored one, by its stored vector (chunk 0); needs no model. The document itself
-- is excluded. (The id parameter is named doc_id: an input cannot share the name of the output column id.)
create or replace function agentdb.similar(
    source text, doc_id text, top_k int default 10, filter jsonb default null
) returns table (
    id text, chunk int, rank int, score float8, distance float8, text text, metadata jsonb
)
language plpgsql as $$
declare
    src agentdb.sources := agentdb_internal.source_named($1);
    r record;
    v vector;
begin
    select * into r from agentdb_internal.source_row_sql(src);
    execute format('select c.agentdb_embedding from %s c where %s = $1 and c.agentdb_embedding is not null'
                   ' order by %s limit 1', agentdb.source_relation(src), r.doc_id, r.chunk)
        into v using $2;
    if v is null then
        perform agentdb.not_found(
            format('source %L has no embedded document %L', src.name, $2), 'id');
    end if;
    return query
    select h.id, h.chunk, h.rank, h.score, h.distance, h.text, h.metadata
    from json_to_recordset(
        agentdb.retrieve(source => src.name, query => '', query_embedding => v, mode => 'dense', top_k => top_k,
                         threshold => 0, scope => jsonb_build_object('filter', filter), group_by_doc => true,
                         exclude_doc => $2, output_results => false) -> 'hits'
    ) as h(id text, chunk int, rank int, score float8, distance float8, text text, metadata jsonb)
    order by h.rank;
end;
$$;
