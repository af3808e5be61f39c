"""The model interface: messages in; text, tool calls and token usage out. Providers implement `Model`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

DEFAULT_MAX_TOKENS = 1024

Role = Literal["user", "assistant"]
TextCallback = Callable[[str], None]


@dataclass(frozen=True)
class Usage:
    """Token use summed over model calls; `llm_calls` counts the calls that returned an answer."""

    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.llm_calls + other.llm_calls,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "llm_calls": self.llm_calls,
        }


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: its name, what it is for, and the JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def to_api(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}


@dataclass(frozen=True)
class ToolCall:
    """One `tool_use` block of a model's answer."""

    id: str
    name: str
    input: Any  # an object when the model followed the schema; kept as sent so callers can reject it


@dataclass(frozen=True)
class Message:
    """One conversation turn. `content` is text, or a list of Messages API content blocks (text, tool_use,
    tool_result) for multi-turn tool use."""

    role: Role
    content: str | list[dict[str, Any]]

    @classmethod
    def user(cls, *texts: str) -> Message:
        """A user turn; several texts become several text blocks of the one turn."""
        if len(texts) == 1:
            return cls("user", texts[0])
        return cls("user", [{"type": "text", "text": t} for t in texts])

    @classmethod
    def assistant(cls, completion: Completion) -> Message:
        """The assistant turn that produced `completion`, to continue the conversation after it."""
        return cls("assistant", list(completion.content))

    @classmethod
    def tool_result(
        cls, tool_use_id: str, content: str, *, is_error: bool = False, extra_text: str | None = None
    ) -> Message:
        """The user turn that answers a tool call (an error result tells the model to try again)."""
        blocks: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": is_error}
        ]
        if extra_text:
            blocks.append({"type": "text", "text": extra_text})
        return cls("user", blocks)

    def to_api(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Completion:
    """A model's answer: its text (all text blocks joined), its tool calls, why it stopped, what it cost,
    which model answered, and the raw content blocks (to echo the turn back in a conversation)."""

    text: str
    tool_calls: list[ToolCall]
    stop_reason: str | None
    usage: Usage
    model: str
    content: list[dict[str, Any]] = field(default_factory=list)

    def tool_call(self, name: str) -> ToolCall | None:
        """The first call of tool `name`, if any."""
        return next((c for c in self.tool_calls if c.name == name), None)


class Model(Protocol):
    """What agentdb needs from a language model. `tool_choice`: None or "auto" (the model decides), "any"
    (some tool), "none" (no tool), or a tool's name (that tool is forced). `timeout` is in seconds per
    attempt. `cancel`, when set, stops the call between attempts. `on_text` streams the text deltas as they
    arrive (the returned Completion still carries the whole answer)."""

    name: str

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
    ) -> Completion: ...


class UsageMeter:
    """A Model that delegates to another and sums the usage of every call made through it: wrap the
    request's model once and hand the meter to every step, then read `usage` for the response."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.name = model.name
        self._usage = Usage()
        self._lock = threading.Lock()

    @property
    def usage(self) -> Usage:
        with self._lock:
            return self._usage

    def complete(self, messages: Sequence[Message], **options: Any) -> Completion:
        """The wrapped model's completion (`options` as Model.complete takes them), its usage counted."""
        completion = self.model.complete(messages, **options)
        with self._lock:
            self._usage = self._usage + completion.usage
        return completion
