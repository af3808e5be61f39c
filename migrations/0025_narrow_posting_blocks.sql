-- Narrow posting blocks: a block's offsets and lengths take two bytes each where they fit, four where they do not.
-- A block keeps its chunk ids as offsets from its first chunk and its chunks' lengths; most offsets and every
-- length of ordinary chunks fit in int2 (at scifact-text 1M: 79% of the postings lie in blocks whose chunk
-- range is under 32,768, and no chunk is longer than 343 lexemes), and two bytes saved on each of them is a
-- fifth of the index. Each array is held in exactly one of two columns:
--   offs / narrow_offs  int4[] / int2[]  narrow when last_chunk - first_chunk <= 32767;
--   dls / narrow_dls    int4[] / int2[]  narrow when every length of the block is <= 32767.
-- Readers take coalesce(wide, narrow) (agentdb_internal.block_ints in SQL, read_block in ext/). Writers choose
-- the narrow column whenever it fits; the blocks written before stay wide, and are read as they are, until a
-- merge, a removal or a rebuild rewrites them.
alter table agentdb.posting_blocks
    alter column offs drop not null,
    alter column dls drop not null,
    add column narrow_offs int2[],
    add column narrow_dls int2[],
    add constraint posting_blocks_one_offs check ((offs is null) <> (narrow_offs is null)),
    add constraint posting_blocks_one_dls check ((dls is null) <> (narrow_dls is null));
