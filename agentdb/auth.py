"""Principals: API keys with the sources they may read, a row filter, a field grant and tool permissions.

Two layers enforce a principal. The request layer (`authenticate`, `check_table`, `check_fields`,
`check_filter`, `check_tool`) answers 401/403 before any query runs. The database layer makes a bug in
the first harmless: every principal has its own NOLOGIN role (`agentdb_p_<database oid>_<id>`) with
SELECT on exactly its source tables and row-level security policies compiled from its row filter
(sql/050_principals.sql), and `principal_scope` runs the principal's reads under that role.

Keys are `adb_` + 32 random bytes (url-safe base64), shown once. The database keeps the first 12
characters in clear (to find the row) and a salted SHA-256 of the whole key. A fast hash is enough here:
the key carries 256 bits of entropy, so unlike a password it cannot be guessed from a stolen hash, while
a slow hash (scrypt, bcrypt) would spend tens of milliseconds of CPU on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentdb.errors import (
    AgentDBError,
    Conflict,
    DatabaseSetupError,
    Forbidden,
    InvalidParamValue,
    StorageFileNotFound,
    Unauthorized,
    from_db_error,
)
from agentdb.filters import validate_filter
from agentdb.sources import Source, get_source

# "ingest" lets a principal add and delete documents of its tables (writes run as the application).
TOOLS = frozenset({"search", "tree_search", "graph_search", "memory", "ingest"})
PRINCIPAL_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")
KEY_SCHEME = "adb_"
# The key as issued: the scheme and 43 url-safe base64 characters (32 bytes).
_KEY = re.compile(r"^adb_[A-Za-z0-9_-]{43}$")
# "adb_" + 8 key characters (48 bits) find the row; the other ~208 bits are only ever compared hashed.
_PREFIX_LEN = 12
# Projectable names every source has besides its metadata fields (see agentdb.retrieve's `fields`).
BUILTIN_FIELDS = ("title", "text")
# Hashed when no row has the key's prefix, so that an unknown key costs the same work as a wrong one.
_DUMMY_HASH = "sha256$" + "00" * 16 + "$" + "00" * 32

# The request field behind each check of agentdb.principals, for integrity errors.
_CONSTRAINT_PATHS = {"principals_tools_check": "tools", "principals_name_check": "name"}

_COLUMNS = "id, name, tables, row_filter, fields, tools, role"
# The role name derives from the id, so the id is drawn first (agentdb.principal_role).
_INSERT = (
    "with n as (select nextval(pg_get_serial_sequence('agentdb.principals', 'id'))::int as id)"
    " insert into agentdb.principals (id, name, key_hash, key_prefix, tables, row_filter, fields, tools, role)"
    " overriding system value"
    " select n.id, %s, %s, %s, %s, %s, %s, %s, agentdb.principal_role(n.id) from n"
    " returning id, name, tables, row_filter, fields, tools, role"
)


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `fields` None means every field; `role` is its database role."""

    id: int
    name: str
    tables: tuple[str, ...]
    row_filter: dict[str, Any] | None
    fields: tuple[str, ...] | None
    tools: frozenset[str]
    role: str


def _principal(row: dict[str, Any]) -> Principal:
    return Principal(
        id=int(row["id"]),
        name=row["name"],
        tables=tuple(row["tables"] or ()),
        row_filter=row["row_filter"],
        fields=None if row["fields"] is None else tuple(row["fields"]),
        tools=frozenset(row["tools"] or ()),
        role=row["role"],
    )


def _hash_key(key: str, salt: bytes) -> str:
    return f"sha256${salt.hex()}${hashlib.sha256(salt + key.encode()).hexdigest()}"


def _key_matches(key: str, stored: str) -> bool:
    """Constant-time comparison of `key` with a stored `sha256$salt$digest`."""
    try:
        scheme, salt, _ = stored.split("$")
        expected = _hash_key(key, bytes.fromhex(salt))
    except ValueError:
        return False
    return scheme == "sha256" and hmac.compare_digest(expected.encode(), stored.encode())


