"""Database access: the embedded server, the connection pool and the migration runner."""

from __future__ import annotations

from agentdb.config import Settings
from agentdb.db.server import start_embedded


def resolve_url(settings: Settings, *, keep_running: bool = False) -> str:
    """The URL to use: DATABASE_URL when given, else the embedded server (started if needed)."""
    if settings.database_url:
        return settings.database_url
    return start_embedded(settings.data_dir, keep_running=keep_running)
