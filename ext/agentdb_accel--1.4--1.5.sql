-- 1.5: narrow posting blocks (migrations/0025_narrow_posting_blocks.sql). The cursor reads a block's offsets and
-- lengths from whichever of their two columns holds them; the write path and the merge return each block's
-- arrays in the narrow column where they fit (two bytes a value instead of four), the other of each pair null.
\echo Use "ALTER EXTENSION agentdb_accel UPDATE TO '1.5'" to load this file. \quit

drop function tsv_blocks(bigint[], tsvector[]);
drop function merged_blocks(int, text[]);

-- The posting blocks of the chunks chunk_ids[i] whose tsvectors are tsvs[i].
create function tsv_blocks(chunk_ids bigint[], tsvs tsvector[])
returns table (term text, first_chunk bigint, last_chunk bigint, max_tf int, min_dl int, offs int4[],
               narrow_offs int2[], tfs int2[], dls int4[], narrow_dls int2[])
as 'MODULE_PATHNAME', 'agentdb_accel_tsv_blocks'
language c immutable strict parallel safe;

-- Source `source_id`'s posting blocks of each of `terms`, read under the caller's snapshot and cut again: the
-- term's postings in chunk order, 128 a block.
create function merged_blocks(source_id int, terms text[])
returns table (term text, first_chunk bigint, last_chunk bigint, max_tf int, min_dl int, offs int4[],
               narrow_offs int2[], tfs int2[], dls int4[], narrow_dls int2[])
as 'MODULE_PATHNAME', 'agentdb_accel_merged_blocks'
language c stable strict parallel safe;

revoke all on function tsv_blocks(bigint[], tsvector[]) from public;
revoke all on function merged_blocks(int, text[]) from public;
