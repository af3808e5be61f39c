"""The Anthropic provider: the Messages API (with tool use and streaming) through the official SDK.

Retries are ours, not the SDK's (`max_retries=0` on the client), so they are deterministic and testable:
an overloaded (529), rate-limited (429) or failing (5xx) answer, or a failed connection, is retried up to
`max_retries` times after `backoff_base * 2**n` seconds (capped at `backoff_max`; a `retry-after` header
wins, under the same cap), with no jitter. A timeout is not retried: the caller's time budget is spent.
Cancellation (a threading.Event) is checked before every attempt and interrupts the backoff waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import anthropic
import httpx2

from agentdb.errors import InferenceFailed, InferenceTimeout, InvalidParamValue
from agentdb.llm.types import DEFAULT_MAX_TOKENS, Completion, Message, TextCallback, ToolCall, ToolSpec, Usage

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
STREAM_RETRYABLE_ERRORS = frozenset({"overloaded_error", "rate_limit_error", "api_error"})
TOOL_CHOICE_MODES = ("auto", "any", "none")


def retry_delay(retry: int, *, base: float, cap: float, retry_after: float | None = None) -> float:
    """Seconds to wait before retry number `retry` (0-based): exponential without jitter, or the server's
    `retry-after`, never more than `cap`."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), cap)
    return min(base * 2**retry, cap)


def _retry_after(response: httpx2.Response | None) -> float | None:
    if response is None:
        return None
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = response.headers.get(header)
        if value is not None:
            try:
                return float(value) * scale
            except ValueError:
                continue  # an HTTP date: fall back to our own backoff
    return None


def _retryable(exc: anthropic.APIStatusError) -> bool:
    """Overload, rate limit or a server error: as an HTTP status, or as the `error` event of a stream
    (which arrives with the stream's 200)."""
    if exc.status_code == 200:
        return exc.type in STREAM_RETRYABLE_ERRORS
    return exc.status_code in RETRYABLE_STATUS


def tool_choice_param(choice: str) -> dict[str, Any]:
    """The Messages API `tool_choice` for a mode ("auto", "any", "none") or a tool name (forced)."""
    if choice in TOOL_CHOICE_MODES:
        return {"type": choice}
    return {"type": "tool", "name": choice}


def _block_param(block: Any) -> dict[str, Any]:
    """A response content block as a request content block (to echo an assistant turn)."""
    if block.type == "text":
        return {"type": "text", "text": block.text}
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    dumped: dict[str, Any] = block.model_dump(exclude_none=True)
    return dumped


def to_completion(message: Any) -> Completion:
    """The SDK's Message as a Completion. Input tokens include prompt-cache reads and writes."""
    text = "".join(block.text for block in message.content if block.type == "text")
    calls = [
        ToolCall(block.id, block.name, block.input) for block in message.content if block.type == "tool_use"
    ]
    u = message.usage
    input_tokens = u.input_tokens + (u.cache_creation_input_tokens or 0) + (u.cache_read_input_tokens or 0)
    return Completion(
        text=text,
        tool_calls=calls,
        stop_reason=message.stop_reason,
        usage=Usage(input_tokens, u.output_tokens, 1),
        model=message.model,
        content=[_block_param(block) for block in message.content],
    )


