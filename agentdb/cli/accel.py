"""accel build: compile the C accelerator of the lexical leg for a self-hosted PostgreSQL."""

from __future__ import annotations

import argparse
from pathlib import Path

from agentdb.cli.common import Subparsers, group
from agentdb.errors import InvalidParamValue


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


def add_parsers(sub: Subparsers) -> None:
    help_text = "agentdb's C accelerator of the lexical leg, for a self-hosted PostgreSQL 18"
    actions = group(sub, "accel", help_text)
    help_text = "compile it against a server's pg_config and print what to install where"
    q = actions.add_parser("build", help=help_text, description=help_text)
    q.set_defaults(func=cmd_accel_build)
    q.add_argument("--pg-config", required=True, type=Path, help="the server's pg_config")
    q.add_argument("--out", type=Path, default=Path("agentdb-accel"), help="where to put the build")
