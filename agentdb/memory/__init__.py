"""Memory: named stores written at run time, an entity graph per store, and recall ranked by recency,
importance and relevance (the Generative Agents formula, or the calibrated ranking), under the same
database permissions as sources.

    from agentdb.memory import write_records, recall, assemble

    write_records(conn, "user_{var.user_id}", [{"text": "Alex is allergic to shellfish", "importance": 9,
                  "relations": [{"subject": "Alex", "predicate": "allergic_to", "object": "shellfish"}]}],
                  variables={"user_id": 42}, embedder=embedder, principal=caller)
    result = recall(conn, "user_42", "what am I allergic to?", embedder=embedder, principal=caller)
    block = assemble(result, max_tokens=500).text      # "<memory>\\n...\\n</memory>"
"""

from agentdb.memory.models import (
    AssembledMemory,
    EntityIn,
    EntityOut,
    EntryNode,
    Fact,
    MemoryRecord,
    RecallCandidate,
    RecallOptions,
    RecallResult,
    RecordIn,
    RelationIn,
    RelationResult,
    StoreInfo,
    StoreSpec,
    Terms,
    TermScore,
    Weights,
    WriteReport,
)
from agentdb.memory.names import STORE_NAME, resolve_store_name, template_variables
from agentdb.memory.read import get_entity, get_record
from agentdb.memory.recall import (
    SEARCH_MEMORY_TOOL,
    assemble,
    estimate_tokens,
    recall,
    recall_options,
    search_memory,
)
from agentdb.memory.store import (
    Store,
    check_spec,
    create_store,
    drop_store,
    find_store,
    get_store,
    list_stores,
    store_info,
)
from agentdb.memory.write import (
    delete_record,
    write_entities,
    write_records,
    write_relations,
)

__all__ = [
    "STORE_NAME",
    "template_variables",
    "SEARCH_MEMORY_TOOL",
    "AssembledMemory",
    "EntityIn",
    "EntityOut",
    "EntryNode",
    "Fact",
    "MemoryRecord",
    "RecallCandidate",
    "RecallOptions",
    "RecallResult",
    "RecordIn",
    "RelationIn",
    "RelationResult",
    "Store",
    "StoreInfo",
    "StoreSpec",
    "TermScore",
    "Terms",
    "Weights",
    "WriteReport",
    "assemble",
    "check_spec",
    "create_store",
    "delete_record",
    "drop_store",
    "estimate_tokens",
    "find_store",
    "get_entity",
    "get_record",
    "get_store",
    "list_stores",
    "recall",
    "recall_options",
    "resolve_store_name",
    "search_memory",
    "store_info",
    "write_entities",
    "write_records",
    "write_relations",
]
