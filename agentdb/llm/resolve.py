"""Choose the model of a request from its `generator {provider, model}` and the settings, and refuse a bad
choice (unknown provider, malformed model name, no API key) with a clear 400 before any retrieval runs."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import httpx2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentdb.config import Settings
from agentdb.errors import InvalidParamValue
from agentdb.llm.anthropic_provider import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, AnthropicModel
from agentdb.llm.scripted import ScriptedModel, demo_responder
from agentdb.llm.types import Model

PROVIDERS = ("anthropic", "scripted")
DEFAULT_PROVIDER = "anthropic"
DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"
_CACHE_SIZE = 16
_cache: dict[tuple[Any, ...], AnthropicModel] = {}
_cache_lock = threading.Lock()
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}$")


class GeneratorSpec(BaseModel):
    """`generator {provider, model}` of a request or a step. `responses` scripts the `scripted` provider
    (Messages API bodies or plain strings); without it the scripted provider runs its offline demo."""

    model_config = ConfigDict(extra="forbid")

    provider: str = DEFAULT_PROVIDER
    model: str | None = None
    responses: list[Any] | None = Field(default=None, max_length=100)
    timeout: float | None = Field(default=None, gt=0, le=600)
    max_retries: int | None = Field(default=None, ge=0, le=10)


def _spec(generator: GeneratorSpec | Mapping[str, Any] | BaseModel | None, path: str) -> GeneratorSpec:
    if generator is None:
        return GeneratorSpec()
    if isinstance(generator, GeneratorSpec):
        return generator
    data = generator.model_dump(exclude_none=True) if isinstance(generator, BaseModel) else dict(generator)
    try:
        return GeneratorSpec.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise InvalidParamValue(f"{path}.{where}: {error['msg']}", path=f"{path}.{where}") from None


def resolve_model(
    generator: GeneratorSpec | Mapping[str, Any] | BaseModel | None,
    settings: Settings,
    *,
    path: str = "generator",
    http_client: httpx2.Client | None = None,
) -> Model:
    """The Model for `generator` (None = the configured default). Raises InvalidParamValue (3007) with the
    path `<path>.provider` or `<path>.model`; never touches the network. `http_client` replaces the
    Anthropic provider's transport (tests, proxies)."""
    spec = _spec(generator, path)
    provider = spec.provider.strip().lower()
    if provider not in PROVIDERS:
        raise InvalidParamValue(
            f"unknown generator provider {spec.provider!r}; known providers: {', '.join(PROVIDERS)}",
            path=f"{path}.provider",
        )
    if spec.model is not None and not _MODEL_NAME.match(spec.model):
        raise InvalidParamValue(
            f"invalid model name {spec.model!r}: letters, digits and . _ : @ / + -, at most 200 characters",
            path=f"{path}.model",
        )
    timeout = spec.timeout or DEFAULT_TIMEOUT
    retries = DEFAULT_MAX_RETRIES if spec.max_retries is None else spec.max_retries
    if provider == "scripted":
        return ScriptedModel(
            spec.responses or (),
            model=spec.model or "scripted",
            default=demo_responder,
            timeout=timeout,
            max_retries=retries,
        )
    if spec.responses is not None:
        raise InvalidParamValue("responses script the 'scripted' provider only", path=f"{path}.responses")
    if not settings.anthropic_api_key:
        raise InvalidParamValue(
            "the anthropic provider needs an API key and none is configured: set ANTHROPIC_API_KEY in the "
            "environment of the agentdb server (e.g. `export ANTHROPIC_API_KEY=sk-ant-...` before "
            "`make run`) or pass Settings(anthropic_api_key=...); requests without generation or deepening "
            "need no key, and provider 'scripted' answers offline",
            path=f"{path}.provider",
        )
    model_name = spec.model or DEFAULT_ANTHROPIC_MODEL
    if http_client is not None:
        return AnthropicModel(
            model_name,
            api_key=settings.anthropic_api_key,
            base_url=settings.anthropic_base_url,
            http_client=http_client,
            timeout=timeout,
            max_retries=retries,
        )
    # One client per configuration, so that requests share its connection pool (the model keeps no state
    # between calls).
    key = (model_name, settings.anthropic_api_key, settings.anthropic_base_url, timeout, retries)
    with _cache_lock:
        model = _cache.get(key)
        if model is None:
            if len(_cache) >= _CACHE_SIZE:
                _cache.pop(next(iter(_cache)))
            model = _cache[key] = AnthropicModel(
                model_name,
                api_key=settings.anthropic_api_key,
                base_url=settings.anthropic_base_url,
                timeout=timeout,
                max_retries=retries,
            )
        return model
