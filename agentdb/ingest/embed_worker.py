"""The server's embedding worker: rows of registered tables written by other programs (or whose text
changed) have no vector; the worker finds them through each table's pending index and embeds them in the
background, so they become findable by the dense leg without anyone running a command."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from psycopg_pool import ConnectionPool

from agentdb.embed import Embedder
from agentdb.ingest.embed_missing import embed_missing
from agentdb.sources import list_sources, pending_embeddings

log = logging.getLogger(__name__)


class EmbeddingWorker:
    """A daemon thread that looks for pending rows every `interval` seconds and embeds them in batches.
    The model is loaded the first time there is work."""

    def __init__(
        self, pool: ConnectionPool, embedder_for: Callable[[str], Embedder], *, interval: float = 2.0
    ) -> None:
        self.pool = pool
        self.embedder_for = embedder_for
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentdb-embedder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def run_once(self) -> int:
        """Embed every pending row of every registered table; returns how many were filled."""
        filled = 0
        with self.pool.connection() as conn:
            for source in list_sources(conn):
                if source.kind != "table" or self._stop.is_set():
                    continue
                if pending_embeddings(conn, source):
                    filled += embed_missing(
                        conn, source, self.embedder_for(source.embedding_model), batch_size=32, progress=False
                    )
        return filled

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                filled = self.run_once()
            except Exception as exc:  # the worker must outlive a bad moment (database restart, a bad row)
                log.warning("background embedding failed, retrying in %.0f s: %s", self.interval, exc)
                continue
            if filled:
                log.info("embedded %d pending rows of registered tables", filled)


__all__ = ["EmbeddingWorker"]
