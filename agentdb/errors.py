"""One exception tree: every failure has a stable numeric code, a name, a message and a JSON path."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import orjson
import psycopg
from pydantic import BaseModel, ValidationError

# Stored functions raise agentdb errors with this SQLSTATE and a JSON detail {"code", "name", "path"}.
DB_ERROR_SQLSTATE = "ADB00"


# Every error class by its code, filled as the classes are defined (as psycopg registers its SQLSTATEs), so
# that an error raised by a stored function comes back as the same class.
ERRORS_BY_CODE: dict[int, type[AgentDBError]] = {}


class AgentDBError(Exception):
    """Root of agentdb's errors; `http_status` is how the API reports it."""

    code: ClassVar[int] = 1000
    name: ClassVar[str] = "AgentDBError"
    http_status: ClassVar[int] = 500

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.code in ERRORS_BY_CODE:
            raise TypeError(f"error code {cls.code} is taken by {ERRORS_BY_CODE[cls.code].__name__}")
        ERRORS_BY_CODE[cls.code] = cls

    def __init__(self, message: str, path: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.hint = hint

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "code": self.code,
            "name": self.name,
            "message": self.message,
            "path": self.path,
        }
        if self.hint:
            body["hint"] = self.hint
        return body

    def __str__(self) -> str:
        where = f" (at {self.path})" if self.path else ""
        hint = f"\n  hint: {self.hint}" if self.hint else ""
        return f"{self.name} {self.code}: {self.message}{where}{hint}"


class InternalError(AgentDBError):
    """A failure of agentdb itself, not of the request: the client sees this class only; the log has the rest."""

    code, name, http_status = 1500, "InternalError", 500

    def __init__(self, message: str = "internal error; see the server log", path: str | None = None) -> None:
        super().__init__(message, path)


class Unauthorized(AgentDBError):
    """No API key, or a key that matches no principal."""

    code, name, http_status = 1401, "Unauthorized", 401


class Forbidden(AgentDBError):
    """The principal may not read this table or field, or use this tool."""

    code, name, http_status = 1403, "Forbidden", 403


class Conflict(AgentDBError):
    code, name, http_status = 1409, "Conflict", 409


class PayloadTooLarge(AgentDBError):
    code, name, http_status = 1413, "PayloadTooLarge", 413


class UnsupportedMediaType(AgentDBError):
    """A request body whose Content-Type is not one the endpoint reads (JSON, or NDJSON for uploads)."""

    code, name, http_status = 1415, "UnsupportedMediaType", 415


class TooManyRequests(AgentDBError):
    """The caller already holds its share of the server's connections; sent with Retry-After."""

    code, name, http_status = 1429, "TooManyRequests", 429


class InvalidAgentId(AgentDBError):
    code, name, http_status = 3001, "InvalidAgentId", 404


class GraphCompilationFailed(AgentDBError):
    code, name, http_status = 3003, "GraphCompilationFailed", 400


class AgentBusy(AgentDBError):
    code, name, http_status = 3004, "AgentBusy", 409


class ParamNotMutable(AgentDBError):
    code, name, http_status = 3006, "ParamNotMutable", 400


class InvalidParamValue(AgentDBError):
    code, name, http_status = 3007, "InvalidParamValue", 400


class StorageFileNotFound(AgentDBError):
    """An unknown source, file or stored object."""

    code, name, http_status = 3010, "StorageFileNotFound", 404


class StorageKindMismatch(AgentDBError):
    code, name, http_status = 3011, "StorageKindMismatch", 409


class InferenceFailed(AgentDBError):
    code, name, http_status = 4001, "InferenceFailed", 502


class InferenceTimeout(AgentDBError):
    code, name, http_status = 4002, "InferenceTimeout", 504


class StorageContentError(AgentDBError):
    """Bad stored or ingested content, or an embedding model / dimension mismatch."""

    code, name, http_status = 8003, "StorageContentError", 400


class DatabaseUnavailable(AgentDBError):
    code, name, http_status = 9001, "DatabaseUnavailable", 503


class DatabaseSetupError(AgentDBError):
    """The database lacks something agentdb needs (pgvector missing or too old, migrations not applied)."""

    code, name, http_status = 9002, "DatabaseSetupError", 503


class StatementTimeout(AgentDBError):
    """A statement ran past the configured statement timeout and was cancelled."""

    code, name, http_status = 9003, "StatementTimeout", 400


def from_db_error(exc: Exception) -> AgentDBError | None:
    """Translate an error raised by an agentdb stored function (or a cancelled statement) into the
    matching AgentDBError; None for anything else."""
    if getattr(exc, "sqlstate", None) == "57014":  # query_canceled: the statement timeout fired
        return StatementTimeout(
            "the query ran past the statement timeout and was cancelled",
            hint="narrow the query (filter, smaller limit) or raise AGENTDB_STATEMENT_TIMEOUT_MS",
        )
    state = getattr(exc, "sqlstate", None) or ""
    diag = getattr(exc, "diag", None)
    if state[:2] in ("22", "54") and diag is not None:
        # A value the database cannot take (data exception) or a query past its limits (e.g. "string is
        # too long for tsvector"): the request is at fault, not the database.
        return InvalidParamValue(
            f"the database refused a value of the request: {diag.message_primary}",
            hint="shorten or correct the input named in the message",
        )
    if state == "23505" and diag is not None:  # unique_violation: someone else wrote the same key first
        return Conflict(f"already exists: {diag.message_primary}", hint="use another name, or retry")
    if state[:2] == "23" and diag is not None:  # another integrity rule of the catalog
        return InvalidParamValue(f"the request breaks a rule of the database: {diag.message_primary}")
    remote = "connection to the remote node "
    if state == "08006" and diag is not None and (diag.message_primary or "").startswith(remote):
        # A Citus worker that the statement needs is down: the statement failed whole, naming the node.
        node = (diag.message_primary or "").removeprefix(remote).split(" failed", 1)[0]
        return DatabaseUnavailable(
            f"a node of the database cluster is unavailable: {node}",
            hint="start it again (agentdb start --workers N), then retry",
        )
    if diag is None or state != DB_ERROR_SQLSTATE:
        return None
    try:
        detail = orjson.loads(diag.message_detail or "{}")
    except orjson.JSONDecodeError:
        detail = {}
    cls = ERRORS_BY_CODE.get(int(detail.get("code", 0)), AgentDBError)
    return cls(diag.message_primary or "error", path=detail.get("path"), hint=diag.message_hint)


def is_outage(exc: Exception) -> bool:
    """Whether a database error means the database is unreachable, overloaded or shutting down (503, retry)
    rather than a problem of the request. A lost connection carries no SQLSTATE."""
    state = getattr(exc, "sqlstate", None)
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state[:2] in ("08", "53") or state in ("57P01", "57P02", "57P03")


ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_params(model: type[ModelT], data: Mapping[str, Any] | None, path: str) -> ModelT:
    """Validate a raw parameter object, reporting its first bad field as 3007 with the field's JSON path."""
    try:
        return model.model_validate(dict(data or {}))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = (
            ".".join([path, *(str(p) for p in error["loc"])])
            if path
            else ".".join(str(p) for p in error["loc"])
        )
        raise InvalidParamValue(f"{where}: {error['msg']}", path=where) from None