def _as_list(values: Iterable[str] | str | None, path: str) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        raise InvalidParamValue(f"{path} must be a list of names, not a string", path=path)
    items = list(values)
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise InvalidParamValue(f"{path} must hold non-empty names", path=f"{path}[{i}]")
    return list(dict.fromkeys(items))  # de-duplicated, in order


def _db_error(exc: psycopg.Error) -> AgentDBError | None:
    """The AgentDBError for a database error raised while (un)installing a principal, if there is one."""
    if isinstance(exc, psycopg.errors.UniqueViolation | psycopg.errors.DuplicateObject):
        return Conflict(f"the principal already exists: {exc.diag.message_primary}", path="name")
    if isinstance(exc, psycopg.errors.IntegrityError):
        return InvalidParamValue(
            f"the principal breaks a rule of the catalog: {exc.diag.message_primary}",
            path=_CONSTRAINT_PATHS.get(exc.diag.constraint_name or ""),
        )
    mapped = from_db_error(exc)
    if mapped is not None:
        return mapped
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return DatabaseSetupError(
            f"the database user cannot set up the principal's role and policies: {exc.diag.message_primary}",
            hint="agentdb needs CREATEROLE and ownership of the source tables (or a superuser)",
        )
    return None


def create_principal(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    tables: Sequence[str],
    row_filter: dict[str, Any] | None = None,
    fields: Sequence[str] | None = None,
    tools: Iterable[str] = ("search",),
) -> tuple[Principal, str]:
    """Create principal `name` with its database role and policies; return it and its key (shown once).

    Every table must be a known source (3010 at `tables[i]`); the row filter must compile against every
    one of them (3007 at `row_filter...`); each field must exist in every table (3007 at `fields[i]`;
    "title" and "text" always exist); tools are a non-empty subset of TOOLS (3007 at `tools[i]`). A name
    in use is 1409 Conflict. Runs in one transaction: on any error nothing is created.
    """
    if not isinstance(name, str) or not PRINCIPAL_NAME.match(name):
        raise InvalidParamValue(
            f"invalid principal name {name!r}: use lowercase letters, digits, _, . and -, starting with a letter"
            " (max 63)",
            path="name",
        )
    table_list = _as_list(tables, "tables") or []
    field_list = _as_list(fields, "fields")
    tool_list = _as_list(tools, "tools") or []
    if not tool_list:
        raise InvalidParamValue("a principal needs at least one tool", path="tools")
    for i, tool in enumerate(tool_list):
        if tool not in TOOLS:
            raise InvalidParamValue(
                f"unknown tool {tool!r}; known: {', '.join(sorted(TOOLS))}", path=f"tools[{i}]"
            )
    if row_filter is not None and not isinstance(row_filter, dict):
        raise InvalidParamValue("row_filter must be a JSON object", path="row_filter")

    key = KEY_SCHEME + secrets.token_urlsafe(32)
    try:
        with conn.transaction():
            sources = _check_sources(conn, table_list)
            _check_grant_fields(sources, field_list)
            for source in sources:
                _check_row_filter(conn, source, row_filter)
            if conn.execute("select 1 from agentdb.principals where name = %s", (name,)).fetchone():
                raise Conflict(f"principal {name!r} already exists", path="name")
            with conn.cursor(row_factory=dict_row) as cur:
                row = cur.execute(
                    _INSERT,
                    (
                        name,
                        _hash_key(key, secrets.token_bytes(16)),
                        key[:_PREFIX_LEN],
                        table_list,
                        None if row_filter is None else Jsonb(row_filter),
                        field_list,
                        tool_list,
                    ),
                ).fetchone()
            assert row is not None
            conn.execute("select agentdb.principal_install(principal_id => %s)", (row["id"],))
    except psycopg.Error as exc:
        error = _db_error(exc)
        if error is None:
            raise
        raise error from None
    return _principal(row), key


def _check_sources(conn: psycopg.Connection[Any], tables: list[str]) -> list[Source]:
    sources = []
    for i, table in enumerate(tables):
        try:
            sources.append(get_source(conn, table))
        except StorageFileNotFound as exc:
            raise StorageFileNotFound(exc.message, path=f"tables[{i}]", hint=exc.hint) from None
    return sources


