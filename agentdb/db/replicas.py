"""Read replicas: a pool per replica, a monitor that keeps each one's role and replay lag, and the choice of a
server for a read.

Reads go to the replicas in rotation, spread round-robin; a read that names a WAL position (`min_lsn`, from an
earlier write's response) goes to a replica known to have replayed that far, else waits a bounded time on the
most advanced one, else goes to the primary. A replica leaves the rotation when it cannot be reached, when it is
no longer a standby (promoted: it no longer follows our primary), or when its replay lags more than
`max_lag_ms`; the monitor puts it back when that ends.

Replay lag is measured against the primary's flushed WAL position sampled at every check (WAL only leaves the
primary once flushed): a replica that has replayed less than the primary had flushed at time t lags by at
least now - t. That stays 0 on an idle primary (unlike
now() - pg_last_xact_replay_timestamp(), which grows while nothing is written).
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from agentdb.db.pool import open_pool
from agentdb.errors import InvalidParamValue

log = logging.getLogger(__name__)

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
# How long the monitor keeps the primary's positions: a replica behind the oldest one lags at least that long.
HISTORY_S = 60.0
CONNECT_TIMEOUT_S = 2


def parse_lsn(text: str, path: str) -> int:
    """A WAL position as PostgreSQL prints it (`16/B374D848`), as a number; 3007 at `path` otherwise."""
    match = _LSN.match(text.strip())
    if match is None:
        raise InvalidParamValue(f"not a WAL position (LSN) such as 0/3018DC8: {text[:40]!r}", path=path)
    return int(match.group(1), 16) << 32 | int(match.group(2), 16)


def format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def redact(url: str) -> str:
    """A connection string without its password, for status pages and logs."""
    params = {k: v for k, v in conninfo_to_dict(url).items() if k != "password"}
    return make_conninfo("", **params)


@dataclass(frozen=True)
class ReplicaStatus:
    """What /healthz and `agentdb status` say about a replica."""

    name: str
    url: str
    role: str  # standby, primary (promoted: not following ours), unreachable
    replay_lsn: str | None
    lag_ms: float | None
    in_rotation: bool
    error: str | None = None


class Replica:
    """One replica: its pool for reads, and what the monitor last saw of it."""

    def __init__(self, name: str, url: str, pool: ConnectionPool | None) -> None:
        self.name = name
        self.url = url
        self.pool = pool
        # Unreachable since the last check that reached it: its pool's connections are gone and the pool is
        # backing off between reconnection attempts (seconds), so a fresh pool serves it when it is back.
        self.lost = False
        self.role = "unreachable"
        self.replay_lsn: int | None = None
        self.lag_ms: float | None = None
        self.in_rotation = False
        self.error: str | None = None
        self._monitor: psycopg.Connection[Any] | None = None

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(
            name=self.name,
            url=redact(self.url),
            role=self.role,
            replay_lsn=None if self.replay_lsn is None else format_lsn(self.replay_lsn),
            lag_ms=None if self.lag_ms is None else round(self.lag_ms, 1),
            in_rotation=self.in_rotation,
            error=self.error,
        )

    def saw(self, replay_lsn: int) -> None:
        """A replay position observed on this replica (they only grow)."""
        if self.replay_lsn is None or replay_lsn > self.replay_lsn:
            self.replay_lsn = replay_lsn

    def observe(self) -> tuple[bool, int | None]:
        """(in recovery, replay position) read on the monitor's own connection, reconnecting when needed."""
        if self._monitor is None or self._monitor.closed:
            self._monitor = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        try:
            row = self._monitor.execute(
                "select pg_is_in_recovery(), pg_last_wal_replay_lsn()::text"
            ).fetchone()
        except psycopg.Error:
            self.close_monitor()
            raise
        assert row is not None
        return bool(row[0]), None if row[1] is None else parse_lsn(row[1], "replay_lsn")

    def close_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None