class AnthropicModel:
    """A `Model` backed by Anthropic's Messages API. `http_client` (an httpx2 client, as the SDK uses)
    lets tests and proxies supply the transport; `base_url` overrides the API address."""

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None = None,
        http_client: httpx2.Client | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = model
        self.base_url = base_url or DEFAULT_BASE_URL
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._sleep = sleep
        self._client = anthropic.Anthropic(
            api_key=api_key, base_url=self.base_url, max_retries=0, timeout=timeout, http_client=http_client
        )

    def complete(
        self,
        messages: Sequence[Message],
        *,
        system: str | None = None,
        tools: Sequence[ToolSpec] | None = None,
        tool_choice: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
        on_text: TextCallback | None = None,
    ) -> Completion:
        params: dict[str, Any] = {
            "model": self.name,
            "max_tokens": max_tokens,
            "messages": [m.to_api() for m in messages],
        }
        if system:
            params["system"] = system
        if tools:
            params["tools"] = [t.to_api() for t in tools]
        if tool_choice:
            params["tool_choice"] = tool_choice_param(tool_choice)
        limit = timeout if timeout is not None else self.timeout
        emitted = [False]  # once text reached the caller, a retry would repeat it
        for attempt in range(self.max_retries + 1):
            if cancel is not None and cancel.is_set():
                raise InferenceFailed(f"the call to {self.name} was cancelled")
            try:
                if on_text is None:
                    message = self._client.messages.create(**params, timeout=limit)
                else:
                    message = self._stream(params, limit, on_text, emitted)
                return to_completion(message)
            except (anthropic.APITimeoutError, httpx2.TimeoutException):
                raise InferenceTimeout(
                    f"the model {self.name} did not answer within {limit:g} s",
                    hint="retry later, or ask for less (max_tokens) or with a smaller context",
                ) from None
            except anthropic.APIStatusError as exc:
                if _retryable(exc) and attempt < self.max_retries and not emitted[0]:
                    self._wait(attempt, _retry_after(exc.response), f"status {exc.status_code}", cancel)
                    continue
                raise self._status_error(exc, attempt + 1) from None
            except anthropic.APIConnectionError:
                if attempt < self.max_retries and not emitted[0]:
                    self._wait(attempt, None, "connection error", cancel)
                    continue
                raise InferenceFailed(
                    f"could not reach the Anthropic API at {self.base_url} after {attempt + 1} attempt(s)",
                    hint="check the network, or ANTHROPIC_BASE_URL if a proxy is used",
                ) from None
            except anthropic.AnthropicError as exc:
                raise InferenceFailed(f"the Anthropic SDK failed: {type(exc).__name__}: {exc}") from None
            except httpx2.HTTPError as exc:  # a stream broken after its start
                raise InferenceFailed(
                    f"the answer of {self.name} was interrupted: {type(exc).__name__}"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _stream(
        self, params: dict[str, Any], limit: float, on_text: TextCallback, emitted: list[bool]
    ) -> Any:
        """One streamed attempt: text deltas go to `on_text`; the whole answer must arrive within `limit`."""
        deadline = time.monotonic() + limit
        with self._client.messages.stream(**params, timeout=limit) as stream:
            for delta in stream.text_stream:
                if time.monotonic() > deadline:
                    raise httpx2.ReadTimeout("the streamed answer ran past its time limit")
                if delta:
                    emitted[0] = True
                    on_text(delta)
            return stream.get_final_message()

    def _wait(
        self, attempt: int, retry_after: float | None, why: str, cancel: threading.Event | None
    ) -> None:
        delay = retry_delay(attempt, base=self.backoff_base, cap=self.backoff_max, retry_after=retry_after)
        log.info(
            "retrying %s in %.2f s after %s (attempt %d of %d)",
            self.name,
            delay,
            why,
            attempt + 1,
            self.max_retries + 1,
        )
        if cancel is not None:
            if cancel.wait(delay):
                raise InferenceFailed(f"the call to {self.name} was cancelled")
        elif delay > 0:
            self._sleep(delay)

    def _status_error(
        self, exc: anthropic.APIStatusError, attempts: int
    ) -> InferenceFailed | InvalidParamValue:
        status = exc.status_code
        kind = exc.type or "error"
        detail = exc.api_message or (exc.message if isinstance(exc.message, str) else "")
        if status == 200:
            what = f"the answer stream of {self.name} broke off with {kind}: {detail}".rstrip(": ")
            return InferenceFailed(what, hint="retry later" if _retryable(exc) else None)
        what = f"the Anthropic API answered {status} {kind}: {detail}".rstrip(": ")
        if status == 404 and kind == "not_found_error":
            return InvalidParamValue(
                f"{what} (is the model name {self.name!r} right?)", path="generator.model"
            )
        if status in (401, 403):
            return InferenceFailed(
                what, hint="check ANTHROPIC_API_KEY (the server's environment) and its permissions"
            )
        if status in RETRYABLE_STATUS:
            return InferenceFailed(
                f"{what} (after {attempts} attempt(s))", hint="the service is busy: retry later"
            )
        return InferenceFailed(what)
