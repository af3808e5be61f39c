"""Following a failover without a restart: the primary's URL is read from a file (`DATABASE_URL_FILE`) that an
operator or an orchestrator rewrites, and a thread watches it.

When the file names another server, the watcher connects to it and asks whether it accepts writes
(`pg_is_in_recovery()` false); only then does the app move to it (`switch`: migrations checked, a new pool, the
read router repointed, the old pool closed). Until then the old primary keeps serving, and /healthz shows the
URL waiting and why (unreachable, still a standby), so repointing before the promotion has finished is safe.
The file is re-read every `interval_s` (it is tiny), which also follows a file replaced by a rename or a
Kubernetes volume's symlink swap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from agentdb.config import read_url_file
from agentdb.db.replicas import redact
from agentdb.errors import AgentDBError, DatabaseSetupError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2


@dataclass(frozen=True)
class PrimaryStatus:
    """What /healthz says about the primary: where it is, where it is read from, and a move not done yet."""

    url: str
    file: str | None
    switches: int
    pending: str | None
    error: str | None


class PrimaryWatcher:
    """Watches `path` and calls `switch(url)` once it names another server that accepts writes."""

    def __init__(
        self, path: Path, url: str, switch: Callable[[str], None], *, interval_s: float = 0.25
    ) -> None:
        self.path = path
        self.url = url
        self.switch = switch
        self.interval_s = interval_s
        self.switches = 0
        self.pending: str | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="agentdb-primary-watcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def status(self) -> PrimaryStatus:
        return PrimaryStatus(
            url=redact(self.url),
            file=str(self.path),
            switches=self.switches,
            pending=None if self.pending is None else redact(self.pending),
            error=self.error,
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # the watcher must outlive any one bad check
                log.exception("checking %s failed", self.path)

    def _wait(self, url: str | None, error: str | None) -> None:
        """Keep the current primary; say why once (not at every check)."""
        if (url, error) != (self.pending, self.error) and error is not None:
            log.warning("%s: not moving to the server it names yet: %s", self.path, error)
        self.pending, self.error = url, error

    def check(self) -> bool:
        """Read the file; move to the server it names when that is another one and accepts writes. Whether it
        moved."""
        try:
            wanted = read_url_file(self.path)
        except DatabaseSetupError as exc:
            self._wait(None, exc.message)
            return False
        if wanted == self.url:
            self._wait(None, None)
            return False
        try:
            with psycopg.connect(wanted, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                row = conn.execute("select pg_is_in_recovery()").fetchone()
        except psycopg.Error as exc:
            self._wait(wanted, f"cannot connect to it: {_first_line(exc)}")
            return False
        if row is None or row[0]:
            self._wait(wanted, "it is a standby (in recovery): promote it first")
            return False
        try:
            self.switch(wanted)
        except AgentDBError as exc:  # e.g. not this agentdb's schema: say so, keep the old primary
            self._wait(wanted, f"moving to it failed: {exc.message}")
            return False
        except Exception as exc:  # a failed move leaves the old primary in place; the next check tries again
            log.exception("moving to the new primary failed")
            self._wait(wanted, f"moving to it failed: {_first_line(exc)}")
            return False
        log.warning("the primary is now the server %s names (move %d)", self.path, self.switches + 1)
        self.url, self.switches = wanted, self.switches + 1
        self._wait(None, None)
        return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
