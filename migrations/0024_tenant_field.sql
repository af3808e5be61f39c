-- A document source's tenant field (agentdb/db/distribute.py, docs/scale-out.md): a string metadata field every
-- document carries. On a Citus coordinator the source is distributed by it (its table's `agentdb_tenant`
-- column, written by the ingest pipeline) instead of by document id, so a read whose filter or row filter
-- fixes the tenant goes to one shard. On one node it is recorded, and checked on every document, only.
alter table agentdb.sources add column tenant_field text;
