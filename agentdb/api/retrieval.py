"""POST /agents/retrieval: the retrieval agent, as JSON or as server-sent events."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from psycopg_pool import ConnectionPool
from starlette.concurrency import run_in_threadpool

from agentdb import agent
from agentdb.api.access import request_scope
from agentdb.api.routing import DatabaseRoute, read_pool, require_primary
from agentdb.auth import Principal
from agentdb.config import Settings
from agentdb.errors import AgentDBError, InternalError

log = logging.getLogger(__name__)
router = APIRouter(tags=["retrieval"], route_class=DatabaseRoute)


def sse(kind: str, payload: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _stream(
    pool: ConnectionPool,
    request: agent.RetrievalRequest,
    caller: Principal | None,
    settings: Settings,
    plan: agent.Plan,
) -> Iterator[bytes]:
    """Events as SSE on a connection of the stream's own (the request's is released when the handler
    returns); an error becomes an `error` event, and `done` always comes last."""
    try:
        with pool.connection() as conn:
            for kind, payload in agent.json_events(agent.run(conn, request, caller, settings, plan=plan)):
                yield sse(kind, payload)
    except AgentDBError as exc:
        yield sse("error", {"error": exc.to_dict()})
        yield sse("done", {"status": "failed", "route": "not_found"})
    except Exception:  # the envelope never carries a traceback; the log does
        log.exception("retrieval stream failed")
        yield sse("error", {"error": InternalError().to_dict()})
        yield sse("done", {"status": "failed", "route": "not_found"})


@router.post(
    "/agents/retrieval",
    response_model=agent.RetrievalResponse,
    response_model_exclude_none=False,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "JSON, or SSE when stream is true"}
    },
)
async def retrieval(
    request: agent.RetrievalRequest,
    http: Request,
    scoped: tuple[psycopg.Connection[Any], Principal | None] = Depends(request_scope, scope="function"),  # noqa: B008
) -> Any:
    """Run the queries (pipeline mode; optional deepening, neighbour expansion and generation), merge their
    hits by RRF, and answer as JSON or as an event stream."""
    conn, caller = scoped
    # Validation and the run in one call to the thread pool: each hop between the event loop and the pool's
    # threads costs a context switch, so the blocking work is done in one.
    return await run_in_threadpool(_answer, conn, request, caller, http)


def _answer(
    conn: psycopg.Connection[Any], request: agent.RetrievalRequest, caller: Principal | None, http: Request
) -> Any:
    if request.memory is not None:
        require_primary(http)  # recall updates the memories' last-access times
    settings = http.app.state.settings
    plan = agent.validate(conn, request, caller, settings)  # input, permission and model errors: a plain 4xx
    if not request.stream:
        return agent.respond(agent.run(conn, request, caller, settings, plan=plan))
    return StreamingResponse(
        _stream(read_pool(http), request, caller, settings, plan), media_type="text/event-stream"
    )