class ReadRouter:
    """The replicas of one primary and the choice among them. `check` refreshes every replica's state (the
    monitor thread calls it every `check_interval_s`); `candidates` orders the replicas for one read."""

    def __init__(
        self,
        primary_url: str,
        replica_urls: Sequence[str],
        *,
        max_lag_ms: float = 1000.0,
        wait_ms: float = 500.0,
        check_interval_s: float = 0.25,
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        pools: bool = True,
    ) -> None:
        self.primary_url = primary_url
        self.max_lag_ms = max_lag_ms
        self.wait_ms = wait_ms
        self.check_interval_s = check_interval_s
        self._pool_sizes = (pool_min_size, pool_max_size) if pools else None
        self.replicas = [
            Replica(f"replica{i}", url, self._open_pool(url)) for i, url in enumerate(replica_urls, start=1)
        ]
        self._positions: deque[tuple[float, int]] = deque()
        self._primary: psycopg.Connection[Any] | None = None
        self._primary_url = primary_url  # where `_primary` is connected
        # Whether the last check reached the primary: while it does not, a read on a replica is authenticated
        # there instead of waiting on the primary at every request (agentdb.api.routing).
        self.primary_reachable = True
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open_pool(self, url: str) -> ConnectionPool | None:
        if self._pool_sizes is None:
            return None
        return open_pool(url, min_size=self._pool_sizes[0], max_size=self._pool_sizes[1], wait=False)

    def _renew_pool(self, replica: Replica) -> None:
        """A fresh pool for a replica that is back; the old one is closed in the background (connections
        still out close when they are returned)."""
        old, replica.pool = replica.pool, self._open_pool(replica.url)
        if old is not None:
            threading.Thread(target=old.close, name="agentdb-replica-pool-close", daemon=True).start()

    # -- the monitor -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Check once (so that the rotation is known before the first request), then keep checking."""
        self.check()
        self._thread = threading.Thread(target=self._run, name="agentdb-replica-monitor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for replica in self.replicas:
            replica.close_monitor()
            if replica.pool is not None:
                replica.pool.close()
        if self._primary is not None:
            self._primary.close()

    def _run(self) -> None:
        while not self._stop.wait(self.check_interval_s):
            try:
                self.check()
            except Exception:  # the monitor must outlive any one bad check
                log.exception("replica check failed")

    def repoint(self, primary_url: str) -> None:
        """Measure lag against another primary from now on (a failover); the monitor reconnects at its next
        check, and the old primary's positions are forgotten."""
        with self._lock:
            self.primary_url = primary_url
            self._positions.clear()

    def _primary_position(self) -> int | None:
        try:
            if self._primary is not None and self._primary_url != self.primary_url:
                self._primary.close()  # the primary moved (repoint)
                self._primary = None
            if self._primary is None or self._primary.closed:
                self._primary_url = self.primary_url
                self._primary = psycopg.connect(
                    self._primary_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                )
            row = self._primary.execute("select pg_current_wal_flush_lsn()::text").fetchone()
        except psycopg.Error as exc:
            log.warning("cannot read the primary's WAL position: %s", str(exc).strip().splitlines()[0])
            if self._primary is not None:
                self._primary.close()
                self._primary = None
            return None
        assert row is not None
        return parse_lsn(row[0], "primary_lsn")

    def lag_ms(self, replay_lsn: int, now: float) -> float:
        """How long ago the primary had written WAL this replica has not replayed yet (0 when it has replayed
        everything the primary had written at the last check)."""
        with self._lock:
            for sampled_at, position in self._positions:
                if position > replay_lsn:
                    return (now - sampled_at) * 1000.0
        return 0.0

    def check(self) -> None:
        """Sample the primary's position, then read every replica's role and replay position and decide its
        rotation."""
        now = time.monotonic()
        position = self._primary_position()
        self.primary_reachable = position is not None
        if position is not None:
            with self._lock:
                self._positions.append((now, position))
                while self._positions and self._positions[0][0] < now - HISTORY_S:
                    self._positions.popleft()
        for replica in self.replicas:
            try:
                in_recovery, replay = replica.observe()
            except psycopg.Error as exc:
                if replica.in_rotation:
                    log.warning("%s left the rotation: %s", replica.name, _first_line(exc))
                replica.role, replica.in_rotation, replica.error = "unreachable", False, _first_line(exc)
                replica.lost = True
                continue
            if replica.lost:
                self._renew_pool(replica)
                replica.lost = False
            replica.error = None
            if not in_recovery or replay is None:
                if replica.in_rotation:
                    log.warning("%s left the rotation: it is no longer a standby", replica.name)
                replica.role, replica.lag_ms, replica.in_rotation = "primary", None, False
                replica.error = (
                    "it is the primary now (DATABASE_URL names it): not used as a replica"
                    if same_server(replica.url, self.primary_url)
                    else "not a standby (promoted?): it no longer follows the primary"
                )
                continue
            replica.role = "standby"
            replica.saw(replay)
            replica.lag_ms = self.lag_ms(replay, time.monotonic())
            healthy = replica.lag_ms <= self.max_lag_ms
            if healthy != replica.in_rotation:
                log.log(
                    logging.INFO if healthy else logging.WARNING,
                    "%s %s the rotation (replay lag %.0f ms, limit %.0f ms)",
                    replica.name,
                    "joined" if healthy else "left",
                    replica.lag_ms,
                    self.max_lag_ms,
                )
            replica.in_rotation = healthy

    # -- the choice ------------------------------------------------------------------------------------------

    def candidates(self, min_lsn: int | None = None, exclude: frozenset[str] = frozenset()) -> list[Replica]:
        """The replicas in rotation for one read, in the order to try them: spread round-robin, and with a
        `min_lsn` those known to have replayed it first, then the others most advanced first (the first of
        those is worth waiting on)."""
        ready = [r for r in self.replicas if r.in_rotation and r.name not in exclude]
        if not ready:
            return []
        start = next(self._turn) % len(ready)
        ready = ready[start:] + ready[:start]
        if min_lsn is None:
            return ready
        caught_up = [r for r in ready if r.replay_lsn is not None and r.replay_lsn >= min_lsn]
        behind = sorted((r for r in ready if r not in caught_up), key=lambda r: -(r.replay_lsn or 0))
        return caught_up + behind

    def leave_rotation(self, replica: Replica, error: BaseException) -> None:
        """A read failed on `replica`: keep reads away from it until the monitor sees it healthy again."""
        if replica.in_rotation:
            log.warning("%s left the rotation: %s", replica.name, _first_line(error))
        replica.in_rotation, replica.error, replica.lost = False, _first_line(error), True

    def wait_for(
        self, replica: Replica, conn: psycopg.Connection[Any], min_lsn: int, deadline: float
    ) -> bool:
        """Wait on `conn` (a connection to `replica`) until it has replayed `min_lsn` or `deadline` passes;
        whether it got there."""
        target = format_lsn(min_lsn)
        while True:
            row = conn.execute("select pg_last_wal_replay_lsn()::text").fetchone()
            if row is not None and row[0] is not None:
                replayed = parse_lsn(row[0], "replay_lsn")
                replica.saw(replayed)
                if replayed >= min_lsn:
                    return True
            if time.monotonic() >= deadline:
                log.info("%s has not replayed %s in time; reading from the primary", replica.name, target)
                return False
            time.sleep(0.001)

    def status(self) -> list[ReplicaStatus]:
        return [replica.status() for replica in self.replicas]


def same_server(a: str, b: str) -> bool:
    """Whether two connection strings name the same server and database (spelling aside)."""
    keys = ("host", "hostaddr", "port", "dbname")
    try:
        da, db = conninfo_to_dict(a), conninfo_to_dict(b)
    except psycopg.ProgrammingError:
        return a == b
    return all(da.get(k) == db.get(k) for k in keys)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
