"""The accelerator: agentdb's own C extension (ext/), the exact BM25 top k as a postings cursor.

The embedded server's wheel ships its pg_config with the server headers and PGXS, so the first start of a data
directory compiles ext/ against it into `<pgdata>/agentdb_accel/<key>/` (key: server version and a digest of
the sources; built in a scratch folder under a file lock, then renamed into place), points the server's
`extension_control_path` and `dynamic_library_path` there (`<pgdata>/agentdb-accel.conf`), and each migrated
database creates the extension. Without a compiler, or on a server that cannot load it, retrieval takes the
plain SQL path, which returns the same answers; the reason is logged once. AGENTDB_LEXICAL_PATH=sql forces the
SQL path (the `agentdb.lexical_path` setting of every session of the database).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from agentdb.resources import EXT, resource

log = logging.getLogger(__name__)

EXTENSION = "agentdb_accel"
SCRIPTS = (
    f"{EXTENSION}--1.2.sql",
    f"{EXTENSION}--1.0--1.1.sql",
    f"{EXTENSION}--1.1--1.2.sql",
    f"{EXTENSION}--1.2--1.3.sql",
    f"{EXTENSION}--1.3--1.4.sql",
    f"{EXTENSION}--1.4--1.5.sql",
    f"{EXTENSION}--1.5--1.6.sql",
)  # install, updates
SOURCES = ("Makefile", f"{EXTENSION}.c", f"{EXTENSION}_plans.c", f"{EXTENSION}.control", *SCRIPTS)
BUILD_DIR = "agentdb_accel"  # inside pgdata: the server's user can read it, and base backups carry it
CONF_FILE = "agentdb-accel.conf"
_INCLUDE = f"include_if_exists = '{CONF_FILE}'"
PATH_ENV = "AGENTDB_LEXICAL_PATH"
# Flags of pg_config's CFLAGS that the machine's compiler may not know (Debian 12's gcc 12 rejects this one).
DROPPED_CFLAGS = ("-Wmissing-variable-declarations",)

_said: set[str] = set()


def say_once(reason: str) -> None:
    """Log, once per process, why retrieval takes the plain SQL path."""
    if reason not in _said:
        _said.add(reason)
        log.warning("lexical retrieval uses the plain SQL path: %s", reason)


def forced_sql() -> bool:
    return os.environ.get(PATH_ENV, "").strip().lower() == "sql"


def source_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + resource(EXT, name).read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Built:
    """A build of the extension: `share/extension/` holds its control and script files, `lib/` its library."""

    root: Path

    @property
    def share(self) -> Path:
        return self.root / "share"

    @property
    def lib(self) -> Path:
        return self.root / "lib"


class BuildError(Exception):
    """The extension could not be built here (the message says why, in one line)."""


def _pg_config(pg_config: Path, option: str) -> str:
    return subprocess.run([str(pg_config), option], check=True, capture_output=True, text=True).stdout.strip()


def compile_into(pg_config: Path, target: Path) -> Built:
    """Compile ext/ with PGXS against `pg_config` and lay the result out in `target` (which must not exist)."""
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        raise BuildError("no C compiler (gcc) or make on PATH")
    try:
        cflags = _pg_config(pg_config, "--cflags")
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"{pg_config} does not answer: {exc}") from exc
    cflags = " ".join(flag for flag in cflags.split() if flag not in DROPPED_CFLAGS)
    with tempfile.TemporaryDirectory(prefix="agentdb-accel-build-") as scratch:
        src = Path(scratch)
        for name in SOURCES:
            (src / name).write_bytes(resource(EXT, name).read_bytes())
        done = subprocess.run(
            ["make", "-s", f"PG_CONFIG={pg_config}", f"CFLAGS={cflags}"],
            cwd=src,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            raise BuildError("the build failed: " + " | ".join(lines[-3:]))
        built = Built(target)
        (built.share / "extension").mkdir(parents=True)
        built.lib.mkdir()
        shutil.copyfile(src / f"{EXTENSION}.so", built.lib / f"{EXTENSION}.so")
        for name in (f"{EXTENSION}.control", *SCRIPTS):
            shutil.copyfile(src / name, built.share / "extension" / name)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or path.suffix == ".so" else 0o644)
    return built


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_built(pgdata: Path, pg_config: Path) -> Built:
    """The build for this server version and these sources in `pgdata`, compiled first when absent (one
    process at a time; a half-made build is never seen). Raises BuildError."""
    version = re.sub(r"[^0-9A-Za-z.]+", "", _pg_config(pg_config, "--version").split()[-1])
    key = f"pg{version}-{source_digest()}"
    base = pgdata / BUILD_DIR
    base.mkdir(mode=0o755, exist_ok=True)
    built = Built(base / key)
    if (built.lib / f"{EXTENSION}.so").exists():
        return built
    with _file_lock(base / ".lock"):
        if (built.lib / f"{EXTENSION}.so").exists():
            return built
        scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=base))
        try:
            compile_into(pg_config, scratch / key)
            (scratch / key).rename(built.root)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # Older builds are left for servers still running them; only the current key is configured.
        log.info("built the agentdb accelerator for PostgreSQL %s in %s", version, built.root)
    return built


def write_conf(pgdata: Path, built: Built | None) -> bool:
    """Point the server's extension and library paths at `built` (none: the server's own only), and force the
    SQL path when AGENTDB_LEXICAL_PATH=sql, in `pgdata/agentdb-accel.conf` (included from postgresql.conf).
    Returns whether a file changed (the server must reload)."""
    lines = ["# Written by agentdb at each start: where the server finds agentdb's accelerator."]
    if built is not None:
        lines += [
            f"extension_control_path = '$system:{built.share}'",
            f"dynamic_library_path = '$libdir:{built.lib}'",
        ]
    if forced_sql():
        lines.append("agentdb.lexical_path = 'sql'")
    settings = "\n".join(lines) + "\n"
    path = pgdata / CONF_FILE
    changed = not path.exists() or path.read_text() != settings
    if changed:
        path.write_text(settings)
    conf = pgdata / "postgresql.conf"
    text = conf.read_text()
    if _INCLUDE not in text.splitlines():
        conf.write_text(text.rstrip("\n") + "\n" + _INCLUDE + "\n")
        changed = True
    return changed


def prepare_embedded(pgdata: Path, bin_path: Path) -> bool:
    """Build the accelerator for the embedded server in `pgdata` (binaries in `bin_path`) and configure the
    server for it. Returns whether the configuration changed. When it cannot be built, says why once."""
    built: Built | None = None
    if forced_sql():
        say_once(f"{PATH_ENV}=sql")
    try:
        built = ensure_built(pgdata, bin_path / "pg_config")
    except (BuildError, OSError, subprocess.CalledProcessError) as exc:
        say_once(f"the accelerator could not be built ({exc})")
    return write_conf(pgdata, built)


def await_reload(admin_url: str, pgdata: Path, timeout: float = 10.0) -> None:
    """Wait until new sessions of the server see `pgdata/agentdb-accel.conf` (pg_reload_conf only signals)."""
    path = pgdata / CONF_FILE
    want = (
        next(
            (
                line.split("=", 1)[1].strip().strip("'")
                for line in path.read_text().splitlines()
                if line.startswith("dynamic_library_path")
            ),
            "$libdir",
        )
        if path.exists()
        else "$libdir"
    )
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            row = conn.execute("select current_setting('dynamic_library_path')").fetchone()
        if (row and row[0] == want) or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def install(url: str) -> str:
    """Create the extension in the database at `url` when the server offers it and it is not there yet.
    Returns the lexical path that retrieval takes there: 'accel' or 'sql' (said once when 'sql', with why)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            available = conn.execute(
                "select 1 from pg_available_extensions where name = %s", (EXTENSION,)
            ).fetchone()
            if available is None:
                say_once("the server offers no agentdb_accel extension")
                return "sql"
            if conn.execute("select 1 from pg_extension where extname = 'citus'").fetchone():
                # The accelerator is this node's own: Citus would carry the statements to workers that do not
                # have it (and fail while one is down).
                conn.execute("set citus.enable_ddl_propagation = off")
            conn.execute(sql.SQL("create extension if not exists {}").format(sql.Identifier(EXTENSION)))
            conn.execute(sql.SQL("alter extension {} update").format(sql.Identifier(EXTENSION)))
            if conn.execute("select to_regprocedure('agentdb_internal.lexical_path()')").fetchone() == (
                None,
            ):
                return "accel"  # not migrated yet: the stored functions will take the accelerator
            return path_in_use(conn)
    except psycopg.Error as exc:
        say_once(f"the accelerator could not be loaded: {str(exc).strip().splitlines()[0]}")
        return "sql"


