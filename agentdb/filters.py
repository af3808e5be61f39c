"""Metadata filters from Python: validate or compile a filter with the one compiler in SQL.

The compiler itself is `agentdb.compile_filter` (sql/030_filters.sql), so the SQL function, the Python
API and the HTTP API accept exactly the same filters and report the same errors.
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from agentdb.errors import InvalidParamValue, from_db_error
from agentdb.sources import Source

# Any placeholder works for validation: the predicate it returns is thrown away.
_VALIDATION_REF = "$1"


def id_expression(conn: psycopg.Connection[Any], source: Source) -> str:
    """The SQL text naming a row's document id under the alias `c`."""
    if source.kind == "documents":
        return "c.doc_id"
    return sql.SQL("c.{}::text").format(sql.Identifier(source.id_column)).as_string(conn)


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


def compile_filter(
    conn: psycopg.Connection[Any], source: Source, filter: Any, params_ref: str, path_prefix: str = "filter"
) -> tuple[str, list[Any]]:
    """Compile `filter` for `source` into a predicate over the alias `c` and the values it reads as
    `params_ref` (e.g. `%(filter_params)s::jsonb`; bind `Jsonb(values)` to it); raises InvalidParamValue."""
    fields = Jsonb([f.model_dump() for f in source.fields])
    value = _parse(filter, path_prefix)
    try:
        with conn.transaction():
            row = conn.execute(
                "select predicate, params from agentdb.compile_filter(%s, %s, %s, %s, %s)",
                (
                    fields,
                    None if value is None else Jsonb(value),
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
