"""The embedded server and the HTTP and MCP servers: serve, mcp, migrate, db-url, start, stop, status."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import psycopg

from agentdb.cli.common import Subparsers, add_replica, cli_settings, command, require_database
from agentdb.config import Settings
from agentdb.errors import InvalidParamValue


def cmd_migrate(args: argparse.Namespace) -> None:
    from agentdb.db import resolve_url
    from agentdb.db.migrate import migrate

    with psycopg.connect(resolve_url(cli_settings(args))) as conn:
        applied = migrate(conn)
    print(
        f"applied migrations: {', '.join(f'{v:04d}' for v in applied)}"
        if applied
        else "database is up to date"
    )


def cmd_db_url(args: argparse.Namespace) -> None:
    from agentdb.db import resolve_url

    settings = cli_settings(args)
    require_database(args, settings)
    print(resolve_url(settings, keep_running=True))
    if not settings.database_url:
        print(
            "(the embedded server stays up for psql until `agentdb stop`, whatever other agentdb commands "
            "come and go)",
            file=sys.stderr,
        )


def _embedded_dir(args: argparse.Namespace, command: str) -> Path:
    settings = cli_settings(args)
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

        prepare_coordinator(data_dir, source_from_env(args.citus_source), args.workers)
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


def cmd_status(args: argparse.Namespace) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from agentdb.db.cluster import describe_node, node_report
    from agentdb.db.server import server_status

    settings = cli_settings(args)
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


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from agentdb.api import create_app

    settings = cli_settings(args)
    check_port_free(settings.host, settings.port)
    warm_embedder()
    print(f"agentdb serving on http://{settings.host}:{settings.port} (OpenAPI at /docs)", file=sys.stderr)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")


def cmd_mcp(args: argparse.Namespace) -> None:
    from agentdb.mcp.stdio import serve_stdio

    settings = cli_settings(args)
    require_database(args, settings)
    serve_stdio(settings)


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


def add_parsers(sub: Subparsers) -> None:
    p = command(sub, "serve", cmd_serve, "serve the HTTP API (binds 127.0.0.1:8080 by default)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    add_replica(p)

    command(
        sub, "mcp", cmd_mcp, "serve MCP over stdio for an assistant (as the principal of AGENTDB_API_KEY)"
    )

    command(sub, "migrate", cmd_migrate, "apply pending migrations and re-apply the stored functions")
    command(
        sub,
        "db-url",
        cmd_db_url,
        "print a URL psql can use (starts the embedded server and keeps it up until `agentdb stop`)",
    )
    p = command(
        sub,
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
        sub,
        "stop",
        cmd_stop,
        "stop the embedded server a user started; agentdb processes still using it keep it until they exit",
    )
    p.add_argument(
        "--force", action="store_true", help="stop it now even if agentdb processes use it (fast shutdown)"
    )
    p = command(
        sub,
        "status",
        cmd_status,
        "the embedded server: state, pid, socket, uptime, who keeps it up, sources; the read replicas: role, "
        "replay lag, rotation",
    )
    p.add_argument("--json", action="store_true")
    add_replica(p)