def _check_grant_fields(sources: list[Source], fields: list[str] | None) -> None:
    for i, field in enumerate(fields or ()):
        for source in sources:
            if field not in BUILTIN_FIELDS and source.field(field) is None:
                known = ", ".join([*BUILTIN_FIELDS, *(f.name for f in source.fields)])
                raise InvalidParamValue(
                    f"source {source.name!r} has no field {field!r}; known: {known}", path=f"fields[{i}]"
                )


def _check_row_filter(
    conn: psycopg.Connection[Any], source: Source, row_filter: dict[str, Any] | None
) -> None:
    try:
        validate_filter(conn, source, row_filter, "row_filter")
    except InvalidParamValue as exc:
        raise InvalidParamValue(
            f"{exc.message} (source {source.name!r})", path=exc.path, hint=exc.hint
        ) from None


def delete_principal(conn: psycopg.Connection[Any], name: str) -> None:
    """Delete principal `name` with its role, grants and policies (3010 when there is none); its key stops
    working at once."""
    try:
        with conn.transaction():
            row = conn.execute(
                "select id from agentdb.principals where name = %s for update", (name,)
            ).fetchone()
            if row is None:
                raise StorageFileNotFound(
                    f"unknown principal {name!r}", path="name", hint="list them with `agentdb principal list`"
                )
            conn.execute("select agentdb.principal_uninstall(principal_id => %s)", (row[0],))
            conn.execute("delete from agentdb.principals where id = %s", (row[0],))
    except psycopg.Error as exc:
        error = _db_error(exc)
        if error is None:
            raise
        raise error from None


def list_principals(conn: psycopg.Connection[Any]) -> list[Principal]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(f"select {_COLUMNS} from agentdb.principals order by name").fetchall()  # noqa: S608
    return [_principal(r) for r in rows]


def any_principals(conn: psycopg.Connection[Any]) -> bool:
    """Whether any principal exists (with none, a loopback-bound server may run open for development)."""
    row = conn.execute("select exists (select 1 from agentdb.principals)").fetchone()
    return bool(row and row[0])


def authenticate(conn: psycopg.Connection[Any], authorization: str | None) -> Principal:
    """The principal whose key is in `authorization` ("Bearer <key>"), or Unauthorized (1401).

    A missing or malformed header and an unknown, wrong or deleted key all fail the same way ("invalid API
    key" for any well-formed key), and the key is compared hashed in constant time; the same hashing work
    is done when no row has the key's prefix. Keys do not contain principal names, so nothing reveals
    whether a name exists.
    """
    if not authorization or not authorization.strip():
        raise Unauthorized(
            "missing API key: send the header `Authorization: Bearer <key>`", path="authorization"
        )
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not _KEY.match(key):
        raise Unauthorized("malformed Authorization header: expected `Bearer adb_...`", path="authorization")
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"select {_COLUMNS}, key_hash from agentdb.principals where key_prefix = %s",  # noqa: S608
            (key[:_PREFIX_LEN],),
        ).fetchall()
    found = None
    for row in rows or [{"key_hash": _DUMMY_HASH}]:
        if _key_matches(key, row["key_hash"]) and "id" in row:
            found = row
    if found is None:
        raise Unauthorized("invalid API key", path="authorization")
    return _principal(found)


def check_table(principal: Principal, table: str, path: str = "table") -> None:
    """Forbidden (1403) unless `principal` may read source `table`. A name that is not granted is 403
    whether or not such a source exists, so a principal cannot probe for other sources."""
    if table not in principal.tables:
        raise Forbidden(f"principal {principal.name!r} may not read source {table!r}", path=path)


