"""Language models for agentdb: one small interface (`Model.complete`) and two providers that share one
code path, `anthropic` (the Messages API through the official SDK) and `scripted` (the same client over a
transport that replays scripted responses, for tests and offline demos)."""

from agentdb.llm.anthropic_provider import AnthropicModel, retry_delay
from agentdb.llm.resolve import DEFAULT_ANTHROPIC_MODEL, PROVIDERS, GeneratorSpec, resolve_model
from agentdb.llm.scripted import (
    ScriptedError,
    ScriptedModel,
    ScriptedTimeout,
    demo_responder,
    overloaded,
    text_message,
    tool_use_message,
)
from agentdb.llm.types import (
    DEFAULT_MAX_TOKENS,
    Completion,
    Message,
    Model,
    TextCallback,
    ToolCall,
    ToolSpec,
    Usage,
    UsageMeter,
)

__all__ = [
    "DEFAULT_ANTHROPIC_MODEL",
    "DEFAULT_MAX_TOKENS",
    "PROVIDERS",
    "AnthropicModel",
    "Completion",
    "GeneratorSpec",
    "Message",
    "Model",
    "ScriptedError",
    "ScriptedModel",
    "ScriptedTimeout",
    "TextCallback",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "UsageMeter",
    "demo_responder",
    "overloaded",
    "resolve_model",
    "retry_delay",
    "text_message",
    "tool_use_message",
]
