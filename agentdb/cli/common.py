"""What the command groups share: settings and the connection from the command line, the list
arguments, and the parser helpers that give every command --data-dir."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeAlias

import psycopg

from agentdb.config import Settings, find_data_dir, has_database
from agentdb.errors import DatabaseSetupError, InvalidParamValue


def cli_settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        data_dir=getattr(args, "data_dir", None),
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        replica_urls=tuple(args.replica) if getattr(args, "replica", None) else None,
    )


def require_database(args: argparse.Namespace, settings: Settings) -> None:
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
def connect(
    args: argparse.Namespace, *, migrate_schema: bool = False, create: bool = False
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to an up-to-date database. Only the commands that write (ingest, register,
    demo, pack import; start and serve do it themselves) apply migrations; the others check that the schema
    is current and say what to run when it is not. Only those that load data (`create`) may make the embedded
    database."""
    from agentdb.db import resolve_url
    from agentdb.db.migrate import migrate, require_current
    from agentdb.db.pool import configure

    settings = cli_settings(args)
    if not create:
        require_database(args, settings)
    url = resolve_url(settings)
    with psycopg.connect(url, autocommit=True) as conn:
        if migrate_schema:
            migrate(conn)
        else:
            require_current(conn)
        configure(conn)
        yield conn


def split_names(text: str | None) -> list[str] | None:
    """A comma-separated list of names; None when the option is absent, [] when it is empty."""
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


DEFAULT_THRESHOLD = (
    0.5  # the dense leg's default max cosine distance (agentdb.retrieval.retrieve's, the API's)
)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        help="the embedded server's data directory (env AGENTDB_DATA_DIR; default: the .agentdb of this "
        "folder or of its nearest parent that has one, else ./.agentdb); ignored when DATABASE_URL is set",
    )


def add_replica(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replica",
        action="append",
        metavar="URL",
        help="a streaming replica of the database that serves reads (repeatable; env AGENTDB_REPLICA_URLS, "
        "comma-separated); default: the embedded server's standbys from `agentdb start --replicas N`",
    )


def field_types(specs: list[str]) -> dict[str, str]:
    """`--field price:float` options as {column: type}."""
    types = {}
    for i, spec in enumerate(specs):
        name, _, kind = spec.partition(":")
        if not name or not kind:
            raise InvalidParamValue(f"--field takes NAME:TYPE, not {spec!r}", path=f"field[{i}]")
        types[name] = kind
    return types


# the `add_subparsers()` value that each group's add_parsers fills
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Command = Callable[[argparse.Namespace], None]


def command(sub: Subparsers, name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
    """A command that runs `func`, with --data-dir."""
    p = sub.add_parser(name, help=help_text, description=help_text)
    add_common(p)
    p.set_defaults(func=func)
    return p


def group(sub: Subparsers, name: str, help_text: str) -> Subparsers:
    """A command whose actions come after it (`agentdb index create ...`)."""
    p = sub.add_parser(name, help=help_text, description=help_text)
    return p.add_subparsers(dest="action", required=True, metavar="ACTION")