def check_fields(principal: Principal, fields: list[str] | None, path: str = "fields") -> list[str] | None:
    """The projection to use for `principal`: Forbidden (1403, at `path[i]`) when a requested field is
    outside its field grant (never a silent drop). With no projection requested (`fields` None) and a
    field grant present, the granted fields are returned: the caller must then project to exactly
    those. Without a field grant the request is returned unchanged (None = every field)."""
    if principal.fields is None:
        return None if fields is None else list(fields)
    if fields is None:
        return list(principal.fields)
    for i, field in enumerate(fields):
        if field not in principal.fields:
            raise Forbidden(f"principal {principal.name!r} may not read field {field!r}", path=f"{path}[{i}]")
    return list(fields)


def visible_source(principal: Principal | None, source: Source) -> Source:
    """`source` as `principal` may see it: only the metadata fields of its field grant (listings, filter
    validation and hints never name a hidden field)."""
    if principal is None or principal.fields is None:
        return source
    granted = set(principal.fields)
    return source.model_copy(update={"fields": [f for f in source.fields if f.name in granted]})


def check_filter(
    conn: psycopg.Connection[Any], principal: Principal, source: Source, filter: Any, path: str = "filter"
) -> None:
    """Forbidden (1403) when `filter` reads a field outside the principal's field grant: filtering on a
    hidden field would reveal its values through which rows match. The filter is compiled against the
    granted fields only, so a hidden field and a field that does not exist answer alike (403), and no
    message or hint names a hidden field. Any other invalid filter is 3007 as usual."""
    visible = visible_source(principal, source)
    try:
        validate_filter(conn, visible, filter, path)
    except InvalidParamValue as exc:
        if visible is source or "filter.unknown_field" not in exc.message:
            raise
        raise Forbidden(
            f"the filter reads a field that principal {principal.name!r} may not read ({exc.message})",
            path=exc.path,
            hint=exc.hint,
        ) from None


def check_tool(principal: Principal, tool: str, path: str | None = None) -> None:
    """Forbidden (1403) unless `principal` may use `tool` (search, tree_search, graph_search, memory)."""
    if tool not in principal.tools:
        raise Forbidden(f"principal {principal.name!r} may not use the tool {tool!r}", path=path)


@contextmanager
def principal_scope(conn: psycopg.Connection[Any], principal: Principal) -> Iterator[psycopg.Connection[Any]]:
    """Run the block in a transaction as the principal's database role (`SET LOCAL ROLE`), so that every
    statement in it has only that role's grants and row-level security policies. Inside a transaction
    already open, a savepoint is used and the previous role is restored on leaving.

    This protects against request handling that builds the wrong query (a forgotten filter, a wrong
    table); it is not a sandbox for arbitrary SQL, which could RESET ROLE: principals never send SQL.
    """
    outer = conn.info.transaction_status != TransactionStatus.IDLE
    with conn.transaction():
        previous = None
        if outer:
            row = conn.execute("select current_user").fetchone()
            previous = row[0] if row else None
        try:
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(principal.role)))
        except psycopg.errors.InvalidParameterValue:
            raise Unauthorized("invalid API key", path="authorization") from None  # the principal was deleted
        yield conn
        if previous is not None:
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(previous)))


def read_scope(conn: psycopg.Connection[Any], principal: Principal | None) -> AbstractContextManager[Any]:
    """Every read of a principal runs under its database role (grants and row security); none in local dev."""
    return principal_scope(conn, principal) if principal is not None else nullcontext(conn)


def writes_under_role(principal: Principal | None, source: Source) -> bool:
    """Whether a principal's writes to the rows of `source` run under its role (principal_scope), whose grants
    and row security then hold them as they hold its reads. Not for a distributed source (on a Citus
    coordinator): its writer does the lexical triggers' work as the application (agentdb.sources.write_lexical),
    and Citus lets one transaction modify a node's placements of co-located or reference tables as one role
    only (the second is refused: "modified in this transaction by a different user"). There the rows are
    written as the application too, inside the limits the writer checked under the principal's name first."""
    return principal is not None and not source.distributed


__all__ = [
    "TOOLS",
    "Principal",
    "any_principals",
    "authenticate",
    "check_fields",
    "check_filter",
    "check_table",
    "check_tool",
    "create_principal",
    "delete_principal",
    "list_principals",
    "principal_scope",
    "read_scope",
    "visible_source",
    "writes_under_role",
]
