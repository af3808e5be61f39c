-- Block postings: a second layout of a source's lexical index, chosen per source (agentdb.sources.lexical_layout).
--   'rows'   one row of agentdb.postings per term and chunk (the layout so far, and the default);
--   'blocks' one row of agentdb.posting_blocks per term and block of up to 128 chunks: the chunks' ids as int4
--            offsets from the block's first chunk, their term frequencies (int2: a tsvector keeps at
--            most 256 positions a lexeme) and their lengths, with the block's largest term frequency and
--            shortest chunk: about 10 bytes a posting instead of about 130.
-- A block holds the postings one write added (a statement's rows, cut into blocks of 128 per term); removals
-- rewrite the blocks that held the removed chunks; agentdb.lexical_optimize merges a source's partly filled
-- blocks into full ones. The statistics (agentdb.term_stats, agentdb.corpus_stats) are the same for both layouts.
alter table agentdb.sources
    add column lexical_layout text not null default 'rows' check (lexical_layout in ('rows', 'blocks'));

create table agentdb.posting_blocks (
    source_id   int not null references agentdb.sources (id) on delete cascade,
    term        text not null,
    first_chunk bigint not null,
    last_chunk  bigint not null,
    max_tf      int not null,
    min_dl      int not null,
    offs        int4[] not null,
    tfs         int2[] not null,
    dls         int4[] not null,
    primary key (source_id, term, first_chunk)
);

-- Blocks of one term may overlap in chunk range (a rewritten chunk is added as a new block; concurrent
-- writers interleave ids). max_span bounds last_chunk - first_chunk over the term's blocks, so the blocks that
-- may hold chunk x are those with first_chunk between x - max_span and x (never tighter than the blocks).
alter table agentdb.term_stats add column max_span bigint not null default 0;

-- Principals' roles never read blocks: the sources they may be granted keep the 'rows' layout, whose postings
-- have per-chunk row security (sql/050_principals.sql). The restrictive policy makes that hold even if a grant
-- ever named the table; the owner (the application) bypasses row security.
alter table agentdb.posting_blocks enable row level security;
create policy agentdb_posting_blocks_all on agentdb.posting_blocks using (true) with check (true);
create policy agentdb_posting_blocks_no_principal on agentdb.posting_blocks as restrictive
    using (left(current_user, 10) <> 'agentdb_p_');
