-- Each posting block names the shard it lives on. On a Citus coordinator agentdb.posting_blocks is distributed by
-- shard_key, co-located with agentdb.postings (agentdb/db/distribute.py, distribute_blocks): every block of a shard
-- carries that shard's anchor key (agentdb.shard_anchors), and holds only chunks of that shard, so the lexical
-- leg reads a shard's blocks where its chunks are. Null on one node, where the key is not used.
alter table agentdb.posting_blocks add column shard_key text;
