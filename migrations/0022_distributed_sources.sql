-- Sources distributed by Citus (agentdb/db/distribute.py, docs/scale-out.md). A distributed source table is
-- spread over the workers by document id, and its postings must live on the shard of their chunk: each
-- posting carries its chunk's document id (the distribution column of agentdb.postings on a cluster). On one
-- node it stays null (the lexical triggers write none): a null costs nothing in a posting's row (its null
-- bitmap fits in the header's alignment padding). A distributed table cannot have triggers, so the writers
-- of a distributed source maintain its lexical index and statistics themselves, in the writing transaction
-- (agentdb_internal.lexical_write); `distributed` tells them so.
alter table agentdb.postings add column doc_id text;
alter table agentdb.sources add column distributed boolean not null default false;
