"""The retrieval agent in pipeline mode: validate every query and permission first, run each
query through agentdb.retrieve under the caller's scope (deepened and expanded when asked), merge the hit
lists by RRF, optionally generate an answer, and report steps, usage and diagnostics.

  * `models`: the request and response models; `AgentHit.of` makes a hit's client JSON
  * `validate`: every check before anything runs, and the `Plan` it yields
  * `scope`: per-query error paths (the read scope itself is auth.read_scope)
  * `query`: one query (retrieval, deepening, expansion)
  * `merge`: RRF merging of several queries' hits
  * `stream`: the bridge that streams a model call's text from a worker thread
  * `pipeline`: the whole run as an event stream, and its JSON response

Every step passes the one hit type, `agentdb.retrieval.Hit`."""

from agentdb.agent.merge import MERGE_RRF_K, merge
from agentdb.agent.models import (
    MAX_QUERY_CHARS,
    AgentHit,
    FullTextSearch,
    IndexScores,
    QuerySpec,
    RetrievalOptions,
    RetrievalRequest,
    RetrievalResponse,
    Step,
    Steps,
    UsageOut,
)
from agentdb.agent.pipeline import Event, json_events, respond, run
from agentdb.agent.scope import in_query
from agentdb.agent.validate import Plan, validate

__all__ = [
    "MAX_QUERY_CHARS",
    "MERGE_RRF_K",
    "AgentHit",
    "Event",
    "FullTextSearch",
    "IndexScores",
    "Plan",
    "QuerySpec",
    "RetrievalOptions",
    "RetrievalRequest",
    "RetrievalResponse",
    "Step",
    "Steps",
    "UsageOut",
    "in_query",
    "json_events",
    "merge",
    "respond",
    "run",
    "validate",
]
