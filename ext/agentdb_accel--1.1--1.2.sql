-- 1.2: the write path in C, tsv_blocks and tsv_total_len (the lexical triggers of a source in the block layout
-- call them when they are there). The cursor is unchanged.
\echo Use "ALTER EXTENSION agentdb_accel UPDATE TO '1.2'" to load this file. \quit

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
