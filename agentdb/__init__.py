"""agentdb: a retrieval agent that lives inside PostgreSQL."""

from agentdb.config import Settings
from agentdb.errors import AgentDBError
from agentdb.retrieval import Hit, Result, retrieve

__version__ = "0.1.0"

__all__ = ["AgentDBError", "Hit", "Result", "Settings", "__version__", "retrieve"]
