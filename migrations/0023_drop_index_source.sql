-- agentdb_internal.index_source, the source-by-name lookup of the index functions, became
-- agentdb_internal.source_named (sql/010_errors.sql), which every function taking a source by name uses.
-- Re-installing sql/ drops only the other signatures of the functions it defines, so the old name is dropped
-- here, once.
drop function if exists agentdb_internal.index_source(text);
