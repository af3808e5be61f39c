"""principal create, list, delete: API keys with their sources, row filter, fields and tools."""

from __future__ import annotations

import argparse
import sys

import orjson

from agentdb.cli.common import Subparsers, command, connect, group, split_names


def cmd_principal_create(args: argparse.Namespace) -> None:
    from agentdb.auth import create_principal
    from agentdb.filters import filter_from_text

    with connect(args) as conn:
        principal, key = create_principal(
            conn,
            args.name,
            tables=split_names(args.tables) or [],
            row_filter=filter_from_text(args.row_filter, "row_filter"),
            fields=split_names(args.fields),
            tools=split_names(args.tools) or [],
        )
    fields = (
        "all fields" if principal.fields is None else "fields " + (", ".join(principal.fields) or "(none)")
    )
    print(
        f"created principal {principal.name}: tables {', '.join(principal.tables) or '(none)'}; {fields}; "
        f"tools {', '.join(sorted(principal.tools))}; database role {principal.role}",
        file=sys.stderr,
    )
    print(
        "its API key follows; it is shown only this once (send it as `Authorization: Bearer <key>`):",
        file=sys.stderr,
    )
    print(key)


def cmd_principal_list(args: argparse.Namespace) -> None:
    from agentdb.auth import list_principals

    with connect(args) as conn:
        found = list_principals(conn)
    if args.json:
        print(orjson.dumps([{**p.__dict__, "tools": sorted(p.tools)} for p in found]).decode())
        return
    if not found:
        print("no principals yet: `agentdb principal create NAME --tables ...` adds one")
        return
    print(f"{'name':20} {'tables':24} {'fields':20} {'tools':28} row filter")
    for p in found:
        fields = "(all)" if p.fields is None else ",".join(p.fields) or "(none)"
        row_filter = "(none)" if p.row_filter is None else orjson.dumps(p.row_filter).decode()
        print(
            f"{p.name:20} {','.join(p.tables) or '(none)':24} {fields:20} {','.join(sorted(p.tools)):28} "
            f"{row_filter}"
        )


def cmd_principal_delete(args: argparse.Namespace) -> None:
    from agentdb.auth import delete_principal

    with connect(args) as conn:
        delete_principal(conn, args.name)
    print(f"deleted principal {args.name}: its key no longer works")


def add_parsers(sub: Subparsers) -> None:
    help_text = "manage principals: API keys with their sources, row filter, fields and tools"
    actions = group(sub, "principal", help_text)

    q = command(
        actions, "create", cmd_principal_create, "create a principal and print its API key (shown only once)"
    )
    q.add_argument("name")
    q.add_argument("--tables", help="comma-separated sources it may read, e.g. docs,faq")
    q.add_argument("--row-filter", help='a filter ANDed into every read, e.g. \'{"tenant": "acme"}\'')
    q.add_argument(
        "--fields", help="comma-separated fields it may see (title, text, metadata fields); default all"
    )
    q.add_argument(
        "--tools",
        default="search",
        help="comma-separated: search, ingest (write documents), tree_search, graph_search, memory (default search)",
    )
    q = command(actions, "list", cmd_principal_list, "list the principals (keys are never shown)")
    q.add_argument("--json", action="store_true")
    q = command(actions, "delete", cmd_principal_delete, "delete a principal; its key stops working at once")
    q.add_argument("name")
