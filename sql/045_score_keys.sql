-- Relevance of given documents to a query, for navigation: both legs of agentdb.retrieve restricted to
-- the candidate keys, in the caller's scope. Unlike the fused rank of a search, these are absolute scores
-- (a document's best chunk's cosine similarity and its best chunk's BM25 with the source's global
-- statistics), so candidates met at different points of a walk can be compared with each other.

-- For each key of `keys` that the caller may read (the `scope`, its query filters and row filter, and
-- row-level security, as agentdb.read applies them): `dense`, the highest cosine similarity (1 - cosine distance)
-- between `query_embedding` and the document's chunks (null without an embedding), and `lexical`, the
-- highest Okapi BM25 score of its chunks for `query` (0 when no term matches). Keys that are missing or
-- hidden return no row.
create or replace function agentdb.score_keys(
    source text,
    keys text[],
    query text default '',
    query_embedding vector default null,
    scope jsonb default null
) returns table (doc_id text, dense float8, lexical float8)
language plpgsql stable
set jit = off
as $$
declare
    src agentdb.sources := agentdb_internal.source_named(score_keys.source);
    r record;
    s record;
    qt record;
    stats agentdb.corpus_stats;
    avgdl float8;
begin
    if query_embedding is not null and vector_dims(query_embedding) <> src.embedding_dim then
        perform agentdb.content_mismatch(
            format('query_embedding has dimension %s but source %L has dimension %s',
                   vector_dims(query_embedding), src.name, src.embedding_dim), 'query_embedding');
    end if;
    if coalesce(cardinality(keys), 0) = 0 then
        return;
    end if;
    select * into stats from agentdb.corpus_stats x where x.source_id = src.id;
    avgdl := greatest(coalesce(stats.total_len, 0)::float8 / greatest(coalesce(stats.n_chunks, 0), 1), 1e-9);
    select * into r from agentdb_internal.source_row_sql(src);
    s := agentdb_internal.scope_predicate(src, score_keys.scope, array['$4', '$5', '$6', '$7']);
    select * into qt from agentdb_internal.query_terms(src.id, to_tsvector(src.ts_config, coalesce(query, '')),
                                                       coalesce(stats.n_chunks, 0)::float8, src.bm25_k1);
    return query execute format($q$
        with c as materialized (
            select %1$s as doc_id, c.agentdb_chunk_id as cid, c.agentdb_embedding as emb
            from %2$s c where %1$s = any($1) and (%3$s) and (%4$s)),
        lex as (
            select p.chunk_id, sum(p.wk * p.tf / (p.tf + ($10 * (1 - $11)) + ($10 * $11 / $12) * p.dl)) as bm25
            from %5$s p
            where p.chunk_id in (select cid from c)
            group by p.chunk_id)
        select c.doc_id, max(1 - (c.emb <=> $2))::float8, coalesce(max(l.bm25), 0)::float8
        from c left join lex l on l.chunk_id = c.cid
        group by c.doc_id $q$,
        r.doc_id, agentdb.source_relation(src), s.pred, s.row_pred,
        -- On a distributed source, term_postings' branch of its layout written out: Citus plans no inlined SQL
        -- function over a distributed table (see agentdb.retrieve's lexical leg). Its blocks are read on each
        -- shard's worker (agentdb_internal.shard_block_postings, one call an anchor).
        case when src.distributed and src.lexical_layout = 'blocks'
             then '(select (x.p).term, (x.p).chunk_id, t.wk, (x.p).tf, (x.p).dl'
                  ' from (select agentdb_internal.shard_block_postings($8, $3, a.key) as p'
                  '       from agentdb.shard_anchors a) x'
                  ' join unnest($3, $9) as t(term, wk) on t.term = (x.p).term)'
             when src.distributed
             then '(select t.term, p.chunk_id, t.wk, p.tf, p.dl from unnest($3, $9) as t(term, wk)'
                  ' join agentdb.postings p on p.source_id = $8 and p.term = t.term)'
             else 'agentdb_internal.term_postings($8, $3, $9)' end)
        using keys, query_embedding, qt.held, s.filter_params, s.row_params, s.fq_params, s.ex_params,
              src.id, qt.weights, src.bm25_k1, src.bm25_b, avgdl;
end;
$$;
