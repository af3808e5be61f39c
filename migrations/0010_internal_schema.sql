-- agentdb_internal: the helpers that take or return SQL text (the filter compiler and its fragments, the
-- row expressions of a source, the scope predicates, the pruned BM25 leg). They are not an interface:
-- nobody but agentdb itself and the principal roles it reads under may execute them (sql/099_internal_access.sql
-- grants those roles), so a database user cannot feed them SQL text of its own.
create schema agentdb_internal;
revoke all on schema agentdb_internal from public;
alter default privileges in schema agentdb_internal revoke execute on functions from public;
