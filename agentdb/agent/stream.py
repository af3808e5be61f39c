"""The streaming bridge: blocking work that reports progress as it comes (a model call's text deltas, a
walk's node reads) runs in a worker thread, and its reports come out of a generator as they arrive, so the
event stream can forward them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator
from typing import Any, TypeVar

R = TypeVar("R")
E = TypeVar("E")
D = TypeVar("D")


def stream_call(
    work: Callable[[threading.Event, Callable[[D], None]], R], event: Callable[[D], E]
) -> Generator[E, None, R]:
    """Run `work(cancel, report)` in a worker thread, yield `event(item)` for every item it reports, and
    return its result (or raise its error) once it is done. Closing the generator early (the client went
    away) sets `cancel`, which the work checks to stop."""
    deltas: queue.Queue[D | None] = queue.Queue()
    outcome: dict[str, Any] = {}
    cancel = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = work(cancel, deltas.put)
        except BaseException as exc:  # handed to the consuming thread below
            outcome["error"] = exc
        finally:
            deltas.put(None)

    worker = threading.Thread(target=run, name="agentdb-stream", daemon=True)
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
