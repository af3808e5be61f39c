"""The `agentdb` command: serve, mcp, migrate, ingest, register, sources, search, eval, check, index, principal,
pack, memory, eval-memory, start, stop, status, db-url, demo."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import orjson
import psycopg

from agentdb.config import MEMORY_DECAY, MEMORY_HALF_LIFE_HOURS, RRF_K, Settings, find_data_dir, has_database
from agentdb.errors import AgentDBError, DatabaseSetupError, InvalidParamValue, from_db_error, is_outage
from agentdb.resources import DEMO, DEMO_CORPUS, DEMO_PACK, resource, resource_path

DEMO_SOURCE = "pgdocs"
DEMO_PACK_BACKEND = "torch"
DEFAULT_THRESHOLD = (
    0.5  # the dense leg's default max cosine distance (agentdb.retrieval.retrieve's, the API's)
)


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        data_dir=getattr(args, "data_dir", None),
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        replica_urls=tuple(args.replica) if getattr(args, "replica", None) else None,
    )


def _require_database(args: argparse.Namespace, settings: Settings) -> None:
    """Only the commands that load data or set a database up (demo, start, migrate, ingest, register, pack
    import, serve) make a new embedded database; any other one, run where there is none, says so and how to
    point at one, instead of leaving an empty `.agentdb` behind."""
    if settings.database_url or settings.database_url_file or has_database(settings.data_dir):
        return
    searched = args.data_dir is None and settings.data_dir == find_data_dir(Path.cwd())
    where = (
        f"{Path.cwd()} and its parent folders have no .agentdb"
        if searched
        else f"{settings.data_dir} holds no agentdb database"
    )
    raise DatabaseSetupError(
        f"no agentdb database found: {where}",
        path="data_dir",
        hint="point at one with --data-dir DIR, AGENTDB_DATA_DIR=DIR or DATABASE_URL=postgresql://...; "
        "or make one here with `agentdb demo`, `agentdb start` or `agentdb ingest`",
    )


@contextmanager
def _connect(
    args: argparse.Namespace, *, migrate_schema: bool = False, create: bool = False
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to an up-to-date database. Only the commands that write (ingest, register,
    demo, pack import; start and serve do it themselves) apply migrations; the others check that the schema
    is current and say what to run when it is not. Only those that load data (`create`) may make the embedded
    database."""
    from agentdb.db import resolve_url
    from agentdb.db.migrate import migrate, require_current
    from agentdb.db.pool import configure

    settings = _settings(args)
    if not create:
        _require_database(args, settings)
    url = resolve_url(settings)
    with psycopg.connect(url, autocommit=True) as conn:
        if migrate_schema:
            migrate(conn)
        else:
            require_current(conn)
        configure(conn)
        yield conn


def _json_arg(text: str | None, path: str) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidParamValue(f"not valid JSON: {exc}", path=path) from exc


def cmd_migrate(args: argparse.Namespace) -> None:
    from agentdb.db import resolve_url
    from agentdb.db.migrate import migrate

    with psycopg.connect(resolve_url(_settings(args))) as conn:
        applied = migrate(conn)
    print(
        f"applied migrations: {', '.join(f'{v:04d}' for v in applied)}"
        if applied
        else "database is up to date"
    )


def cmd_db_url(args: argparse.Namespace) -> None:
    from agentdb.db import resolve_url

    settings = _settings(args)
    _require_database(args, settings)
    print(resolve_url(settings, keep_running=True))
    if not settings.database_url:
        print(
            "(the embedded server stays up for psql until `agentdb stop`, whatever other agentdb commands "
            "come and go)",
            file=sys.stderr,
        )


def _embedded_dir(args: argparse.Namespace, command: str) -> Path:
    settings = _settings(args)
    if settings.database_url:
        raise InvalidParamValue(
            f"DATABASE_URL is set: `agentdb {command}` manages only the embedded server",
            path="DATABASE_URL",
            hint="unset DATABASE_URL to manage the embedded server in --data-dir",
        )
    return settings.data_dir


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def cmd_start(args: argparse.Namespace) -> None:
    from agentdb.db.migrate import migrate
    from agentdb.db.server import server_status, start_embedded

    data_dir = _embedded_dir(args, "start")
    if args.workers:
        from agentdb.db.citus import source_from_env
        from agentdb.db.cluster import prepare_coordinator

        prepare_coordinator(data_dir, source_from_env(args.citus_source))
    was_running = server_status(data_dir).running
    url = start_embedded(data_dir, keep_running=True)
    if args.workers:
        from agentdb.db.cluster import start_workers

        for worker in start_workers(data_dir, args.workers):
            print(f"{worker.name} running in {worker.pgdata}; it stops with the server", file=sys.stderr)
    with psycopg.connect(url) as conn:
        migrate(conn)
    status = server_status(data_dir)
    pid = status.postmaster.pid if status.postmaster else "?"
    print(
        f"{'the embedded server was running' if was_running else 'started the embedded server'} in "
        f"{status.data_dir} (pid {pid}); it stays up until `agentdb stop`",
        file=sys.stderr,
    )
    print(url)
    if args.replicas:
        from agentdb.db.standbys import start_standbys

        for standby in start_standbys(data_dir, args.replicas):
            print(
                f"standby {standby.name} running in {standby.pgdata}; it stops with the server",
                file=sys.stderr,
            )
            print(standby.url())


def cmd_stop(args: argparse.Namespace) -> None:
    from agentdb.db.cluster import stop_workers
    from agentdb.db.server import stop_embedded
    from agentdb.db.standbys import stop_standbys

    data_dir = _embedded_dir(args, "stop")
    for standby in stop_standbys(data_dir):
        print(f"stopped standby {standby.name} in {standby.pgdata}")
    result = stop_embedded(data_dir, force=args.force)
    # A cluster's workers stop with their coordinator, never under it.
    if result.stopped or not result.was_running:
        for worker in stop_workers(data_dir):
            print(f"stopped {worker.name} in {worker.pgdata}")
    where = data_dir.expanduser().resolve()
    if not result.was_running:
        print(f"the embedded server in {where} is not running")
    elif result.stopped:
        print(f"stopped the embedded server in {where}")
    else:
        pids = ", ".join(str(pid) for pid in result.users)
        print(
            f"the embedded server in {where} is no longer kept up: it stops when the agentdb processes using "
            f"it exit (pids {pids}); `agentdb stop --force` stops it now"
        )


