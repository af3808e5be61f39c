-- 1.1: the cursor reads the block layout only (a source in the row layout takes the plain SQL path), so
-- bm25_topk loses its `blocks` argument. The library of 1.1 exports only the new signature's symbol, so a
-- database still at 1.0 calling it fails cleanly (undefined function) until it is updated, never misreads.
\echo Use "ALTER EXTENSION agentdb_accel UPDATE TO '1.1'" to load this file. \quit

drop function bm25_topk(int, boolean, text[], float8[], bigint[], int[], int[], bigint[], int, float8, float8,
                        float8);

create function bm25_topk(source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[],
                          min_dls int[], max_spans bigint[], k int, avgdl float8, k1 float8, b float8)
returns table (cid bigint, bm25 float8)
as 'MODULE_PATHNAME', 'agentdb_accel_bm25_topk_blocks'
language c stable strict parallel safe;

revoke all on function bm25_topk(int, text[], float8[], bigint[], int[], int[], bigint[], int, float8, float8,
                                 float8) from public;
