"""Settings read once from arguments or the environment; nothing else in agentdb calls os.getenv."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# Defaults that several doors share (Python, HTTP, the CLI), each written once here.
# RRF's k: a hit at rank r of a leg adds 1 / (k + r) (agentdb.retrieve's own default in SQL is the same).
RRF_K = 60
# Memory recency: the calibrated ranking halves it every HALF_LIFE_HOURS x importance^2 hours since the last
# access; the Generative Agents formula multiplies it by DECAY every hour.
MEMORY_HALF_LIFE_HOURS = 72.0
MEMORY_DECAY = 0.995
# A file holding the primary's URL, re-read when it may have changed (a failover rewrites it).
URL_FILE_ENV = "DATABASE_URL_FILE"


@dataclass(frozen=True)
class Settings:
    """Where the database is, where the embedded server keeps its data, and how to serve."""

    database_url: str | None = None
    # A file holding the primary's URL (DATABASE_URL_FILE): read at start instead of DATABASE_URL, and watched
    # by a running server, which moves to the server it names once that accepts writes (a failover).
    database_url_file: Path | None = None
    # Streaming replicas of DATABASE_URL (or of the embedded server) that serve reads.
    replica_urls: tuple[str, ...] = ()
    # A replica whose replay lags more than this leaves the rotation until it catches up.
    max_replica_lag_ms: float = 1000.0
    # How long a read that names a WAL position (min_lsn) waits for a replica to replay it before the primary
    # serves it.
    replica_wait_ms: float = 500.0
    # How often the monitor checks every replica's role and replay lag (and the primary's position).
    replica_check_interval_ms: float = 250.0
    data_dir: Path = field(default_factory=lambda: Path(".agentdb"))
    host: str = "127.0.0.1"
    port: int = 8080
    embedding_model: str = DEFAULT_MODEL
    # How the bundled model runs: "onnx" (int8 ONNX Runtime, exported on first use into data_dir/models),
    # "torch" (sentence-transformers), or "auto" (onnx, falling back to torch when the export fails).
    embed_backend: str = "auto"
    pool_min_size: int = 1
    pool_max_size: int = 10
    statement_timeout_ms: int = 30_000
    # The body limit of the bulk uploads (documents, explicit edges, memory records, entities, relations)...
    max_body_bytes: int = 32 * 1024 * 1024
    # ... and of every other request (a retrieval request, a saved agent, a navigation: kilobytes).
    max_request_bytes: int = 1024 * 1024
    # The work one retrieval request may ask for, checked when it is validated (3007 at the offending field):
    # results over all its queries (the sum of their limits), chunks read by neighbour expansion (that sum
    # times expand_window), nodes a ranked navigation reads (max_nodes) and start keys it is offered.
    max_results: int = 2_000
    max_expanded_chunks: int = 10_000
    max_nodes_read: int = 200
    max_start_keys: int = 256
    # How many requests one principal may have in flight at once (429 beyond); 0: half the pool.
    principal_concurrency: int = 0
    # Extra Host names and Origins a keyless (no principals) server answers besides its own loopback ones.
    allowed_hosts: tuple[str, ...] = ()
    # Serve without principals on a non-loopback bind (a container whose port is published only on the
    # host's loopback); off by default.
    allow_open: bool = False
    # How often the server looks for rows of registered tables that need an embedding; 0 turns it off.
    embed_interval_s: float = 2.0
    allowed_origins: tuple[str, ...] = ()
    anthropic_api_key: str | None = None
    anthropic_base_url: str | None = None
    # `agentdb mcp` over stdio runs as the principal whose key this is (AGENTDB_API_KEY).
    api_key: str | None = None
    # What one MCP session may spend (agentdb.mcp): tool calls, nodes (documents) read, bytes returned.
    mcp_max_tool_calls: int = 200
    mcp_max_nodes_read: int = 1_000
    mcp_max_bytes: int = 4 * 1024 * 1024

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Build settings from AGENTDB_* / DATABASE_URL variables; keyword overrides win when not None."""
        env = os.environ
        url_file = Path(env[URL_FILE_ENV]) if env.get(URL_FILE_ENV) else None
        database_url = read_url_file(url_file) if url_file is not None else env.get("DATABASE_URL") or None
        settings = cls(
            database_url=database_url,
            database_url_file=url_file,
            replica_urls=_names(env.get("AGENTDB_REPLICA_URLS")),
            max_replica_lag_ms=float(env.get("AGENTDB_MAX_REPLICA_LAG_MS", "1000")),
            replica_wait_ms=float(env.get("AGENTDB_REPLICA_WAIT_MS", "500")),
            replica_check_interval_ms=float(env.get("AGENTDB_REPLICA_CHECK_INTERVAL_MS", "250")),
            data_dir=Path(env["AGENTDB_DATA_DIR"])
            if env.get("AGENTDB_DATA_DIR")
            else find_data_dir(Path.cwd()),
            host=env.get("AGENTDB_HOST", "127.0.0.1"),
            port=int(env.get("AGENTDB_PORT", "8080")),
            embedding_model=env.get("AGENTDB_MODEL", DEFAULT_MODEL),
            embed_backend=env.get("AGENTDB_EMBED_BACKEND", "auto").strip().lower() or "auto",
            statement_timeout_ms=int(env.get("AGENTDB_STATEMENT_TIMEOUT_MS", "30000")),
            max_body_bytes=int(env.get("AGENTDB_MAX_BODY_BYTES", str(32 * 1024 * 1024))),
            max_request_bytes=int(env.get("AGENTDB_MAX_REQUEST_BYTES", str(1024 * 1024))),
            max_results=int(env.get("AGENTDB_MAX_RESULTS", "2000")),
            max_expanded_chunks=int(env.get("AGENTDB_MAX_EXPANDED_CHUNKS", "10000")),
            max_nodes_read=int(env.get("AGENTDB_MAX_NODES_READ", "200")),
            max_start_keys=int(env.get("AGENTDB_MAX_START_KEYS", "256")),
            principal_concurrency=int(env.get("AGENTDB_PRINCIPAL_CONCURRENCY", "0")),
            allowed_hosts=_names(env.get("AGENTDB_ALLOWED_HOSTS")),
            allow_open=env.get("AGENTDB_ALLOW_OPEN", "") in ("1", "true", "yes"),
            embed_interval_s=float(env.get("AGENTDB_EMBED_INTERVAL_S", "2")),
            allowed_origins=_names(env.get("AGENTDB_ALLOWED_ORIGINS")),
            anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
            anthropic_base_url=env.get("ANTHROPIC_BASE_URL") or None,
            api_key=env.get("AGENTDB_API_KEY") or None,
            mcp_max_tool_calls=int(env.get("AGENTDB_MCP_MAX_TOOL_CALLS", "200")),
            mcp_max_nodes_read=int(env.get("AGENTDB_MCP_MAX_NODES_READ", "1000")),
            mcp_max_bytes=int(env.get("AGENTDB_MCP_MAX_BYTES", str(4 * 1024 * 1024))),
        )
        given = {k: v for k, v in overrides.items() if v is not None}
        if "data_dir" in given:
            given["data_dir"] = Path(str(given["data_dir"]))
        return replace(settings, **given)  # type: ignore[arg-type]


