-- What one write adds to a source's lexical statistics, computed before the write takes any shared lock: the
-- lexical triggers (sql/020_lexical.sql) insert a statement's postings or blocks first, keep this delta in a
-- variable, and only then lock the source's corpus_stats row and add the delta to corpus_stats and term_stats
-- (agentdb_internal.lexical_apply). Concurrent writers of one source thus queue only for the statistics.
-- The arrays run in lockstep, one element a term, in term order.
create type agentdb_internal.lexical_delta as (
    n_chunks  bigint,
    total_len bigint,
    terms     text[],
    dfs       bigint[],
    max_tfs   int[],
    min_dls   int[],
    max_spans bigint[]
);
