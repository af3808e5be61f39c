"""Citus for the embedded server: built once from a source tarball, then installed into the server's own tree.

There is no download: the tarball is named by `--citus-source` or `AGENTDB_CITUS_SOURCE`. It is extracted and
compiled against the embedded server's `pg_config` in a build cache (`AGENTDB_CITUS_CACHE`, else
`<data-dir>/citus`), one folder per Citus version and server installation (`citus.so` links the server's
libpq by path, so a build belongs to one installation). A build runs under an exclusive file lock (a second
process waits for the first and reuses its result) in a temporary folder renamed into place when it has
succeeded, so a folder in the cache is always a finished build. Installing copies the built files (the
libraries, control and script files) into the server's `pkglibdir` and extension folder, which is where
PostgreSQL looks for them and where the `$libdir/citus` of Citus's own SQL points.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentdb.errors import DatabaseSetupError, InvalidParamValue

log = logging.getLogger(__name__)

SOURCE_ENV = "AGENTDB_CITUS_SOURCE"
CACHE_ENV = "AGENTDB_CITUS_CACHE"
BUILT_MARKER = "agentdb-built"
_TARBALL = re.compile(r"^citus-(\d+\.\d+\.\d+)\.tar\.gz$")
# What the build leaves out: the optional HTTP client (Citus's usage statistics) and column compression
# libraries whose headers these machines lack.
CONFIGURE_OPTIONS = ("--without-libcurl", "--without-lz4", "--without-zstd")


def pg_config() -> Path:
    """The embedded server's own pg_config."""
    from agentdb.db.server import _never_started

    return Path(_never_started().bin_path) / "pg_config"


def pg_config_value(pgc: Path, flag: str) -> str:
    return subprocess.run([str(pgc), flag], check=True, capture_output=True, text=True).stdout.strip()


def source_from_env(given: str | None = None) -> Path | None:
    """The tarball named on the command line, else by AGENTDB_CITUS_SOURCE, else None."""
    text = given or os.environ.get(SOURCE_ENV)
    return Path(text).expanduser().resolve() if text else None


def tarball_version(tarball: Path) -> str:
    """The Citus version of a release tarball named `citus-X.Y.Z.tar.gz` (whose files are under `citus-X.Y.Z/`)."""
    match = _TARBALL.match(tarball.name)
    if not tarball.is_file() or match is None:
        raise InvalidParamValue(
            f"not a Citus source tarball: {tarball} (expected an existing file named citus-X.Y.Z.tar.gz)",
            path="citus_source",
        )
    return match.group(1)


def cache_root(data_dir: Path) -> Path:
    text = os.environ.get(CACHE_ENV)
    return Path(text).expanduser().resolve() if text else data_dir.expanduser().resolve() / "citus"


def build_key(version: str, pgc: Path) -> str:
    """The cache folder's name: the Citus version and a digest of the server installation it is built for."""
    install = f"{pgc.resolve()}\0{pg_config_value(pgc, '--version')}"
    return f"citus-{version}-{hashlib.sha256(install.encode()).hexdigest()[:12]}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building Citus (%s)", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(args: list[str], cwd: Path, logfile: Path) -> None:
    with logfile.open("a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        done = subprocess.run(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = logfile.read_text(errors="replace").splitlines()[-5:]
        raise DatabaseSetupError(
            f"building Citus failed at `{args[0]} {args[1] if len(args) > 1 else ''}`: " + " | ".join(tail),
            hint=f"the whole log is {logfile}",
        )


def build(tarball: Path, root: Path, pgc: Path | None = None) -> Path:
    """The folder of a finished build of `tarball` for the embedded server (built now unless cached). Its
    `stage/` holds the installed files under their absolute paths (`make install DESTDIR=stage`)."""
    pgc = pgc or pg_config()
    version = tarball_version(tarball)
    key = build_key(version, pgc)
    final = root / key
    if (final / BUILT_MARKER).exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock"):
        if (final / BUILT_MARKER).exists():
            return final  # another process built it while this one waited
        work = root / f"{key}.partial"
        shutil.rmtree(work, ignore_errors=True)  # an interrupted build
        work.mkdir()
        logfile = work / "build.log"
        log.info("building Citus %s from %s in %s (about 5 minutes on 2 cores)", version, tarball, work)
        with tarfile.open(tarball) as archive:
            archive.extractall(work, filter="data")
        src = work / f"citus-{version}"
        if not (src / "configure").exists():
            raise DatabaseSetupError(f"{tarball} holds no citus-{version}/configure")
        pg = f"PG_CONFIG={pgc}"
        # The server was compiled with a clang-only warning flag that gcc rejects.
        cflags = pg_config_value(pgc, "--cflags").replace("-Wmissing-variable-declarations", "")
        jobs = str(max(1, min(os.cpu_count() or 1, 4)))
        _run(["./configure", pg, *CONFIGURE_OPTIONS], src, logfile)
        _run(["make", f"-j{jobs}", pg, f"CFLAGS={cflags}"], src, logfile)
        _run(["make", "install", pg, f"DESTDIR={work / 'stage'}"], src, logfile)
        shutil.rmtree(src)  # the objects and sources: the staged files are what is kept
        (work / BUILT_MARKER).write_text(f"{version}\n{pgc.resolve()}\n")
        shutil.rmtree(final, ignore_errors=True)
        work.rename(final)
    log.info("Citus %s built in %s", version, final)
    return final


def install(built: Path, pgc: Path | None = None) -> list[Path]:
    """Copy a build's library and extension files into the server's own folders (those missing or different);
    returns the files it wrote. Each is written beside its target and renamed over it, so a server that has
    the old library loaded keeps it and a new one loads a whole file."""
    pgc = pgc or pg_config()
    stage = built / "stage"
    written = []
    for flag, sub in (("--pkglibdir", ""), ("--sharedir", "extension")):
        target_dir = Path(pg_config_value(pgc, flag)) / sub
        staged_dir = stage / target_dir.relative_to(target_dir.anchor)
        for staged in sorted(p for p in staged_dir.rglob("*") if p.is_file()):
            target = target_dir / staged.relative_to(staged_dir)
            if target.exists() and target.read_bytes() == staged.read_bytes():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.agentdb-tmp")
            shutil.copy2(staged, tmp)
            tmp.chmod(0o755 if staged.suffix == ".so" else 0o644)
            tmp.replace(target)
            written.append(target)
    return written


def ensure_installed(tarball: Path, data_dir: Path) -> str:
    """Build Citus from `tarball` (once, cached) and install it into the embedded server; returns its version."""
    built = build(tarball, cache_root(data_dir))
    written = install(built)
    if written:
        log.info("installed %d Citus files into the embedded server", len(written))
    return tarball_version(tarball)