def _names(text: str | None) -> tuple[str, ...]:
    """A comma-separated environment list."""
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


DATA_DIR_NAME = ".agentdb"


def find_data_dir(start: Path) -> Path:
    """The `.agentdb` directory of `start` or of its nearest parent that has one (as git finds `.git`), so a
    command run in a subdirectory uses the project's database instead of creating a second, empty one;
    `start/.agentdb` when there is none yet."""
    start = start.resolve()
    for directory in (start, *start.parents):
        if has_database(directory / DATA_DIR_NAME):
            return directory / DATA_DIR_NAME
    return start / DATA_DIR_NAME


def has_database(data_dir: Path) -> bool:
    """Whether `data_dir` holds an embedded server's database (made by its first start)."""
    return (data_dir.expanduser() / "pg").is_dir()


def read_url_file(path: Path) -> str:
    """The connection URL in `path` (its first non-empty line); 9002 when it cannot be read or is empty."""
    from agentdb.errors import DatabaseSetupError

    try:
        text = path.read_text()
    except OSError as exc:
        raise DatabaseSetupError(
            f"cannot read the primary's URL from {path}: {exc.strerror or exc}", path=URL_FILE_ENV
        ) from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise DatabaseSetupError(f"{path} names no database URL (it is empty)", path=URL_FILE_ENV)
    return lines[0]
