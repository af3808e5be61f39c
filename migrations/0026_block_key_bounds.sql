-- The key index of the posting blocks carries each block's last chunk and bounds (max_tf, min_dl) beside its key.
-- The cursor (ext/agentdb_accel.c) meets a block on its index tuple, and for a term that is not essential it
-- reads the block's row only when a candidate chunk in [first_chunk, last_chunk] could reach theta with the
-- block's bound: at scifact-text 1M, 58% of the rows it read were passed over after reading (bench/LOG.md,
-- 2026-12-04, night). The key and its uniqueness are unchanged.
-- On a Citus coordinator the table is a reference table: Citus takes an ADD CONSTRAINT only as the sole command
-- of its ALTER TABLE, and carries a statement to the workers as the text it was sent in (so each goes alone,
-- from a DO block, not as two statements of one query string).
do $$
begin
    alter table agentdb.posting_blocks drop constraint posting_blocks_pkey;
    alter table agentdb.posting_blocks add constraint posting_blocks_pkey
        primary key (source_id, term, first_chunk) include (last_chunk, max_tf, min_dl);
end
$$;
