-- Per-term bounds for top-k pruning of the BM25 leg (MaxScore): the largest term frequency and the
-- shortest chunk among the term's postings. A term's BM25 contribution to any chunk is at most
-- idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)) at (max_tf, min_dl), whatever avgdl is.
-- Insertions widen the bounds; deletions leave them (still valid, maybe loose); a rebuild tightens them.
alter table agentdb.term_stats
    add column max_tf int not null default 2147483647,
    add column min_dl int not null default 0;

update agentdb.term_stats s
set max_tf = b.max_tf, min_dl = b.min_dl
from (select source_id, term, max(tf) as max_tf, min(dl) as min_dl
      from agentdb.postings group by source_id, term) b
where s.source_id = b.source_id and s.term = b.term;
