"""agentdb: a retrieval agent that lives inside PostgreSQL.

The names below are imported on first use, so `import agentdb` loads no database driver, pydantic or
SQLAlchemy until something needs them (as pgvector-python keeps its top level light).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Each public name and the module that defines it.
_EXPORTS = {
    "AgentDBError": "agentdb.errors",
    "FieldMap": "agentdb.ingest.pipeline",
    "FieldSpec": "agentdb.sources",
    "Hit": "agentdb.retrieval",
    "IngestReport": "agentdb.ingest.pipeline",
    "Principal": "agentdb.auth",
    "Result": "agentdb.retrieval",
    "Settings": "agentdb.config",
    "Source": "agentdb.sources",
    "create_document_source": "agentdb.sources",
    "create_principal": "agentdb.auth",
    "get_source": "agentdb.sources",
    "ingest": "agentdb.ingest.pipeline",
    "list_sources": "agentdb.sources",
    "read_records": "agentdb.ingest.readers",
    "register_table": "agentdb.sources",
    "retrieve": "agentdb.retrieval",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentdb' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