def path_in_use(conn: psycopg.Connection[Any]) -> str:
    """The lexical path that retrieval takes on `conn`: 'accel' or 'sql' (agentdb_internal.lexical_path)."""
    row = conn.execute("select agentdb_internal.lexical_path()").fetchone()
    return str(row[0]) if row else "sql"


def describe(conn: psycopg.Connection[Any]) -> str:
    """Which lexical path serves retrieval on `conn`, and why when it is the plain SQL one (for status)."""
    if path_in_use(conn) == "accel":
        return "accelerated (agentdb_accel, C)"
    row = conn.execute(
        "select coalesce(current_setting('agentdb.lexical_path', true), '') = 'sql',"
        " exists (select 1 from pg_extension where extname = %s),"
        " exists (select 1 from pg_available_extensions where name = %s)",
        (EXTENSION, EXTENSION),
    ).fetchone()
    assert row is not None
    forced, installed, available = row
    if forced:
        why = f"agentdb.lexical_path is 'sql' ({PATH_ENV}=sql)"
    elif installed:
        why = "this role may not call the accelerator"
    elif available:
        why = "the agentdb_accel extension is not created in this database: run `agentdb migrate`"
    else:
        why = (
            "the server offers no agentdb_accel extension (no compiler when it started, or a managed server)"
        )
    return f"plain SQL ({why})"
