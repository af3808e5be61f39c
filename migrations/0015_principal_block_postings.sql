-- Principals may now be granted sources kept in blocks (migration 0013 kept them to the 'rows' layout). Their
-- roles still read no row of agentdb.posting_blocks: a block holds postings of up to 128 chunks, some of which
-- the role may not read, and row security cannot hide part of an array. They read the postings of the chunks
-- they may read one a row through agentdb_internal.principal_block_postings (sql/020_lexical.sql), a SECURITY
-- DEFINER function that applies the predicate of the principal's own policy on the source table. The policy
-- below is unchanged; its comment says why it stays.
comment on policy agentdb_posting_blocks_no_principal on agentdb.posting_blocks is
    'principals'' roles read no block (a block mixes chunks they may and may not read); their block postings come '
    'from agentdb_internal.principal_block_postings, one a row, of the chunks they may read';
