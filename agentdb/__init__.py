"""agentdb: a retrieval agent that lives inside PostgreSQL."""

from agentdb.auth import Principal, create_principal
from agentdb.config import Settings
from agentdb.errors import AgentDBError
from agentdb.ingest.pipeline import FieldMap, IngestReport, ingest
from agentdb.ingest.readers import read_records
from agentdb.retrieval import Hit, Result, retrieve
from agentdb.sources import (
    FieldSpec,
    Source,
    create_document_source,
    get_source,
    list_sources,
    register_table,
)

__version__ = "0.1.0"

__all__ = [
    "AgentDBError",
    "FieldMap",
    "FieldSpec",
    "Hit",
    "IngestReport",
    "Principal",
    "Result",
    "Settings",
    "Source",
    "__version__",
    "create_document_source",
    "create_principal",
    "get_source",
    "ingest",
    "list_sources",
    "read_records",
    "register_table",
    "retrieve",
]
