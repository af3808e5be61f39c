-- The C twin of the plain SQL lexical leg (sql/025_accel.sql calls it; the application's role only).
\echo Use "CREATE EXTENSION agentdb_accel" to load this file. \quit

-- The best k chunks of block-layout source `source_id` (agentdb.posting_blocks) by Okapi BM25 over the query
-- `terms` (with the caller's weights idf x (k1 + 1) and statistics, arrays in one order), by (score desc,
-- chunk id), every chunk holding a term: the caller applies its filters.
create function bm25_topk(source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[],
                          min_dls int[], max_spans bigint[], k int, avgdl float8, k1 float8, b float8)
returns table (cid bigint, bm25 float8)
as 'MODULE_PATHNAME', 'agentdb_accel_bm25_topk_blocks'
language c stable strict parallel safe;

revoke all on function bm25_topk(int, text[], float8[], bigint[], int[], int[], bigint[], int, float8, float8,
                                 float8) from public;

-- The write path: a statement's posting blocks from its rows' tsvectors, and the length they add
-- (agentdb_internal.lexical_add_accel_sql, sql/020_lexical.sql, calls them).
create function tsv_blocks(chunk_ids bigint[], tsvs tsvector[])
returns table (term text, first_chunk bigint, last_chunk bigint, max_tf int, min_dl int, offs int4[], tfs int2[],
               dls int4[])
as 'MODULE_PATHNAME', 'agentdb_accel_tsv_blocks'
language c immutable strict parallel safe;

create function tsv_total_len(tsvs tsvector[]) returns bigint
as 'MODULE_PATHNAME', 'agentdb_accel_tsv_total_len'
language c immutable strict parallel safe;

revoke all on function tsv_blocks(bigint[], tsvector[]) from public;
revoke all on function tsv_total_len(tsvector[]) from public;
