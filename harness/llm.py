"""Every model call of the harness (agent, user, judges) goes through `complete`.

One place decides what a transient failure is (rate limit, 5xx, timeout, dropped connection)
and retries it with exponential backoff; what still fails becomes `InfraError`, which the
orchestrator records as `infra_failure` (excluded from pass^k, re-run by `--resume`). A context
window overflow is the model's own limit, not the infrastructure's, so it passes through as
litellm's `ContextWindowExceededError`. Tokens and cost are read from each response, per role.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import litellm
from pydantic import BaseModel, ConfigDict
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from .records import Message, ToolCall, Usage

litellm.suppress_debug_info = True
log = logging.getLogger(__name__)

TRANSIENT: tuple[type[BaseException], ...] = (
    litellm.RateLimitError,
    litellm.InternalServerError,
    litellm.ServiceUnavailableError,
    litellm.APIConnectionError,
    litellm.Timeout,
    litellm.BadGatewayError,
)


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


_UNPRICED: set[str] = set()
"""Models litellm has no price for: looking one up costs ~1 ms per call, and the answer never changes."""


def _provider_key_set(model: str) -> bool:
    """Whether the environment already holds an API key for this model's provider."""
    provider = model.split("/", 1)[0].upper().replace("-", "_")
    return bool(os.environ.get(f"{provider}_API_KEY"))


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, litellm.ContextWindowExceededError):
        return False
    if isinstance(exc, TRANSIENT):
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
            cost = float(litellm.completion_cost(completion_response=response, model=model) or 0.0)
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


async def complete(
    cfg: LLMConfig, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, **extra: Any
) -> tuple[Message, Usage]:
    """One chat completion with retries; returns the assistant message and its usage.

    Raises `InfraError` once retries are spent on transient errors (or on any other provider
    error), and lets `litellm.ContextWindowExceededError` through.
    """
    kwargs: dict[str, Any] = {
        "model": cfg.model,
        "messages": messages,
        "timeout": cfg.timeout_s,
        "max_retries": 0,  # the provider SDK's own retries off: ours below are the only ones
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
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(cfg.retries + 1),
            wait=wait_exponential(multiplier=cfg.backoff_s, max=cfg.backoff_max_s),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        ):
            with attempt:
                response = await litellm.acompletion(**kwargs)
    except litellm.ContextWindowExceededError:
        raise
    except Exception as exc:
        raise InfraError(f"{cfg.model}: {type(exc).__name__}: {exc}") from exc
    return from_openai(response.choices[0].message), usage_of(response, cfg.model)