def _source_lines(url: str) -> tuple[list[dict[str, Any]], str | None]:
    """The sources of the database at `url` with their counts ([] before the first migration), and the lexical
    path its retrieval takes (None before the first migration)."""
    from agentdb.db.accel import describe
    from agentdb.sources import list_sources, source_counts

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        if conn.execute("select to_regclass('agentdb.sources')").fetchone() == (None,):
            return [], None
        return [{"name": s.name, **source_counts(conn, s)} for s in list_sources(conn)], describe(conn)


def cmd_accel_build(args: argparse.Namespace) -> None:
    from agentdb.db.accel import BuildError, compile_into

    out = args.out.expanduser().resolve()
    if out.exists():
        raise InvalidParamValue(f"{out} exists already", path="out", hint="name a new folder with --out")
    try:
        built = compile_into(args.pg_config.expanduser().resolve(), out)
    except BuildError as exc:
        raise InvalidParamValue(str(exc), path="pg_config") from exc
    print(
        f"built agentdb_accel in {out}. Install it on the server's machine, either\n"
        f"  into the server's own folders: copy {built.share / 'extension'}/* to `pg_config --sharedir`/extension/\n"
        f"    and {built.lib}/agentdb_accel.so to `pg_config --pkglibdir`/\n"
        f"  or where it is, in postgresql.conf (then reload):\n"
        f"    extension_control_path = '$system:{built.share}'\n"
        f"    dynamic_library_path = '$libdir:{built.lib}'\n"
        "then run `agentdb migrate` (as a role that may create extensions) to create it in agentdb's database."
    )


def cmd_status(args: argparse.Namespace) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from agentdb.db.cluster import describe_node, node_report
    from agentdb.db.server import server_status

    settings = _settings(args)
    report: dict[str, Any]
    url: str | None
    if settings.database_url:
        # An external server: where it is (without the password) and what it holds.
        params = {k: v for k, v in conninfo_to_dict(settings.database_url).items() if k != "password"}
        url = settings.database_url
        report = {"database": make_conninfo("", **params), "state": "external (DATABASE_URL)"}
    else:
        status = server_status(settings.data_dir)
        url = status.url() if status.state == "running" else None
        report = {"data_dir": str(status.data_dir), "state": status.state}
        if status.postmaster is not None:
            started = status.postmaster.started_at
            report |= {
                "pid": status.postmaster.pid,
                "address": status.postmaster.address,
                "started_at": started.isoformat(timespec="seconds"),
                "uptime_seconds": int((dt.datetime.now(dt.UTC) - started).total_seconds()),
                "url": status.url(),
            }
        report |= {
            "kept_up": status.pinned,
            "pinned_at": status.pinned_at,
            "agentdb_processes": status.users,
        }
    try:
        report["sources"], report["lexical_path"] = _source_lines(url) if url else ([], None)
    except psycopg.OperationalError as exc:
        report["sources"] = None
        report["sources_error"] = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreachable"
    report["replicas"] = _replica_lines(settings, url)
    report["nodes"] = node_report(url, None if settings.database_url else settings.data_dir)
    if args.json:
        print(orjson.dumps(report).decode())
        return
    lines: list[tuple[str, Any]] = [
        (key, report[key]) for key in ("database", "data_dir", "state", "pid", "address") if key in report
    ]
    if "uptime_seconds" in report:
        lines.append(("uptime", f"{_duration(report['uptime_seconds'])} (since {report['started_at']})"))
    if "kept_up" in report and report["state"] == "running":
        lines.append(
            (
                "kept up",
                f"yes, until `agentdb stop` (started by a user at {report['pinned_at']})"
                if report["kept_up"]
                else "no: it stops when the last agentdb process using it exits",
            )
        )
    if "agentdb_processes" in report and report["state"] in ("running", "shutting down"):
        users = report["agentdb_processes"]
        lines.append(("processes", ", ".join(map(str, users)) if users else "none"))
    if "url" in report:
        lines.append(("url", report["url"]))
    if report["sources"] is None:
        lines.append(("sources", f"unavailable ({report['sources_error']})"))
    elif url:
        found = report["sources"]
        lines.append(
            (
                "sources",
                ", ".join(f"{s['name']} ({s['documents']} documents, {s['chunks']} chunks)" for s in found)
                if found
                else "none",
            )
        )
    if report.get("lexical_path"):
        lines.append(("lexical", report["lexical_path"]))
    for replica in report["replicas"]:
        lag = "" if replica["lag_ms"] is None else f", replay lag {replica['lag_ms']:.0f} ms"
        where = replica.get("data_dir") or replica["url"]
        rotation = "in rotation" if replica["in_rotation"] else "out of rotation"
        state = f"{replica['role']}{lag}, {rotation}" if replica["state"] == "running" else replica["state"]
        lines.append((replica["name"], f"{state} ({where})"))
    for node in report["nodes"]:
        lines.append((node.get("name") or f"node {node['id']}", describe_node(node)))
    for key, value in lines:
        print(f"{key.replace('_', ' ') + ':':11}{value}")


def _replica_lines(settings: Settings, primary_url: str | None) -> list[dict[str, Any]]:
    """The read replicas (configured, or the embedded server's standbys) with their role, replay lag and whether
    a server would read from them now (one check against the primary's current WAL position)."""
    from agentdb.db.replicas import ReadRouter
    from agentdb.db.standbys import list_standbys

    lines: list[dict[str, Any]] = []
    if settings.replica_urls:
        lines = [
            {"name": f"replica{i}", "url": url, "state": "running"}
            for i, url in enumerate(settings.replica_urls, 1)
        ]
    elif not settings.database_url:
        for standby in list_standbys(settings.data_dir):
            line: dict[str, Any] = {
                "name": standby.name,
                "data_dir": str(standby.pgdata),
                "state": "running" if standby.running else "stopped",
                "url": standby.url(),
            }
            if standby.postmaster is not None:
                line |= {"pid": standby.postmaster.pid, "address": standby.postmaster.address}
            lines.append(line)
    running = [line for line in lines if line["state"] == "running"]
    if primary_url and running:
        router = ReadRouter(
            primary_url,
            [line["url"] for line in running],
            max_lag_ms=settings.max_replica_lag_ms,
            pools=False,
        )
        try:
            router.check()
            for line, status in zip(running, router.status(), strict=True):
                line |= {k: v for k, v in vars(status).items() if k not in ("name", "url")}
        finally:
            router.close()
    for line in lines:
        for key in ("role", "replay_lsn", "lag_ms", "in_rotation"):
            line.setdefault(key, None)
    return lines


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
    with _connect(args) as conn:
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


