"""Every model call of the harness (agent, user, judges) goes through `complete`.

One place decides what a transient failure is (rate limit, 5xx, timeout, dropped connection)
and retries it with exponential backoff; what still fails becomes `InfraError`, which the
orchestrator records as `infra_failure` (excluded from pass^k, re-run by `--resume`). Two
endings are the model's own, not the infrastructure's: a context window overflow
(`ContextOverflow`) and an answer that is not a usable message — content that is not text, a
tool call without a function name (`MalformedOutput`). Neither is retried. Tokens and cost are
read from each response, per role. While a call is waiting on a model server it is counted in
`model_waits()`, so a trial whose wall-clock limit interrupts that wait is charged to the
server, not to the agent.

Two routes reach a model: OpenAI-compatible servers named by an api base (`openai/...` or
`hosted_vllm/...` with `api_base`) are called directly over HTTP (`openai_http`), which is ~10×
cheaper per call than going through litellm; everything else, and `mock_response`, goes through
litellm. litellm itself is imported on first use: it takes seconds to import.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict

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
from .toolcalls import MalformedToolCall, extract_tool_calls, tools_into_prompt

log = logging.getLogger(__name__)
_T = TypeVar("_T")

__all__ = [
    "ContextOverflow",
    "InfraError",
    "LLMConfig",
    "MalformedOutput",
    "ModelWaits",
    "aclose_http_sessions",
    "complete",
    "http_sessions",
    "model_waits",
]


def _litellm() -> ModuleType:
    """litellm, imported on first use; typed as a module since it builds its attributes lazily."""
    import litellm

    litellm.suppress_debug_info = True
    return litellm


class InfraError(RuntimeError):
    """A model call (or the env server) failed for reasons outside the agent: not the agent's fault."""


class MalformedOutput(RuntimeError):
    """The model answered, but not with a usable message: the agent's fault, never retried."""


@dataclass
class ModelWaits:
    """Model calls of one trial: how many are in flight, and how many a cancellation interrupted."""

    in_flight: int = 0
    interrupted: int = 0


_WAITS: ContextVar[ModelWaits | None] = ContextVar("envforge_model_waits", default=None)


@contextmanager
def model_waits() -> Iterator[ModelWaits]:
    """Count, for the block's duration, the model calls made from it (and from tasks it starts)."""
    waits = ModelWaits()
    token = _WAITS.set(waits)
    try:
        yield waits
    finally:
        _WAITS.reset(token)


@contextmanager
def _waiting() -> Iterator[None]:
    waits = _WAITS.get()
    if waits is not None:
        waits.in_flight += 1
    try:
        yield
    except anyio.get_cancelled_exc_class():
        if waits is not None:
            waits.interrupted += 1
        raise
    finally:
        if waits is not None:
            waits.in_flight -= 1


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
    tools_in_prompt: bool = False
    """For models whose chat template has no tool support: the tools go into the system prompt and
    calls come back as text (`toolcalls.tools_into_prompt`)."""

    def uses_http(self) -> bool:
        if self.transport == "litellm" or self.mock_response is not None:
            return False
        openai_like = self.model.split("/", 1)[0] in PROVIDERS and self.api_base is not None
        if self.transport == "http" and not openai_like:
            raise ValueError(f"transport 'http' needs openai/ or hosted_vllm/ and an api base: {self.model}")
        return openai_like


_UNPRICED: set[str] = set()
"""Models litellm has no price for: looking one up costs ~1 ms per call, and the answer never changes."""


def routable_model(model: str) -> bool:
    """Whether litellm knows which provider serves `model` (as it must, to call it at all)."""
    try:
        _litellm().get_llm_provider(model)
    except Exception:
        return False
    return True


def _provider_key_set(model: str) -> bool:
    """Whether the environment already holds an API key for this model's provider."""
    provider = model.split("/", 1)[0].upper().replace("-", "_")
    return bool(os.environ.get(f"{provider}_API_KEY"))


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ContextOverflow | ProviderError | MalformedOutput):
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
            if m.content is None:
                # The spec makes content optional beside tool calls; some servers (llama-cpp-python)
                # reject an explicit null there, none reject its absence.
                del d["content"]
            else:
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
    except (TypeError, ValueError, RecursionError):  # nesting past the parser's depth: not usable
        return {"__unparsed__": str(raw)}
    return value if isinstance(value, dict) else {"__unparsed__": value}


def _text(content: Any) -> str | None:
    if content is not None and not isinstance(content, str):
        raise MalformedOutput(f"message content is not text: {type(content).__name__} {str(content)[:120]}")
    return content


