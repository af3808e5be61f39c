-- 1.4: a merge of a source's posting blocks cut in C (agentdb.lexical_optimize calls it; the application's role
-- only, like the write path).
\echo Use "ALTER EXTENSION agentdb_accel UPDATE TO '1.4'" to load this file. \quit

-- Source `source_id`'s posting blocks of each of `terms`, read under the caller's snapshot and cut again: the
-- term's postings in chunk order, 128 a block.
create function merged_blocks(source_id int, terms text[])
returns table (term text, first_chunk bigint, last_chunk bigint, max_tf int, min_dl int, offs int4[], tfs int2[],
               dls int4[])
as 'MODULE_PATHNAME', 'agentdb_accel_merged_blocks'
language c stable strict parallel safe;

revoke all on function merged_blocks(int, text[]) from public;
