"""Every model call of the harness (agent, user, judges) goes through `complete`.

One place decides what a transient failure is (rate limit, 5xx, timeout, dropped connection)
and retries it with exponential backoff; what still fails becomes `InfraError`, which the
orchestrator records as `infra_failure` (excluded from pass^k, re-run by `--resume`). A context
window overflow is the model's own limit, not the infrastructure's, so it becomes
`ContextOverflow`. Tokens and cost are read from each response, per role.

Two routes reach a model: OpenAI-compatible servers named by an api base (`openai/...` or
`hosted_vllm/...` with `api_base`) are called directly over HTTP (`openai_http`), which is ~10×
cheaper per call than going through litellm; everything else, and `mock_response`, goes through
litellm. litellm itself is imported on first use: it takes seconds to import.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from .openai_http import (
    PROVIDERS,
    ContextOverflow,
    ProviderError,
    TransientHTTPError,
    aclose_http_sessions,
    chat_completion,
    http_sessions,
    token_prices,
    wire_model,
)
from .records import Message, ToolCall, Usage

if TYPE_CHECKING:
    import litellm

log = logging.getLogger(__name__)

__all__ = ["ContextOverflow", "InfraError", "LLMConfig", "aclose_http_sessions", "complete", "http_sessions"]


def _litellm() -> litellm:  # type: ignore[valid-type]
    import litellm

    litellm.suppress_debug_info = True
    return litellm


class InfraError(RuntimeError):
    """A model call (or the env server) failed for reasons outside the agent: not the agent's fault."""


class LLMConfig(BaseModel):
    """How to reach one model. `retries` counts extra attempts after the first."""

    model_config = ConfigDict(extra="forbid")

    model: str
    api_base: str | None = None
    api_key: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    timeout_s: float = 120.0
    retries: int = 4
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    mock_response: Any = None
    """Passed to litellm as is (tests and dry runs): a string, or an exception to raise."""
    transport: Literal["auto", "http", "litellm"] = "auto"
    """`auto`: direct HTTP for OpenAI-compatible servers with an api base, litellm otherwise."""

    def uses_http(self) -> bool:
        if self.transport == "litellm" or self.mock_response is not None:
            return False
        openai_like = self.model.split("/", 1)[0] in PROVIDERS and self.api_base is not None
        if self.transport == "http" and not openai_like:
            raise ValueError(f"transport 'http' needs openai/ or hosted_vllm/ and an api base: {self.model}")
        return openai_like


_UNPRICED: set[str] = set()
"""Models litellm has no price for: looking one up costs ~1 ms per call, and the answer never changes."""


def _provider_key_set(model: str) -> bool:
    """Whether the environment already holds an API key for this model's provider."""
    provider = model.split("/", 1)[0].upper().replace("-", "_")
    return bool(os.environ.get(f"{provider}_API_KEY"))


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ContextOverflow | ProviderError):
        return False
    if isinstance(exc, TransientHTTPError):
        return True
    lm = _litellm()
    transient = (
        lm.RateLimitError,
        lm.InternalServerError,
        lm.ServiceUnavailableError,
        lm.APIConnectionError,
        lm.Timeout,
        lm.BadGatewayError,
    )
    if isinstance(exc, lm.ContextWindowExceededError):
        return False
    if isinstance(exc, transient):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status == 429 or status >= 500)


def usage_of(response: Any, model: str) -> Usage:
    """Tokens from `response.usage`; cost from litellm's price map when it knows the model (else 0)."""
    usage = getattr(response, "usage", None)
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    hidden = getattr(response, "_hidden_params", None)
    if isinstance(hidden, dict):
        priced = hidden.get("response_cost")
    else:
        priced = getattr(hidden, "response_cost", None)
    cost = float(priced or 0.0)  # litellm prices every response itself; ask again only if it did not
    if not cost and model not in _UNPRICED:
        try:
            cost = float(_litellm().completion_cost(completion_response=response, model=model) or 0.0)
        except Exception:  # unknown model / no price: tokens still count, and we stop asking
            _UNPRICED.add(model)
    return Usage(calls=1, prompt_tokens=prompt, completion_tokens=completion, cost_usd=cost)


def add_usage(total: dict[str, Usage], role: str, usage: Usage) -> None:
    u = total.setdefault(role, Usage())
    u.calls += usage.calls
    u.prompt_tokens += usage.prompt_tokens
    u.completion_tokens += usage.completion_tokens
    u.cost_usd += usage.cost_usd


