"""demo: load the demo corpus (the PostgreSQL manual, from its pack) with its indexes, then serve."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Literal

import psycopg

from agentdb.cli.common import Subparsers, cli_settings, command, connect
from agentdb.cli.server import check_port_free, cmd_serve
from agentdb.resources import DEMO, DEMO_CORPUS, DEMO_PACK, resource, resource_path

DEMO_SOURCE = "pgdocs"


DEMO_PACK_BACKEND = "torch"


def cmd_demo(args: argparse.Namespace) -> None:
    from agentdb.sources import list_sources

    if not args.no_serve:  # before the load, not after it
        settings = cli_settings(args)
        check_port_free(settings.host, settings.port)
    with connect(args, migrate_schema=True, create=True) as conn:
        if DEMO_SOURCE in {s.name for s in list_sources(conn)}:
            print(f"demo source {DEMO_SOURCE!r} is loaded", file=sys.stderr)
        elif resource(DEMO, DEMO_PACK).is_file():
            from agentdb.pack import import_pack, read_manifest
            from agentdb.sources import get_source, record_embedding_backends

            print(
                f"loading the demo corpus (the PostgreSQL manual) into source {DEMO_SOURCE!r} from its knowledge "
                f"pack {DEMO_PACK} (embeddings included), once",
                file=sys.stderr,
            )
            with resource_path(DEMO, DEMO_PACK) as pack:
                report = import_pack(
                    conn, pack, embedding_model=cli_settings(args).embedding_model, source_name=DEMO_SOURCE
                )
                recorded = read_manifest(pack).embedding.backends
            if not recorded:
                # The shipped pack's manifest predates the backend field; it was embedded with PyTorch
                # (tests/test_pack.py re-embeds a sample so and compares).
                record_embedding_backends(conn, get_source(conn, DEMO_SOURCE), [DEMO_PACK_BACKEND])
            print(report.summary(), file=sys.stderr)
        else:
            from agentdb.embed import load_embedder
            from agentdb.ingest.pipeline import ingest
            from agentdb.ingest.readers import read_records

            print(
                f"loading the demo corpus (the PostgreSQL manual) into source {DEMO_SOURCE!r}; its knowledge pack "
                f"{DEMO_PACK} is missing (examples/pgdocs/build.py --pack-only makes it), so CPU embedding "
                "of about 9,000 chunks takes 5 to 15 minutes on 2 cores, once",
                file=sys.stderr,
            )
            with resource_path(DEMO, DEMO_CORPUS) as corpus:
                ingested = ingest(conn, DEMO_SOURCE, read_records(corpus), load_embedder(), progress=True)
            print(ingested.summary(), file=sys.stderr)
        _demo_indexes(conn)
    if not args.no_serve:
        cmd_serve(args)


# The demo corpus's hierarchy and graph indexes: (name, kind, field, edge type).


DEMO_INDEXES: tuple[tuple[str, Literal["tree", "graph"], str, str], ...] = (
    ("sections", "tree", "parent", "child"),
    ("xref", "graph", "links", "xref"),
    ("next", "graph", "next", "next"),
)


def _demo_indexes(conn: psycopg.Connection[Any]) -> None:
    """Create the demo indexes the demo source lacks (all of them after a first load)."""
    from agentdb.indexes import create_index, list_indexes

    have = {i.name for i in list_indexes(conn, DEMO_SOURCE)}
    for name, kind, field, edge_type in DEMO_INDEXES:
        if name not in have:
            info = create_index(conn, DEMO_SOURCE, name, kind=kind, field=field, edge_type=edge_type)
            print(f"created index {name} ({kind} from {field}): {info.edges} edges", file=sys.stderr)


def add_parsers(sub: Subparsers) -> None:
    p = command(sub, "demo", cmd_demo, "load the demo corpus (the PostgreSQL manual) if needed, then serve")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--no-serve", action="store_true", help="load the demo corpus and exit")
