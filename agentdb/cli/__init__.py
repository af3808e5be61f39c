"""The `agentdb` command: serve, mcp, migrate, ingest, register, sources, search, eval, check, index, principal,
pack, memory, eval-memory, start, stop, status, db-url, demo.

One module per command group, each with the commands and an `add_parsers(subparsers)` that declares them:
server (serve, mcp, migrate, db-url, start, stop, status), demo, sources (sources, ingest, register, check,
optimize), search, evals (eval, eval-nav, eval-memory), accel, indexes, principals, pack, memory. `common` holds
what they share; `main` here parses the line, runs the command and turns its errors into an exit status."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

import psycopg

from agentdb.cli import accel, demo, evals, indexes, memory, pack, principals, search, server, sources
from agentdb.cli.common import Subparsers
from agentdb.errors import AgentDBError, from_db_error, is_outage

GROUPS: tuple[Callable[[Subparsers], None], ...] = (
    server.add_parsers,
    demo.add_parsers,
    sources.add_parsers,
    search.add_parsers,
    evals.add_parsers,
    accel.add_parsers,
    indexes.add_parsers,
    principals.add_parsers,
    pack.add_parsers,
    memory.add_parsers,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentdb",
        description="A retrieval agent that lives inside PostgreSQL. "
        "Uses DATABASE_URL when set, else an embedded PostgreSQL in --data-dir.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parsers in GROUPS:
        add_parsers(sub)
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
