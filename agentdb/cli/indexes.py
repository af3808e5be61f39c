"""index create, list, drop, check: hierarchy and graph indexes over a source."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from agentdb.cli.common import Subparsers, command, connect, group
from agentdb.errors import AgentDBError, InvalidParamValue


def cmd_index_create(args: argparse.Namespace) -> None:
    from agentdb.indexes import create_index, create_index_from_file

    if args.kind and not args.edges:
        raise InvalidParamValue("--kind goes with --edges (--tree and --graph say the kind)", path="kind")
    with connect(args, migrate_schema=True) as conn:
        if args.edges:
            info = create_index_from_file(
                conn,
                args.source,
                args.name,
                Path(args.edges),
                kind=args.kind or "graph",
                edge_type=args.edge_type,
            )
            how = f"explicit edges from {args.edges}"
        elif args.tree:
            info = create_index(
                conn, args.source, args.name, kind="tree", field=args.tree, edge_type=args.edge_type
            )
            how = f"tree from parent field {args.tree!r}"
        else:
            info = create_index(
                conn, args.source, args.name, kind="graph", field=args.graph, edge_type=args.edge_type
            )
            how = f"graph from field {args.graph!r}"
    print(
        f"created index {info.name} on {args.source} ({how}, edge type {info.edge_type}): {info.edges} edges"
    )


def cmd_index_list(args: argparse.Namespace) -> None:
    from agentdb.indexes import list_indexes

    with connect(args) as conn:
        found = list_indexes(conn, args.source)
    if args.json:
        print(orjson.dumps([i.model_dump() for i in found]).decode())
        return
    if not found:
        print(
            f"{args.source} has no indexes: `agentdb index create {args.source} NAME --tree FIELD` adds one"
        )
        return
    print(f"{'name':20} {'kind':6} {'field':20} {'edge type':14} {'edges':>9}")
    for i in found:
        print(f"{i.name:20} {i.kind:6} {i.field or '(explicit)':20} {i.edge_type:14} {i.edges:>9}")


def cmd_index_drop(args: argparse.Namespace) -> None:
    from agentdb.indexes import drop_index

    with connect(args) as conn:
        removed = drop_index(conn, args.source, args.name)
    print(f"dropped index {args.name} of {args.source} ({removed} edges)")


def cmd_index_check(args: argparse.Namespace) -> None:
    from agentdb.indexes import check_indexes, rebuild_indexes

    with connect(args) as conn:
        results = check_indexes(conn, args.source, args.name)
        if not results:
            print(f"{args.source} has no indexes")
            return
        for r in results:
            state = "match the documents" if r.ok else f"mismatches: {r.missing} missing, {r.extra} extra"
            dangling = f"; {r.dangling} edges name keys with no document (kept)" if r.dangling else ""
            print(f"{args.source}.{r.index}: edges {state}{dangling}")
        bad = [r.index for r in results if not r.ok]
        if not bad:
            return
        if not args.repair:
            raise AgentDBError(
                f"the edges of {', '.join(bad)} do not match the documents", hint="run again with --repair"
            )
        for name in bad:
            rebuild_indexes(conn, args.source, name)
        still = [r.index for r in check_indexes(conn, args.source, args.name) if not r.ok]
        if still:
            raise AgentDBError(f"still mismatched after the repair: {', '.join(still)}")
        print("repaired")


def add_parsers(sub: Subparsers) -> None:
    help_text = "hierarchy and graph indexes over a source: trees, graphs and explicit edges"
    actions = group(sub, "index", help_text)
    q = command(
        actions,
        "create",
        cmd_index_create,
        "declare an index and build its edges from the documents (or a file)",
    )
    q.add_argument("source")
    q.add_argument("name")
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument("--tree", metavar="PARENT_FIELD", help="a tree: each document's parent key")
    how.add_argument("--graph", metavar="FIELD", help="a graph: a key or list of keys per document")
    how.add_argument(
        "--edges", metavar="FILE", help="explicit edges: JSONL or CSV (from, to, type, weight, metadata)"
    )
    q.add_argument(
        "--edge-type", help="the edges' type (default: child for a tree, the field's name for a graph)"
    )
    q.add_argument("--kind", choices=["tree", "graph"], help="with --edges: the index's kind (default graph)")
    q = command(actions, "list", cmd_index_list, "list a source's indexes with their edge counts")
    q.add_argument("source")
    q.add_argument("--json", action="store_true")
    q = command(actions, "drop", cmd_index_drop, "remove an index and its edges")
    q.add_argument("source")
    q.add_argument("name")
    q = command(
        actions,
        "check",
        cmd_index_check,
        "compare the edges with the documents (non-zero exit on mismatches)",
    )
    q.add_argument("source")
    q.add_argument("name", nargs="?", help="one index (default: all of the source's)")
    q.add_argument("--repair", action="store_true", help="rebuild field-derived edges that do not match")
