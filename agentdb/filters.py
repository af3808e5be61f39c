"""Metadata filters from Python: validate or compile a filter with the one compiler in SQL.

The compiler itself is `agentdb_internal.compile_filter` (sql/030_filters.sql), so the SQL function, the Python
API and the HTTP API accept exactly the same filters and report the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from agentdb.errors import InvalidParamValue, from_db_error
from agentdb.sources import Source

# Any placeholder works for validation: the predicate it returns is thrown away.
_VALIDATION_REF = "$1"
# The integers orjson (psycopg's JSON serialiser on agentdb's connections) can write.
_INT_RANGE = (-(2**63), 2**64 - 1)
# orjson stops at this depth; the compiler stops at 16 anyway, so deeper values need not be searched.
_MAX_DEPTH = 256


def id_expression(conn: psycopg.Connection[Any], source: Source) -> str:
    """The SQL text naming a row's document id under the alias `c`."""
    if source.kind == "documents":
        return "c.doc_id"
    return sql.SQL("c.{}::text").format(sql.Identifier(source.id_column)).as_string(conn)


def filter_from_text(text: str | None, path: str) -> Any:
    """A filter given as JSON text (a command-line option, a query parameter): its value, None when absent;
    InvalidParamValue at `path` when it is not JSON."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidParamValue(f"{path} is not valid JSON: {exc}", path=path) from None


def _parse(filter: Any, path_prefix: str) -> Any:
    """Accept a filter as JSON text too (Tryll's `filter` is a string); empty text means no filter."""
    if isinstance(filter, bytes | str):
        if not filter.strip():
            return None
        try:
            return orjson.loads(filter)
        except orjson.JSONDecodeError as exc:
            raise InvalidParamValue(
                f"filter.bad_operand: at $: not valid JSON: {exc}", path=path_prefix
            ) from None
    return filter


def _join(prefix: str, path: str) -> str:
    """`prefix` and a path inside the filter, joined as the SQL compiler joins them (`$` at the root)."""
    if not path:
        return prefix or "$"
    if not prefix:
        return path
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def _unserialisable_int(value: Any) -> str | None:
    """The path inside the filter (`$or[1].year`, `''` for the root) of the first integer beyond 64 bits,
    in document order, or None. Iterative, so that a deeply nested value cannot exhaust Python's stack."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool):
            if not _INT_RANGE[0] <= item <= _INT_RANGE[1]:
                return path
        elif depth < _MAX_DEPTH and isinstance(item, dict):
            children = [(v, k if not path else f"{path}.{k}", depth + 1) for k, v in item.items()]
            stack.extend(reversed(children))
        elif depth < _MAX_DEPTH and isinstance(item, list | tuple):
            stack.extend(reversed([(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item)]))
    return None


def to_json(value: Any, path_prefix: str) -> str:
    """`value` as JSON text for the compiler; a value JSON cannot carry (an integer beyond 64 bits, which
    orjson refuses) is 3007 at its path rather than a TypeError from the driver."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        path = _unserialisable_int(value)
        if path is not None:
            raise InvalidParamValue(
                f"filter.bad_operand: at {path or '$'}: the integer does not fit in 64 bits",
                path=_join(path_prefix, path),
            ) from None
        raise InvalidParamValue(
            f"filter.bad_operand: at $: not serialisable as JSON: {exc}", path=path_prefix or "$"
        ) from None


@dataclass(frozen=True)
class ReadScope:
    """Which rows a read may see: the query filters and the caller's row filter, which agentdb's SQL functions
    take as one `scope` value (sql/035_scope.sql)."""

    filter: Any = None
    filter_query: Any = None
    exclusion_query: Any = None
    row_filter: Any = None

    def value(self) -> Jsonb | None:
        """The `scope` parameter: the filters that are given, each under its name; None when none is. A filter
        JSON cannot carry (an integer beyond 64 bits) is 3007 at its path, as the SQL compiler reports others."""
        given = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                given[f.name] = dict(value) if isinstance(value, Mapping) else value
                to_json(given[f.name], f.name)
        return Jsonb(given) if given else None


# A read under no filter (row security through the caller's role still applies).
UNFILTERED = ReadScope()


def compile_filter(
    conn: psycopg.Connection[Any], source: Source, filter: Any, params_ref: str, path_prefix: str = "filter"
) -> tuple[str, list[Any]]:
    """Compile `filter` for `source` into a predicate over the alias `c` and the values it reads as
    `params_ref` (e.g. `%(filter_params)s::jsonb`; bind `Jsonb(values)` to it); raises InvalidParamValue,
    with the JSON path, for a filter that does not compile or that JSON cannot carry (an integer beyond
    64 bits)."""
    fields = Jsonb([f.model_dump() for f in source.fields])
    value = _parse(filter, path_prefix)
    text = None if value is None else to_json(value, path_prefix)
    try:
        with conn.transaction():
            row = conn.execute(
                "select predicate, params from agentdb_internal.compile_filter(fields => %s,"
                " filter => %s::jsonb, params_ref => %s, id_expr => %s, path_prefix => %s)",
                (
                    fields,
                    text,
                    params_ref,
                    id_expression(conn, source),
                    path_prefix,
                ),
            ).fetchone()
    except psycopg.DataError as exc:
        # The filter is not even valid jsonb for the server (e.g. a \u0000 inside a string).
        message = f"filter.bad_operand: at $: {exc.diag.message_primary}"
        raise InvalidParamValue(message, path=path_prefix) from None
    except psycopg.Error as exc:
        error = from_db_error(exc)
        if error is None:
            raise
        raise error from None
    assert row is not None
    return str(row[0]), list(row[1])


def validate_filter(
    conn: psycopg.Connection[Any], source: Source, filter: Any, path_prefix: str = "filter"
) -> None:
    """Raise InvalidParamValue (3007) with the JSON path of the problem when `filter` does not compile."""
    compile_filter(conn, source, filter, _VALIDATION_REF, path_prefix)