def _tool_call(i: int, call_id: Any, function: Any) -> ToolCall:
    """One tool call of a response; arguments that are not a JSON object stay `{"__unparsed__": ...}`
    so the conversation can tell the agent, but a call without a function name is unusable."""
    name = function.get("name") if isinstance(function, dict) else getattr(function, "name", None)
    if not isinstance(name, str) or not name:
        raise MalformedOutput(f"tool call {i} has no function name: {str(function)[:120]}")
    raw = function.get("arguments") if isinstance(function, dict) else getattr(function, "arguments", None)
    return ToolCall(id=str(call_id or f"call_{i}"), name=name, arguments=_parse_arguments(raw))


def from_openai(message: Any) -> Message:
    """litellm's response message as our `Message` (tool-call arguments parsed from JSON)."""
    calls = [
        _tool_call(i, getattr(c, "id", None), getattr(c, "function", None))
        for i, c in enumerate(getattr(message, "tool_calls", None) or [])
    ]
    return Message(role="assistant", content=_text(getattr(message, "content", None)), tool_calls=calls)


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
    if not isinstance(message, dict):
        raise MalformedOutput(f"choices[0].message is not an object: {str(message)[:120]}")
    calls = [
        _tool_call(
            i, c.get("id") if isinstance(c, dict) else None, c.get("function") if isinstance(c, dict) else c
        )
        for i, c in enumerate(message.get("tool_calls") or [])
    ]
    return Message(role="assistant", content=_text(message.get("content")), tool_calls=calls)


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


_LITELLM_UNUSABLE_ANSWER = "Invalid response object"
"""What litellm's error says when a provider's 200 answer does not convert into a chat message."""


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
    except lm.InternalServerError as exc:
        # litellm could not turn a 200 answer into a message (content that is not text, a tool
        # call it cannot parse): the model's output, not the server's failure, as on the HTTP route.
        if _LITELLM_UNUSABLE_ANSWER in str(exc):
            raise MalformedOutput(f"the answer is not a usable message: {str(exc)[:200]}") from exc
        raise
    return from_openai(response.choices[0].message), usage_of(response, cfg.model)


def retry_wait_s(cfg: LLMConfig, attempt: int) -> float:
    """Seconds to wait after failed attempt `attempt` (from 1): `backoff_s`, doubled after each
    further failure, at most `backoff_max_s`."""
    return max(0.0, min(cfg.backoff_s * 2.0 ** min(attempt - 1, 64), cfg.backoff_max_s))


async def _with_retries(cfg: LLMConfig, call: Callable[[], Awaitable[_T]]) -> _T:
    """`call()`, tried up to `cfg.retries + 1` times while it fails with a transient error, waiting
    `retry_wait_s` between tries; the last error, or the first that is not transient, is raised.

    A loop rather than tenacity's `AsyncRetrying`: that builds ~35 objects per call that refer to
    each other (its state, a `concurrent.futures.Future` with its lock and condition), garbage
    only the cycle collector can free, and at 2,048 episodes in flight freeing them was most of
    what its collections did (~6 model calls a simulation with the bench's fake)."""
    attempts = max(1, cfg.retries + 1)  # the first try is made whatever `retries` says
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except Exception as exc:
            if attempt == attempts or not _is_transient(exc):
                raise
        await anyio.sleep(retry_wait_s(cfg, attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def complete(
    cfg: LLMConfig, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, **extra: Any
) -> tuple[Message, Usage]:
    """One chat completion with retries; returns the assistant message and its usage.

    Raises `InfraError` once retries are spent on transient errors (or on any other provider
    error), and — never retried — `ContextOverflow` when the prompt does not fit the model and
    `MalformedOutput` when the answer is not a usable message. Backoff counts as waiting on the
    model server, like the calls themselves. When tools are offered, calls the model wrote as
    text (tags, bare JSON) become tool calls (`toolcalls`); a tagged call that is not one is
    `MalformedOutput`.
    """
    route = _complete_http if cfg.uses_http() else _complete_litellm
    offered = bool(tools)
    if tools and cfg.tools_in_prompt:
        messages, tools = tools_into_prompt(messages, tools), None
    try:
        with _waiting():
            message, usage = await _with_retries(cfg, lambda: route(cfg, messages, tools, extra))
    except (ContextOverflow, MalformedOutput):
        raise
    except Exception as exc:
        raise InfraError(f"{cfg.model}: {type(exc).__name__}: {exc}") from exc
    if not offered:
        return message, usage
    try:
        return extract_tool_calls(message), usage
    except MalformedToolCall as exc:
        raise MalformedOutput(str(exc)) from exc
