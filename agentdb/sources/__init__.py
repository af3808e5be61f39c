"""The registry of searchable sources: document tables agentdb creates and existing tables registered in place.

One module per job: `catalog` (the Source and FieldSpec models and the agentdb.sources rows), `ddl` (the
document table, the lexical triggers, dropping a source), `vector_index` (the HNSW index), `register`
(reflecting an existing table and registering it in place), `merge` (rebuilding and merging the lexical
index). The names callers use are all here.
"""

from agentdb.sources.catalog import (
    DOCS_SCHEMA,
    FIELD_NAME,
    RESERVED_FIELDS,
    SOURCE_NAME,
    FieldSpec,
    FieldType,
    Source,
    add_fields,
    check_source_name,
    coerce_value,
    get_source,
    list_sources,
    pending_embeddings,
    record_embedding_backends,
    source_counts,
    source_name_taken,
    unknown_source,
)
from agentdb.sources.ddl import check_tenant_field, create_document_source, drop_source, write_lexical
from agentdb.sources.merge import (
    MERGE_LOCK_KEY,
    MERGE_SLICES,
    MERGE_WORKERS,
    merge_written_terms,
    optimize_source,
    rebuild_lexical,
)
from agentdb.sources.register import reflect_columns, register_table
from agentdb.sources.vector_index import drop_vector_index, ensure_vector_index

__all__ = [
    "MERGE_LOCK_KEY",
    "DOCS_SCHEMA",
    "FIELD_NAME",
    "MERGE_SLICES",
    "MERGE_WORKERS",
    "RESERVED_FIELDS",
    "SOURCE_NAME",
    "FieldSpec",
    "FieldType",
    "Source",
    "add_fields",
    "check_source_name",
    "coerce_value",
    "check_tenant_field",
    "create_document_source",
    "drop_source",
    "drop_vector_index",
    "ensure_vector_index",
    "get_source",
    "list_sources",
    "merge_written_terms",
    "optimize_source",
    "pending_embeddings",
    "rebuild_lexical",
    "record_embedding_backends",
    "reflect_columns",
    "register_table",
    "source_counts",
    "source_name_taken",
    "unknown_source",
    "write_lexical",
]
