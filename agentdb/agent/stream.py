"""The streaming bridge: a blocking model call that reports text as it comes (`on_text`) runs in a worker
thread, and its deltas come out of a generator as they arrive, so the event stream can forward them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import Any, TypeVar

R = TypeVar("R")
E = TypeVar("E")


def stream_call(
    work: Callable[[threading.Event, Callable[[str], None]], R], event: Callable[[str], E]
) -> Generator[E, None, R]:
    """Run `work(cancel, on_text)` in a worker thread, yield `event(delta)` for every text delta it reports,
    and return its result (or raise its error) once it is done. Closing the generator early (the client went
    away) sets `cancel`, which stops the model call."""
    deltas: queue.Queue[str | None] = queue.Queue()
    outcome: dict[str, Any] = {}
    cancel = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = work(cancel, deltas.put)
        except BaseException as exc:  # handed to the consuming thread below
            outcome["error"] = exc
        finally:
            deltas.put(None)

    worker = threading.Thread(target=run, name="agentdb-generation", daemon=True)
    worker.start()
    try:
        while (delta := deltas.get()) is not None:
            yield event(delta)
    except GeneratorExit:
        cancel.set()
        raise
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    result: R = outcome["result"]
    return result


__all__ = ["stream_call"]
