"""pack export, import: a source's documents, chunks and embeddings in one Parquet file."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentdb.cli.common import Subparsers, cli_settings, command, connect, group


def cmd_pack_export(args: argparse.Namespace) -> None:
    from agentdb.pack import export_pack

    path = Path(args.file)
    with connect(args) as conn:
        manifest = export_pack(
            conn,
            args.source,
            path,
            dtype="float32" if args.float32 else "float16",
            progress=not args.no_progress,
        )
    print(
        f"exported {manifest.documents} documents, {manifest.chunks} chunks of source {args.source!r} "
        f"({manifest.embedding.model}, {manifest.embedding.dim} dims as {manifest.embedding.dtype}) to {path} "
        f"({path.stat().st_size:,} bytes)"
    )


def cmd_pack_import(args: argparse.Namespace) -> None:
    from agentdb.pack import import_pack

    with connect(args, migrate_schema=True, create=True) as conn:
        report = import_pack(
            conn,
            Path(args.file),
            embedding_model=cli_settings(args).embedding_model,
            source_name=args.source,
            replace=args.replace,
            progress=not args.no_progress,
        )
    print(report.summary())


def add_parsers(sub: Subparsers) -> None:
    help_text = "knowledge packs: a source's documents, chunks and embeddings in one Parquet file"
    actions = group(sub, "pack", help_text)
    q = command(actions, "export", cmd_pack_export, "write a document source to a pack file")
    q.add_argument("source")
    q.add_argument("file")
    q.add_argument(
        "--float32",
        action="store_true",
        help="store vectors as float32 (exact; default float16, half the size)",
    )
    q.add_argument("--no-progress", action="store_true")
    q = command(
        actions,
        "import",
        cmd_pack_import,
        "load a pack as a new source, in one transaction (no embedding needed)",
    )
    q.add_argument("file")
    q.add_argument("--source", help="the new source's name (default: the name in the pack)")
    q.add_argument("--replace", action="store_true", help="replace an existing source of that name")
    q.add_argument("--no-progress", action="store_true")
