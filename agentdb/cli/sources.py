"""Sources: list them (sources), load documents (ingest), register a table in place (register), verify
and repair the lexical index (check), merge posting blocks (optimize)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg

from agentdb.cli.common import DEFAULT_THRESHOLD, Subparsers, cli_settings, command, connect, field_types
from agentdb.errors import AgentDBError, InvalidParamValue


def _similarity(conn: psycopg.Connection[Any], source: Any, probes: int | None) -> dict[str, Any] | None:
    """`agentdb sources --similarity`: the source's similarity profile (agentdb.similarity) as JSON."""
    if probes is None:
        return None
    from agentdb.embed import load_embedder
    from agentdb.similarity import similarity_profile

    profile = similarity_profile(conn, source, load_embedder(source.embedding_model), sample=probes)
    if profile is None:
        return {"probes": 0, "summary": "fewer than 2 embedded chunks with text: nothing to measure"}
    return {
        "probes": len(profile.probes),
        "embedded_chunks": profile.embedded,
        "median": profile.percentile(50),
        "p10": profile.percentile(10),
        "p90": profile.percentile(90),
        "kept_at_default_threshold": profile.kept_at(DEFAULT_THRESHOLD),
        "summary": profile.summary(DEFAULT_THRESHOLD),
    }


def cmd_sources(args: argparse.Namespace) -> None:
    from agentdb.sources import list_sources, pending_embeddings, source_counts

    if args.similarity is not None and args.similarity < 1:
        raise InvalidParamValue("--similarity takes a number of probes of at least 1", path="similarity")
    with connect(args) as conn:
        found = list_sources(conn)
        if args.similarity is not None and found:
            print(
                f"loading the embedding model to measure the similarity of {args.similarity} probes a source",
                file=sys.stderr,
            )
        if args.json:
            print(
                orjson.dumps(
                    [
                        {
                            **s.model_dump(),
                            **source_counts(conn, s),
                            "pending_embeddings": pending_embeddings(conn, s) if s.kind == "table" else 0,
                            **(
                                {"similarity": _similarity(conn, s, args.similarity)}
                                if args.similarity
                                else {}
                            ),
                        }
                        for s in found
                    ]
                ).decode()
            )
            return
        if not found:
            print("no sources yet: `agentdb ingest NAME FILE...` creates one")
            return
        print(f"{'name':20} {'kind':10} {'documents':>9} {'chunks':>8}  model / fields")
        for s in found:
            counts = source_counts(conn, s)
            fields = ", ".join(f"{f.name}:{f.type}" for f in s.fields)
            pending = pending_embeddings(conn, s) if s.kind == "table" else 0
            waiting = f"; {pending} rows wait for their embedding" if pending else ""
            backends = ", ".join(s.embedding_backends) or "backend not known"
            print(
                f"{s.name:20} {s.kind:10} {counts['documents']:>9} {counts['chunks']:>8}  "
                f"{s.embedding_model} ({s.embedding_dim}, {backends}); {fields or 'no fields'}{waiting}"
            )
            similarity = _similarity(conn, s, args.similarity)
            if similarity is not None:
                print(f"{'':20} {similarity['summary']}")
        if args.similarity is None:
            print(
                "(`agentdb sources --similarity` measures the cosine similarities each source's model gives short "
                "queries, to pick a --threshold)",
                file=sys.stderr,
            )


def cmd_ingest(args: argparse.Namespace) -> None:
    from agentdb.embed import load_embedder
    from agentdb.ingest.pipeline import FieldMap, ingest
    from agentdb.ingest.readers import read_records

    mapping = FieldMap(
        id_field=args.id_field,
        title_field=args.title_field,
        text_field=args.text_field,
        embedding_field=args.embedding_field,
        include=tuple(args.include_field) if args.include_field else None,
        exclude=tuple(args.exclude_field or ()),
    )

    types = field_types(args.field or [])

    def records() -> Iterator[Any]:
        for name in args.files:
            yield from read_records(Path(name), types)

    with connect(args, migrate_schema=True, create=True) as conn:
        report = ingest(
            conn,
            args.source,
            records(),
            load_embedder(cli_settings(args).embedding_model),
            mapping=mapping,
            skip_bad=args.skip_bad,
            progress=not args.no_progress,
            chunk_size=args.chunk_size,
            chunk_overlap=args.chunk_overlap,
            tenant_field=args.tenant_field,
            lexical_layout=args.layout,
        )
    for bad in report.skipped:
        print(f"skipped: {bad}", file=sys.stderr)
    print(report.summary())


def cmd_register(args: argparse.Namespace) -> None:
    from agentdb.db import resolve_url
    from agentdb.embed import load_embedder
    from agentdb.sources import register_table

    embedder = load_embedder(cli_settings(args).embedding_model)
    with connect(args, migrate_schema=True, create=True) as conn:
        source = register_table(
            conn,
            resolve_url(cli_settings(args)),
            args.source,
            table=args.table,
            schema=args.schema,
            id_column=args.id_column,
            text_columns=args.text_column,
            embedding_model=embedder.model_name,
            embedding_dim=embedder.dim,
            ts_config=args.ts_config,
            title_column=args.title_column,
        )
        from agentdb.ingest.embed_missing import embed_missing

        filled = embed_missing(conn, source, embedder, progress=not args.no_progress)
    print(
        f"registered {source.name} ({source.table_schema}.{source.table_name}): "
        f"{len(source.fields)} fields, {filled} rows embedded"
    )


