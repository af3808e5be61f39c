-- 1.6: the cursor reads a given table of posting blocks too: one shard of agentdb.posting_blocks on a Citus
-- worker (agentdb_internal.shard_maxscore, sql/040_retrieve.sql), whose key has the shard key after first_chunk
-- and the bounds after it. The signature of 1.5 keeps reading agentdb.posting_blocks.
\echo Use "ALTER EXTENSION agentdb_accel UPDATE TO '1.6'" to load this file. \quit

create function bm25_topk(source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[],
                          min_dls int[], max_spans bigint[], k int, avgdl float8, k1 float8, b float8,
                          blocks regclass)
returns table (cid bigint, bm25 float8)
as 'MODULE_PATHNAME', 'agentdb_accel_bm25_topk_blocks'
language c stable strict parallel safe;

revoke all on function bm25_topk(int, text[], float8[], bigint[], int[], int[], bigint[], int, float8, float8,
                                 float8, regclass) from public;