def _field_types(specs: list[str]) -> dict[str, str]:
    """`--field price:float` options as {column: type}."""
    types = {}
    for i, spec in enumerate(specs):
        name, _, kind = spec.partition(":")
        if not name or not kind:
            raise InvalidParamValue(f"--field takes NAME:TYPE, not {spec!r}", path=f"field[{i}]")
        types[name] = kind
    return types


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

    types = _field_types(args.field or [])

    def records() -> Iterator[Any]:
        for name in args.files:
            yield from read_records(Path(name), types)

    with _connect(args, migrate_schema=True, create=True) as conn:
        report = ingest(
            conn,
            args.source,
            records(),
            load_embedder(_settings(args).embedding_model),
            mapping=mapping,
            skip_bad=args.skip_bad,
            progress=not args.no_progress,
            chunk_size=args.chunk_size,
            chunk_overlap=args.chunk_overlap,
        )
    for bad in report.skipped:
        print(f"skipped: {bad}", file=sys.stderr)
    print(report.summary())


def cmd_register(args: argparse.Namespace) -> None:
    from agentdb.db import resolve_url
    from agentdb.embed import load_embedder
    from agentdb.sources import register_table

    embedder = load_embedder(_settings(args).embedding_model)
    with _connect(args, migrate_schema=True, create=True) as conn:
        source = register_table(
            conn,
            resolve_url(_settings(args)),
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


def cmd_search(args: argparse.Namespace) -> None:
    from agentdb.embed import load_embedder
    from agentdb.retrieval import retrieve
    from agentdb.sources import get_source

    with _connect(args) as conn:
        embedder = None
        if args.mode != "lexical":
            model = get_source(conn, args.source).embedding_model
            # Said first: loading takes seconds, and the first use in a data directory also exports the model.
            print(f"loading the embedding model {model}...", file=sys.stderr, flush=True)
            embedder = load_embedder(model)
        result = retrieve(
            conn,
            args.source,
            args.query,
            mode=args.mode,
            top_k=args.top_k,
            rrf_k=args.rrf_k,
            threshold=args.threshold,
            filter=_json_arg(args.filter, "filter"),
            group_by_doc=args.group_by_doc,
            fusion=args.fusion,
            alpha=args.alpha,
            output_results=args.json,
            embedder=embedder,
        )
    if args.json:
        print(
            orjson.dumps(
                {
                    "route": result.route,
                    "hits": [h.__dict__ for h in result.hits],
                    "diagnostics": result.diagnostics,
                }
            ).decode()
        )
        return
    counts = result.diagnostics.get("parameters", {})
    if not result.hits:
        print(f"not found (raw {counts.get('raw_result_count')} candidates)")
    for h in result.hits:
        dist = "-" if h.distance is None else f"{h.distance:.3f}"
        bm25 = "-" if h.bm25_score is None else f"{h.bm25_score:.2f}"
        text = " ".join((h.text or "").split())[:100]
        print(f"{h.rank:>3}. {h.title or '(untitled)'}  [{h.id} #{h.chunk}]")
        print(f"     score {h.score:.4f}  distance {dist}  bm25 {bm25}  {text}")
    if counts.get("filtered_count"):
        print(
            f"({counts['filtered_count']} dense candidates were beyond --threshold {args.threshold} and left out;"
            " --threshold 0 keeps them)"
        )


def cmd_eval(args: argparse.Namespace) -> None:
    from agentdb.evaluation import evaluate, load_qrels, load_queries, split_by_id
    from agentdb.retrieval import retrieve

    queries, qrels = load_queries(Path(args.queries)), load_qrels(Path(args.qrels))
    halves = split_by_id(list(queries.items()), lambda item: item[0])
    with _connect(args) as conn:
        for mode in args.mode:
            for half, items in halves.items():
                result = evaluate(
                    lambda text, mode=mode: [  # type: ignore[misc]
                        (h.id, h.score)
                        for h in retrieve(
                            conn,
                            args.source,
                            text,
                            mode=mode,
                            top_k=100,
                            threshold=args.threshold,
                            group_by_doc=True,
                            fusion=args.fusion,
                            alpha=args.alpha,
                        ).hits
                    ],
                    dict(items),
                    qrels,
                    progress=not args.no_progress,
                )
                print(
                    f"{mode:8} {half:4} nDCG@10 {result.ndcg10:.4f}  Recall@100 {result.recall100:.4f}  "
                    f"queries {result.queries}  p50 {result.percentile(50):.1f} ms (including query embedding)"
                )


def cmd_eval_nav(args: argparse.Namespace) -> None:
    from agentdb.agent.navigation.eval_nav import evaluate_navigation
    from agentdb.evaluation import load_questions, navigation_table, split_by_id

    questions = load_questions(Path(args.questions))
    halves = split_by_id(questions, lambda q: q.id)
    with _connect(args) as conn:
        tables = evaluate_navigation(
            conn,
            _settings(args),
            args.source,
            questions,
            index=args.index,
            links_index=args.links_index or None,
            progress=not args.no_progress,
            splits=halves,
        )
    links = f", links {args.links_index}" if args.links_index else ""
    for half, subset in halves.items():
        print(
            f"{half}: {len(subset)} of {len(questions)} questions over {args.source} (index {args.index}{links})"
        )
        print(navigation_table(tables[half]))


def cmd_check(args: argparse.Namespace) -> None:
    from agentdb.db import run_sql
    from agentdb.sources import rebuild_lexical

    with _connect(args) as conn:
        rows = run_sql(conn, "select what, mismatches from agentdb.lexical_check(%(s)s)", {"s": args.source})
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
        rows = run_sql(conn, "select what, mismatches from agentdb.lexical_check(%(s)s)", {"s": args.source})
        print("repaired" if not any(n for _, n in rows) else f"still mismatched: {rows}")


def cmd_optimize(args: argparse.Namespace) -> None:
    from agentdb.sources import optimize_source

    with _connect(args) as conn:
        before, after = optimize_source(conn, args.source, layout=args.layout)
        layout = conn.execute(
            "select lexical_layout from agentdb.sources where name = %s", (args.source,)
        ).fetchone()
    print(f"{args.source}: {layout[0] if layout else '?'} layout; posting blocks {before:,} -> {after:,}")


def cmd_index_create(args: argparse.Namespace) -> None:
    from agentdb.indexes import create_index, create_index_from_file

    if args.kind and not args.edges:
        raise InvalidParamValue("--kind goes with --edges (--tree and --graph say the kind)", path="kind")
    with _connect(args, migrate_schema=True) as conn:
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

    with _connect(args) as conn:
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

    with _connect(args) as conn:
        removed = drop_index(conn, args.source, args.name)
    print(f"dropped index {args.name} of {args.source} ({removed} edges)")


def cmd_index_check(args: argparse.Namespace) -> None:
    from agentdb.indexes import check_indexes, rebuild_indexes

    with _connect(args) as conn:
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


def _names(text: str | None) -> list[str] | None:
    """A comma-separated list of names; None when the option is absent, [] when it is empty."""
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def cmd_principal_create(args: argparse.Namespace) -> None:
    from agentdb.auth import create_principal

    with _connect(args) as conn:
        principal, key = create_principal(
            conn,
            args.name,
            tables=_names(args.tables) or [],
            row_filter=_json_arg(args.row_filter, "row_filter"),
            fields=_names(args.fields),
            tools=_names(args.tools) or [],
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

    with _connect(args) as conn:
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

    with _connect(args) as conn:
        delete_principal(conn, args.name)
    print(f"deleted principal {args.name}: its key no longer works")


# --- memory stores ------------------------------------------------------------------------------------


def _memory_principal(conn: psycopg.Connection[Any], name: str | None) -> Any:
    """The principal `--as NAME` acts for (its stores, under its role), or None for the application's."""
    if name is None:
        return None
    from agentdb.auth import list_principals
    from agentdb.errors import StorageFileNotFound

    found = next((p for p in list_principals(conn) if p.name == name), None)
    if found is None:
        raise StorageFileNotFound(f"unknown principal {name!r}", path="as")
    return found


def _memory_vars(specs: list[str] | None) -> dict[str, str]:
    """`--var user_id=42` options as {name: value}."""
    out = {}
    for i, spec in enumerate(specs or ()):
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise InvalidParamValue(f"--var takes NAME=VALUE, not {spec!r}", path=f"var[{i}]")
        out[name] = value
    return out


def _memory_embedder(args: argparse.Namespace) -> Any:
    from agentdb.embed import load_embedder

    return None if getattr(args, "no_embed", False) else load_embedder()


def _memory_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "top_k": args.top_k,
        "decay": args.decay,
        "ranking": args.ranking,
        "half_life_hours": args.half_life_hours,
    }
    if args.weights:
        parts = args.weights.split(",")
        if len(parts) != 3:
            raise InvalidParamValue(
                "--weights takes RECENCY,IMPORTANCE,RELEVANCE, e.g. 1,1,1", path="weights"
            )
        try:
            options["weights"] = dict(
                zip(("recency", "importance", "relevance"), map(float, parts), strict=True)
            )
        except ValueError:
            raise InvalidParamValue(
                f"--weights takes three numbers, not {args.weights!r}", path="weights"
            ) from None
    if getattr(args, "as_of", None):
        options["as_of"] = args.as_of
    return options


def cmd_memory_list(args: argparse.Namespace) -> None:
    from agentdb.memory import list_stores

    with _connect(args) as conn:
        stores = list_stores(conn, principal=_memory_principal(conn, args.as_principal))
    if args.json:
        print(orjson.dumps([s.model_dump(mode="json", by_alias=True) for s in stores]).decode())
        return
    if not stores:
        print("no memory stores yet: `agentdb memory write STORE FILE.jsonl` (or --text) makes one")
        return
    print(f"{'store':24} {'records':>8} {'entities':>9} {'relations':>10}  fields")
    for s in stores:
        fields = ", ".join(f"{f.name}:{f.type}" for f in s.fields) or "-"
        print(f"{s.name:24} {s.records:>8} {s.entities:>9} {s.relations:>10}  {fields}")


def cmd_memory_write(args: argparse.Namespace) -> None:
    from agentdb.memory import StoreSpec, write_records
    from agentdb.memory.eval_memory import load_records
    from agentdb.sources import FieldSpec

    records: list[dict[str, Any]] = []
    for path in args.files:
        records += load_records(Path(path))
    if args.text is not None:
        record: dict[str, Any] = {"text": args.text, "importance": args.importance}
        if args.id:
            record["id"] = args.id
        if args.entity:
            record["entities"] = args.entity
        records.append(record)
    if not records:
        raise InvalidParamValue("give JSONL files of records, or --text", path="files")
    spec = None
    if args.field or args.schema or args.single_valued is not None:
        spec = StoreSpec(
            fields=None
            if not args.field
            else [FieldSpec(name=n, type=t, optional=True) for n, t in _field_types(args.field).items()],  # type: ignore[arg-type]
            schema=args.schema,
            single_valued=_names(args.single_valued),
        )
    with _connect(args, migrate_schema=True) as conn:
        report = write_records(
            conn,
            args.store,
            records,
            principal=_memory_principal(conn, args.as_principal),
            embedder=_memory_embedder(args),
            spec=spec,
            variables=_memory_vars(args.var),
        )
    closed = sum(len(r.closed) for r in report.relations)
    print(
        f"{'created' if report.created_store else 'wrote to'} memory store {report.store}: {len(report.ids)} records,"
        f" {len(report.entities_created)} new entities, {len(report.relations)} relations"
        + (f" ({closed} earlier ones closed)" if closed else "")
    )


def cmd_memory_recall(args: argparse.Namespace) -> None:
    from agentdb.memory import assemble, recall

    with _connect(args) as conn:
        result = recall(
            conn,
            args.store,
            args.query,
            principal=_memory_principal(conn, args.as_principal),
            embedder=_memory_embedder(args),
            options={**_memory_options(args), "include_history": args.history, "touch": not args.no_touch},
            variables=_memory_vars(args.var),
        )
    if args.json:
        print(result.model_dump_json())
        return
    if args.max_tokens:
        print(assemble(result, max_tokens=args.max_tokens).text)
        return
    entries = ", ".join(f"{e.name} ({e.via})" for e in result.entry_nodes) or "none"
    print(
        f"ranked by {' + '.join(result.ranked_by) or 'nothing (all candidates tie)'}; relevance: {result.relevance}"
    )
    print(f"entry nodes: {entries}; {result.candidate_count} candidates")
    for c in result.candidates:
        t = c.terms
        state = "" if c.current else "  [superseded]"
        print(
            f"{c.rank:>3}. {c.text}{state}\n     [{c.id}] score {c.score:.3f} = recency {t.recency.weighted:.3f}"
            f" + importance {t.importance.weighted:.3f} + relevance {t.relevance.weighted:.3f}"
            f" (importance {c.importance}, {c.hours_since_access:.0f} h since access"
            + (
                f", relevance via {t.relevance.via}"
                if t.relevance.via and t.relevance.via != "memory"
                else ""
            )
            + ")"
        )
    for f in result.facts:
        print(
            f"   fact: {f.subject} {f.predicate} {f.object}"
            + ("" if f.current else f" (until {f.invalid_from})")
        )


def cmd_memory_get(args: argparse.Namespace) -> None:
    from agentdb.memory import get_record

    with _connect(args) as conn:
        record = get_record(
            conn,
            args.store,
            args.id,
            principal=_memory_principal(conn, args.as_principal),
            variables=_memory_vars(args.var),
            touch=not args.no_touch,
        )
    print(record.model_dump_json(indent=2))


def cmd_memory_delete(args: argparse.Namespace) -> None:
    from agentdb.memory import delete_record

    with _connect(args) as conn:
        delete_record(
            conn,
            args.store,
            args.id,
            principal=_memory_principal(conn, args.as_principal),
            variables=_memory_vars(args.var),
        )
    print(f"deleted record {args.id}")


def cmd_memory_relate(args: argparse.Namespace) -> None:
    from agentdb.memory import write_relations

    relation: dict[str, Any] = {"subject": args.subject, "predicate": args.predicate, "object": args.object}
    if args.single:
        relation["single_valued"] = True
    if args.record:
        relation["record_id"] = args.record
    if args.valid_from:
        relation["valid_from"] = args.valid_from
    with _connect(args) as conn:
        result = write_relations(
            conn,
            args.store,
            [relation],
            principal=_memory_principal(conn, args.as_principal),
            embedder=_memory_embedder(args),
            variables=_memory_vars(args.var),
        )[0]
    closed = f"; closed {len(result.closed)} earlier" if result.closed else ""
    print(f"{result.subject} {result.predicate} {result.object}: {result.status}{closed}")


def cmd_memory_entity(args: argparse.Namespace) -> None:
    from agentdb.memory import get_entity

    with _connect(args) as conn:
        entity = get_entity(
            conn,
            args.store,
            args.name,
            principal=_memory_principal(conn, args.as_principal),
            variables=_memory_vars(args.var),
            include_history=args.history,
        )
    print(entity.model_dump_json(indent=2))


def cmd_memory_drop(args: argparse.Namespace) -> None:
    from agentdb.memory import drop_store

    with _connect(args) as conn:
        drop_store(
            conn,
            args.store,
            principal=_memory_principal(conn, args.as_principal),
            variables=_memory_vars(args.var),
        )
    print(f"dropped memory store {args.store}")


def cmd_eval_memory(args: argparse.Namespace) -> None:
    from agentdb.evaluation import split_by_id
    from agentdb.memory.eval_memory import evaluate_memory, load_cases, memory_table

    halves = split_by_id(load_cases(Path(args.cases)), lambda c: c.id)
    scores = {}
    embedder = _memory_embedder(args)
    with _connect(args) as conn:
        principal = _memory_principal(conn, args.as_principal)
        for half, cases in halves.items():
            scores[half] = evaluate_memory(
                conn,
                args.store,
                cases,
                embedder=embedder,
                k=args.k,
                principal=principal,
                options={k: v for k, v in _memory_options(args).items() if k != "top_k"},
            )
    if args.json:
        print(orjson.dumps({half: [s.to_dict() for s in rows] for half, rows in scores.items()}).decode())
        return
    for half, rows in scores.items():
        print(
            f"{half}: {len(halves[half])} cases over memory store {args.store}"
            " (recall never touches the records here)"
        )
        print(memory_table(rows))


def cmd_mcp(args: argparse.Namespace) -> None:
    from agentdb.mcp.stdio import serve_stdio

    settings = _settings(args)
    _require_database(args, settings)
    serve_stdio(settings)


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from agentdb.api import create_app

    settings = _settings(args)
    check_port_free(settings.host, settings.port)
    warm_embedder()
    print(f"agentdb serving on http://{settings.host}:{settings.port} (OpenAPI at /docs)", file=sys.stderr)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")


def warm_embedder() -> None:
    """Load the embedding model in the background while the server starts, so that the first dense search
    does not wait for it (a failure here is logged; the search then loads it, and reports the error)."""
    from agentdb.embed import load_embedder

    def warm() -> None:
        try:
            load_embedder()
        except Exception:
            logging.getLogger(__name__).exception("loading the embedding model failed")

    print("loading the embedding model in the background", file=sys.stderr)
    threading.Thread(target=warm, name="warm-embedder", daemon=True).start()


def check_port_free(host: str, port: int) -> None:
    """One clear error before anything starts when the address is taken (uvicorn would say so only after
    the database, migrations and the model were set up, and after we printed "serving on")."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise InvalidParamValue(
            f"cannot serve on {host}:{port}: {exc.strerror or exc}",
            path="port",
            hint="another program (perhaps another agentdb serve) uses it: stop it, or serve on another port "
            "(--port 8081, AGENTDB_PORT=8081, or `make run PORT=8081`)",
        ) from None


def cmd_pack_export(args: argparse.Namespace) -> None:
    from agentdb.pack import export_pack

    path = Path(args.file)
    with _connect(args) as conn:
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

    with _connect(args, migrate_schema=True, create=True) as conn:
        report = import_pack(
            conn,
            Path(args.file),
            embedding_model=_settings(args).embedding_model,
            source_name=args.source,
            replace=args.replace,
            progress=not args.no_progress,
        )
    print(report.summary())


def cmd_demo(args: argparse.Namespace) -> None:
    from agentdb.sources import list_sources

    if not args.no_serve:  # before the load, not after it
        settings = _settings(args)
        check_port_free(settings.host, settings.port)
    with _connect(args, migrate_schema=True, create=True) as conn:
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
                    conn, pack, embedding_model=_settings(args).embedding_model, source_name=DEMO_SOURCE
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


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        help="the embedded server's data directory (env AGENTDB_DATA_DIR; default: the .agentdb of this "
        "folder or of its nearest parent that has one, else ./.agentdb); ignored when DATABASE_URL is set",
    )


def _add_replica(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replica",
        action="append",
        metavar="URL",
        help="a streaming replica of the database that serves reads (repeatable; env AGENTDB_REPLICA_URLS, "
        "comma-separated); default: the embedded server's standbys from `agentdb start --replicas N`",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentdb",
        description="A retrieval agent that lives inside PostgreSQL. "
        "Uses DATABASE_URL when set, else an embedded PostgreSQL in --data-dir.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, func: Callable[[argparse.Namespace], None], help_text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_common(p)
        p.set_defaults(func=func)
        return p

    p = command("serve", cmd_serve, "serve the HTTP API (binds 127.0.0.1:8080 by default)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    _add_replica(p)

    command("mcp", cmd_mcp, "serve MCP over stdio for an assistant (as the principal of AGENTDB_API_KEY)")

    p = command("demo", cmd_demo, "load the demo corpus (the PostgreSQL manual) if needed, then serve")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--no-serve", action="store_true", help="load the demo corpus and exit")

    command("migrate", cmd_migrate, "apply pending migrations and re-apply the stored functions")
    command(
        "db-url",
        cmd_db_url,
        "print a URL psql can use (starts the embedded server and keeps it up until `agentdb stop`)",
    )
    p = command(
        "start",
        cmd_start,
        "start the embedded server (or keep the running one) and keep it up until `agentdb stop`; "
        "prints its URL",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=0,
        metavar="N",
        help="also start N local streaming standbys (own data directories under the data directory, own ports, "
        "stopped with the server); prints their URLs after the server's",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="run the embedded server as a Citus coordinator with N local workers (own data directories under "
        "the data directory, own sockets, stopped with the server)",
    )
    p.add_argument(
        "--citus-source",
        metavar="TARBALL",
        help="the Citus source tarball (citus-X.Y.Z.tar.gz) to build once for --workers "
        "(env AGENTDB_CITUS_SOURCE; the build is cached in AGENTDB_CITUS_CACHE, else <data-dir>/citus)",
    )
    p = command(
        "stop",
        cmd_stop,
        "stop the embedded server a user started; agentdb processes still using it keep it until they exit",
    )
    p.add_argument(
        "--force", action="store_true", help="stop it now even if agentdb processes use it (fast shutdown)"
    )
    p = command(
        "status",
        cmd_status,
        "the embedded server: state, pid, socket, uptime, who keeps it up, sources; the read replicas: role, "
        "replay lag, rotation",
    )
    p.add_argument("--json", action="store_true")
    _add_replica(p)
    p = command("sources", cmd_sources, "list the sources with their counts and fields")
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

    p = command("ingest", cmd_ingest, "ingest JSONL, CSV or Parquet files (gzip too) into a document source")
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
        "--field",
        action="append",
        metavar="NAME:TYPE",
        help="the type of a CSV column or JSON Lines key (int, float, bool, timestamp, string) instead of "
        "inferring it; repeatable",
    )
    p.add_argument("--skip-bad", action="store_true", help="report and skip bad rows instead of aborting")
    p.add_argument("--no-progress", action="store_true")

    p = command("register", cmd_register, "register an existing table in place as a source")
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

    p = command("search", cmd_search, "search a source (dense, lexical or hybrid)")
    p.add_argument("source")
    p.add_argument("query")
    p.add_argument("--mode", default="hybrid", choices=["dense", "lexical", "hybrid"], help="default hybrid")
    p.add_argument("--top-k", type=int, default=10, help="hits to return (default 10)")
    p.add_argument("--rrf-k", type=int, default=RRF_K, help="RRF's k: 1 / (k + rank) (default 60)")
    p.add_argument(
        "--fusion",
        default="rrf",
        choices=["rrf", "convex"],
        help="hybrid fusion: reciprocal ranks (rrf, the default) or alpha x BM25 + (1 - alpha) x cosine "
        "similarity, each min-max normalised over its leg's candidates (convex)",
    )
    p.add_argument(
        "--alpha", type=float, default=0.5, help="BM25 weight of --fusion convex, 0..1 (default 0.5)"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="max cosine distance on the dense leg (default 0.5; 0 = none); all-MiniLM-L6-v2 puts many "
        "relevant passages beyond 0.5: 0.7 keeps them",
    )
    p.add_argument("--filter", help='metadata filter as JSON, e.g. \'{"year": {"$gte": 2020}}\'')
    p.add_argument("--group-by-doc", action="store_true", help="best chunk per document")
    p.add_argument("--json", action="store_true")

    p = command("eval", cmd_eval, "nDCG@10 and Recall@100 on BEIR-format queries and qrels")
    p.add_argument("source")
    p.add_argument("--queries", required=True)
    p.add_argument("--qrels", required=True)
    p.add_argument("--mode", action="append", choices=["dense", "lexical", "hybrid"])
    p.add_argument("--fusion", default="rrf", choices=["rrf", "convex"], help="hybrid fusion, as in search")
    p.add_argument("--alpha", type=float, default=0.5, help="BM25 weight of --fusion convex, 0..1")
    p.add_argument(
        "--threshold", type=float, default=0.0, help="max cosine distance on the dense leg; 0 = none"
    )
    p.add_argument("--no-progress", action="store_true")

    p = command(
        "eval-nav",
        cmd_eval_nav,
        "runbook questions with gold keys: ranked tree navigation beside plain hybrid search "
        "(success@1/3/10, MRR, gold recall@10, nodes read, latency)",
    )
    p.add_argument("source")
    p.add_argument("--questions", required=True, help='JSON Lines of {"id", "question", "gold": [keys]}')
    p.add_argument("--index", default="sections", help="the tree index to walk (default sections)")
    p.add_argument(
        "--links-index",
        default="xref",
        help="the graph index whose links hybrid-ranked navigation follows (default xref; '' for none)",
    )
    p.add_argument("--no-progress", action="store_true")

    p = command("check", cmd_check, "verify that postings and statistics match the documents")
    p.add_argument("source")
    p.add_argument("--repair", action="store_true", help="rebuild the lexical index when it does not match")

    p = command(
        "optimize", cmd_optimize, "merge a source's partly filled posting blocks (or change its layout)"
    )
    p.add_argument("source")
    p.add_argument(
        "--layout",
        choices=["rows", "blocks"],
        help="store the BM25 postings as one row per term and chunk, or in blocks of 128 chunks per term",
    )

    help_text = "agentdb's C accelerator of the lexical leg, for a self-hosted PostgreSQL 18"
    p = sub.add_parser("accel", help=help_text, description=help_text)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    help_text = "compile it against a server's pg_config and print what to install where"
    q = actions.add_parser("build", help=help_text, description=help_text)
    q.set_defaults(func=cmd_accel_build)
    q.add_argument("--pg-config", required=True, type=Path, help="the server's pg_config")
    q.add_argument("--out", type=Path, default=Path("agentdb-accel"), help="where to put the build")

    help_text = "hierarchy and graph indexes over a source: trees, graphs and explicit edges"
    p = sub.add_parser("index", help=help_text, description=help_text)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, func, text in (
        ("create", cmd_index_create, "declare an index and build its edges from the documents (or a file)"),
        ("list", cmd_index_list, "list a source's indexes with their edge counts"),
        ("drop", cmd_index_drop, "remove an index and its edges"),
        ("check", cmd_index_check, "compare the edges with the documents (non-zero exit on mismatches)"),
    ):
        q = actions.add_parser(name, help=text, description=text)
        _add_common(q)
        q.set_defaults(func=func)
        q.add_argument("source")
        if name == "create":
            q.add_argument("name")
            how = q.add_mutually_exclusive_group(required=True)
            how.add_argument("--tree", metavar="PARENT_FIELD", help="a tree: each document's parent key")
            how.add_argument("--graph", metavar="FIELD", help="a graph: a key or list of keys per document")
            how.add_argument(
                "--edges",
                metavar="FILE",
                help="explicit edges: JSONL or CSV (from, to, type, weight, metadata)",
            )
            q.add_argument(
                "--edge-type",
                help="the edges' type (default: child for a tree, the field's name for a graph)",
            )
            q.add_argument(
                "--kind", choices=["tree", "graph"], help="with --edges: the index's kind (default graph)"
            )
        elif name == "list":
            q.add_argument("--json", action="store_true")
        elif name == "drop":
            q.add_argument("name")
        else:
            q.add_argument("name", nargs="?", help="one index (default: all of the source's)")
            q.add_argument(
                "--repair", action="store_true", help="rebuild field-derived edges that do not match"
            )

    help_text = "manage principals: API keys with their sources, row filter, fields and tools"
    p = sub.add_parser("principal", help=help_text, description=help_text)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(
        name: str, func: Callable[[argparse.Namespace], None], help_text: str
    ) -> argparse.ArgumentParser:
        q = actions.add_parser(name, help=help_text, description=help_text)
        _add_common(q)
        q.set_defaults(func=func)
        return q

    q = action("create", cmd_principal_create, "create a principal and print its API key (shown only once)")
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
    q = action("list", cmd_principal_list, "list the principals (keys are never shown)")
    q.add_argument("--json", action="store_true")
    q = action("delete", cmd_principal_delete, "delete a principal; its key stops working at once")
    q.add_argument("name")

    help_text = "knowledge packs: a source's documents, chunks and embeddings in one Parquet file"
    p = sub.add_parser("pack", help=help_text, description=help_text)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = action("export", cmd_pack_export, "write a document source to a pack file")
    q.add_argument("source")
    q.add_argument("file")
    q.add_argument(
        "--float32",
        action="store_true",
        help="store vectors as float32 (exact; default float16, half the size)",
    )
    q.add_argument("--no-progress", action="store_true")
    q = action(
        "import", cmd_pack_import, "load a pack as a new source, in one transaction (no embedding needed)"
    )
    q.add_argument("file")
    q.add_argument("--source", help="the new source's name (default: the name in the pack)")
    q.add_argument("--replace", action="store_true", help="replace an existing source of that name")
    q.add_argument("--no-progress", action="store_true")

    help_text = (
        "memory stores: records with importance, an entity graph, recall by recency, importance, relevance"
    )
    p = sub.add_parser("memory", help=help_text, description=help_text)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def memory_action(
        name: str, func: Callable[[argparse.Namespace], None], help_text: str
    ) -> argparse.ArgumentParser:
        q = action(name, func, help_text)
        q.add_argument(
            "--as", dest="as_principal", metavar="PRINCIPAL", help="act on this principal's stores"
        )
        if name != "list":
            q.add_argument("store", help="store name; may be a template such as user_{var.user_id}")
            q.add_argument(
                "--var", action="append", metavar="NAME=VALUE", help="a variable of the store name"
            )
        return q

    q = memory_action("list", cmd_memory_list, "list the memory stores with their counts")
    q.add_argument("--json", action="store_true")
    q = memory_action(
        "write",
        cmd_memory_write,
        "write records (JSONL files, or one --text) in one transaction; makes the store",
    )
    q.add_argument(
        "files", nargs="*", help='JSONL records: {"id", "text", "importance", "metadata", "entities", ...}'
    )
    q.add_argument("--text", help="one record's text")
    q.add_argument("--importance", type=int, default=5, help="with --text: 1..10 (default 5)")
    q.add_argument("--id", help="with --text: the record id (default: generated)")
    q.add_argument("--entity", action="append", help="with --text: an entity it mentions (repeatable)")
    q.add_argument(
        "--field", action="append", metavar="NAME:TYPE", help="a record schema field of a new store"
    )
    q.add_argument(
        "--schema", help="the record schema's name (a new store's, or checked against an existing one)"
    )
    q.add_argument("--single-valued", help="comma-separated predicates with one current object per subject")
    q.add_argument("--no-embed", action="store_true", help="write without embeddings (no relevance for them)")
    q = memory_action(
        "recall", cmd_memory_recall, "recall: entry nodes, traversal, ranked memories with their terms"
    )
    q.add_argument("query")
    q.add_argument("--top-k", type=int, default=5)
    q.add_argument(
        "--decay", type=float, default=MEMORY_DECAY, help="recency = decay ** hours since last access"
    )
    q.add_argument(
        "--ranking",
        default="calibrated",
        choices=["calibrated", "generative_agents"],
        help="calibrated (raw similarity, half-life slowed by importance) or the paper's min-max formula",
    )
    q.add_argument(
        "--half-life-hours",
        type=float,
        default=MEMORY_HALF_LIFE_HOURS,
        help="calibrated: at importance 1 (x importance^2)",
    )
    q.add_argument(
        "--weights", help="RECENCY,IMPORTANCE,RELEVANCE (default: the ranking's, 1,0.5,3 or 1,1,1)"
    )
    q.add_argument(
        "--history", action="store_true", help="include contradicted (superseded) memories and facts"
    )
    q.add_argument("--no-touch", action="store_true", help="leave the last-accessed times alone")
    q.add_argument("--as-of", help="the time recency is measured to (ISO 8601; default now)")
    q.add_argument(
        "--no-embed", action="store_true", help="rank without relevance (recency and importance only)"
    )
    q.add_argument("--max-tokens", type=int, help="print the <memory> block for a prompt within this budget")
    q.add_argument("--json", action="store_true")
    q = memory_action("get", cmd_memory_get, "read a record by id (updates its last-accessed time)")
    q.add_argument("id")
    q.add_argument("--no-touch", action="store_true")
    q = memory_action(
        "delete", cmd_memory_delete, "delete a record with its mentions and the relations it asserted"
    )
    q.add_argument("id")
    q = memory_action("relate", cmd_memory_relate, "assert a relation SUBJECT PREDICATE OBJECT")
    q.add_argument("subject")
    q.add_argument("predicate")
    q.add_argument("object")
    q.add_argument("--single", action="store_true", help="single-valued: close the subject's current one")
    q.add_argument("--record", help="the record that asserted it")
    q.add_argument("--valid-from", help="ISO 8601 (default now)")
    q.add_argument("--no-embed", action="store_true")
    q = memory_action("entity", cmd_memory_entity, "an entity with its relations in both directions")
    q.add_argument("name")
    q.add_argument("--history", action="store_true", help="closed relations too")
    q = memory_action("drop", cmd_memory_drop, "drop a store with everything in it")

    p = command(
        "eval-memory",
        cmd_eval_memory,
        "recall@k of memory recall on labelled cases, beside pure vector similarity and recency alone",
    )
    p.add_argument("store")
    p.add_argument(
        "--cases", required=True, help='JSON Lines of {"id", "question", "gold", "stale", "category", "at"}'
    )
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--top-k", type=int, default=5, help=argparse.SUPPRESS)
    p.add_argument("--decay", type=float, default=MEMORY_DECAY)
    p.add_argument(
        "--ranking",
        default="calibrated",
        choices=["calibrated", "generative_agents"],
        help="calibrated (raw similarity, half-life slowed by importance) or the paper's min-max formula",
    )
    p.add_argument(
        "--half-life-hours",
        type=float,
        default=MEMORY_HALF_LIFE_HOURS,
        help="calibrated: at importance 1 (x importance^2)",
    )
    p.add_argument(
        "--weights", help="RECENCY,IMPORTANCE,RELEVANCE (default: the ranking's, 1,0.5,3 or 1,1,1)"
    )
    p.add_argument("--as", dest="as_principal", metavar="PRINCIPAL")
    p.add_argument("--no-embed", action="store_true")
    p.add_argument("--json", action="store_true")
    return parser


def _exit_on_signal(signum: int, frame: object) -> None:
    """SIGTERM (and SIGHUP) end the command like Ctrl-C does: through the normal exit, so the embedded
    server's handle is released (and the server stopped when this was its last user). Python's default
    would kill the process on the spot and leave the server running with this pid listed as a user."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    # uvicorn handles SIGTERM itself while it serves, then raises it again once it has shut down: with this
    # handler that, too, ends in a normal exit.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_signal)
        signal.signal(signal.SIGHUP, _exit_on_signal)
    if args.command == "eval" and not args.mode:
        args.mode = ["lexical", "dense", "hybrid"]
    try:
        args.func(args)
    except AgentDBError as exc:
        where = f" (at {exc.path})" if exc.path else ""
        hint = f"; hint: {exc.hint}" if exc.hint else ""
        print(f"agentdb: error {exc.code} {exc.name}: {exc.message}{where}{hint}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        mapped = from_db_error(exc)
        if mapped is not None:
            print(f"agentdb: error {mapped.code} {mapped.name}: {mapped.message}", file=sys.stderr)
        elif is_outage(exc):
            print(
                f"agentdb: error: cannot reach the database: {str(exc).strip().splitlines()[0]}; "
                "check DATABASE_URL or --data-dir",
                file=sys.stderr,
            )
        else:
            print(f"agentdb: error: the database refused the command: {str(exc).strip()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`agentdb sources | head`): stop quietly, as other command-line tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