def to_openai(messages: list[Message]) -> list[dict[str, Any]]:
    """Our records in the chat-completions shape litellm expects."""
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in m.tool_calls
            ]
            d["content"] = m.content
        if m.role == "tool":
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _parse_arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"__unparsed__": str(raw)}
    return value if isinstance(value, dict) else {"__unparsed__": value}


def from_openai(message: Any) -> Message:
    """litellm's response message as our `Message` (tool-call arguments parsed from JSON)."""
    calls = [
        ToolCall(
            id=c.id or f"call_{i}", name=c.function.name, arguments=_parse_arguments(c.function.arguments)
        )
        for i, c in enumerate(getattr(message, "tool_calls", None) or [])
    ]
    return Message(role="assistant", content=getattr(message, "content", None), tool_calls=calls)


def _usage_from_json(body: dict[str, Any], model: str) -> Usage:
    usage = body.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    per_in, per_out = token_prices(model)
    cost = prompt * per_in + completion * per_out
    return Usage(calls=1, prompt_tokens=prompt, completion_tokens=completion, cost_usd=cost)


def _message_from_json(body: dict[str, Any]) -> Message:
    try:
        message = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ProviderError(f"response has no choices[0].message: {json.dumps(body)[:300]}") from exc
    calls = [
        ToolCall(
            id=c.get("id") or f"call_{i}",
            name=c["function"]["name"],
            arguments=_parse_arguments(c["function"].get("arguments")),
        )
        for i, c in enumerate(message.get("tool_calls") or [])
    ]
    return Message(role="assistant", content=message.get("content"), tool_calls=calls)


async def _complete_http(
    cfg: LLMConfig, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, extra: dict[str, Any]
) -> tuple[Message, Usage]:
    body: dict[str, Any] = {"model": wire_model(cfg.model), "messages": messages, **extra}
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    if cfg.max_tokens is not None:
        body["max_tokens"] = cfg.max_tokens
    if tools:
        body["tools"] = tools
    api_key = cfg.api_key or os.environ.get(f"{cfg.model.split('/', 1)[0].upper()}_API_KEY")
    assert cfg.api_base is not None  # uses_http() checked it
    response = await chat_completion(
        api_base=cfg.api_base, api_key=api_key, body=body, timeout_s=cfg.timeout_s
    )
    return _message_from_json(response), _usage_from_json(response, cfg.model)


async def _complete_litellm(
    cfg: LLMConfig, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, extra: dict[str, Any]
) -> tuple[Message, Usage]:
    lm = _litellm()
    kwargs: dict[str, Any] = {
        "model": cfg.model,
        "messages": messages,
        "timeout": cfg.timeout_s,
        "max_retries": 0,  # the provider SDK's own retries off: ours in `complete` are the only ones
        **extra,
    }
    for key in ("api_base", "api_key", "temperature", "max_tokens", "mock_response"):
        value = getattr(cfg, key)
        if value is not None:
            kwargs[key] = value
    if cfg.api_base and "api_key" not in kwargs and not _provider_key_set(cfg.model):
        # Local OpenAI-compatible servers (vLLM, a fake) need no key, but the openai client refuses
        # to send a request without one: give it a placeholder rather than fail every call.
        kwargs["api_key"] = "no-key-needed"
    if tools:
        kwargs["tools"] = tools
    try:
        response = await lm.acompletion(**kwargs)
    except lm.ContextWindowExceededError as exc:
        raise ContextOverflow(str(exc)) from exc
    return from_openai(response.choices[0].message), usage_of(response, cfg.model)


async def complete(
    cfg: LLMConfig, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, **extra: Any
) -> tuple[Message, Usage]:
    """One chat completion with retries; returns the assistant message and its usage.

    Raises `InfraError` once retries are spent on transient errors (or on any other provider
    error), and `ContextOverflow` (never retried) when the prompt does not fit the model.
    """
    route = _complete_http if cfg.uses_http() else _complete_litellm
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(cfg.retries + 1),
            wait=wait_exponential(multiplier=cfg.backoff_s, max=cfg.backoff_max_s),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        ):
            with attempt:
                return await route(cfg, messages, tools, extra)
    except ContextOverflow:
        raise
    except Exception as exc:
        raise InfraError(f"{cfg.model}: {type(exc).__name__}: {exc}") from exc
    raise AssertionError("unreachable: tenacity either returns or raises")