def cmd_check(args: argparse.Namespace) -> None:
    from agentdb.db import run_sql
    from agentdb.sources import rebuild_lexical

    with connect(args) as conn:
        rows = run_sql(
            conn,
            "select what, mismatches from agentdb.lexical_check(source_name => %(s)s)",
            {"s": args.source},
        )
        bad = {what: n for what, n in rows if n}
        if not bad:
            print(f"{args.source}: postings, term statistics and corpus statistics match the documents")
            return
        print(f"{args.source}: mismatches: " + ", ".join(f"{k} {v}" for k, v in bad.items()))
        if not args.repair:
            raise AgentDBError(
                "the lexical index does not match the documents", hint="run again with --repair"
            )
        rebuild_lexical(conn, args.source)
        rows = run_sql(
            conn,
            "select what, mismatches from agentdb.lexical_check(source_name => %(s)s)",
            {"s": args.source},
        )
        print("repaired" if not any(n for _, n in rows) else f"still mismatched: {rows}")


def cmd_optimize(args: argparse.Namespace) -> None:
    from agentdb.sources import optimize_source

    with connect(args) as conn:
        before, after = optimize_source(conn, args.source, layout=args.layout)
        layout = conn.execute(
            "select lexical_layout from agentdb.sources where name = %s", (args.source,)
        ).fetchone()
    print(f"{args.source}: {layout[0] if layout else '?'} layout; posting blocks {before:,} -> {after:,}")


def add_parsers(sub: Subparsers) -> None:
    p = command(sub, "sources", cmd_sources, "list the sources with their counts and fields")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--similarity",
        type=int,
        nargs="?",
        const=50,
        metavar="PROBES",
        help="also measure each source's top-1 cosine similarity for PROBES short probes (default 50: sampled "
        "chunks' titles, else first sentences, each searched against the other chunks), to pick a --threshold "
        "(a cosine distance, 1 - similarity); loads the embedding model",
    )

    p = command(
        sub, "ingest", cmd_ingest, "ingest JSONL, CSV or Parquet files (gzip too) into a document source"
    )
    p.add_argument("source")
    p.add_argument("files", nargs="+")
    p.add_argument("--id-field", help="key of the document id (default: _id, else id)")
    p.add_argument(
        "--title-field",
        "--title-column",
        default="title",
        help="key or CSV column of the title that hits show (default title)",
    )
    p.add_argument(
        "--text-field", "--text-column", default="text", help="key or CSV column of the text (default text)"
    )
    p.add_argument("--embedding-field", default="embedding", help="key of a precomputed vector, if any")
    p.add_argument("--include-field", action="append", help="keep only these metadata keys (repeatable)")
    p.add_argument("--exclude-field", action="append", help="ignore this key (repeatable)")
    p.add_argument("--chunk-size", type=int, default=256, help="chunk size in embedder tokens (new sources)")
    p.add_argument("--chunk-overlap", type=int, default=32, help="chunk overlap in tokens (new sources)")
    p.add_argument(
        "--tenant-field",
        metavar="FIELD",
        help="a string field every document carries (new sources): on a Citus coordinator the source is"
        " distributed by it, so a read whose filter or row filter fixes it goes to one shard",
    )
    p.add_argument(
        "--layout",
        choices=["rows", "blocks"],
        help="how a new source keeps its BM25 postings: in blocks of 128 chunks per term (the default on one"
        " node, read by the accelerator) or one row per term and chunk (the default on a Citus coordinator)",
    )
    p.add_argument(
        "--field",
        action="append",
        metavar="NAME:TYPE",
        help="the type of a CSV column or JSON Lines key (int, float, bool, timestamp, string) instead of "
        "inferring it; repeatable",
    )
    p.add_argument("--skip-bad", action="store_true", help="report and skip bad rows instead of aborting")
    p.add_argument("--no-progress", action="store_true")

    p = command(sub, "register", cmd_register, "register an existing table in place as a source")
    p.add_argument("source")
    p.add_argument("--table", required=True)
    p.add_argument("--schema", default="public")
    p.add_argument("--id-column", required=True)
    p.add_argument(
        "--text-column", action="append", required=True, help="a searched text column (repeatable)"
    )
    p.add_argument("--title-column", help="the column that gives each hit its title (default: none)")
    p.add_argument("--ts-config", default="english")
    p.add_argument("--no-progress", action="store_true")

    p = command(sub, "check", cmd_check, "verify that postings and statistics match the documents")
    p.add_argument("source")
    p.add_argument("--repair", action="store_true", help="rebuild the lexical index when it does not match")

    p = command(
        sub, "optimize", cmd_optimize, "merge a source's partly filled posting blocks (or change its layout)"
    )
    p.add_argument("source")
    p.add_argument(
        "--layout",
        choices=["rows", "blocks"],
        help="store the BM25 postings as one row per term and chunk, or in blocks of 128 chunks per term",
    )
