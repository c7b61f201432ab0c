"""A direct chat-completions client for OpenAI-compatible servers (vLLM, a local fake, a proxy).

litellm is the right tool for the long tail of providers, but for the common case of an
OpenAI-compatible endpoint it costs ~8 ms of CPU per call (its own bookkeeping and pricing, plus
the openai SDK walking every request body against its type annotations). With an instant model
that is most of a simulation's cost, so `complete` sends these calls straight over one pooled
aiohttp session instead: one JSON body out, one JSON body in. aiohttp rather than httpx because
httpx's pool scans every open connection on each request: at 32 concurrent episodes that alone
cost ~4 ms a call, against ~0.3 ms for aiohttp.

The contract is the same as the litellm route: the caller's retry loop sees `TransientHTTPError`
(429, 5xx, timeouts, refused or dropped connections), `ContextOverflow` for a 400 that says the
prompt is too long, and `ProviderError` for any other error answer. Prices come from litellm's
bundled price table, read as a file so nothing is imported for it.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path
from typing import Any

import aiohttp
import anyio

PROVIDERS = ("openai", "hosted_vllm")
"""Model prefixes whose servers speak the OpenAI chat-completions protocol as is."""

_OVERFLOW_MARKERS = (
    "context length",
    "context_length_exceeded",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
)


class ContextOverflow(RuntimeError):
    """The request does not fit the model's context window: the model's limit, never retried."""


class ProviderError(RuntimeError):
    """A non-transient error answer (4xx other than 429): retrying would get the same answer."""


class TransientHTTPError(RuntimeError):
    """Worth retrying: a 429 or 5xx answer, a timeout, or a connection that failed or dropped."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status


def wire_model(model: str) -> str:
    """`hosted_vllm/Qwen/Qwen3-8B` -> `Qwen/Qwen3-8B`: the name the server itself knows."""
    return model.split("/", 1)[1] if "/" in model else model


@cache
def _price_table() -> dict[str, Any]:
    spec = importlib.util.find_spec("litellm")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        path = Path(root) / "model_prices_and_context_window_backup.json"
        if path.exists():
            table: dict[str, Any] = json.loads(path.read_text())
            return table
    return {}


@cache
def token_prices(model: str) -> tuple[float, float]:
    """(input, output) USD per token for `model` from litellm's price table; (0, 0) when unknown."""
    table = _price_table()
    entry = table.get(model) or table.get(wire_model(model)) or {}
    return float(entry.get("input_cost_per_token") or 0.0), float(entry.get("output_cost_per_token") or 0.0)


class _Sessions:
    """One pooled session per (api base, key) and event loop: connections are reused across calls."""

    def __init__(self) -> None:
        self._loop: object = None
        self._sessions: dict[tuple[str, str | None], aiohttp.ClientSession] = {}

    def get(self, api_base: str, api_key: str | None) -> aiohttp.ClientSession:
        loop = anyio.lowlevel.current_token().native_token
        if loop is not self._loop:
            # Sessions belong to the event loop that opened them; a new loop starts a new pool.
            self._loop, self._sessions = loop, {}
        key = (api_base, api_key)
        session = self._sessions.get(key)
        if session is None or session.closed:
            headers = {"User-Agent": "envforge-harness", "Content-Type": "application/json"}
            if api_key:
                headers["Authorization"] = f"Bearer {api_key}"
            session = aiohttp.ClientSession(
                headers=headers, connector=aiohttp.TCPConnector(limit=0), skip_auto_headers=("User-Agent",)
            )
            self._sessions[key] = session
        return session

    async def aclose(self) -> None:
        """Close this loop's sessions (their sockets); the next call opens new ones."""
        loop = anyio.lowlevel.current_token().native_token
        if loop is self._loop:
            sessions, self._sessions = list(self._sessions.values()), {}
            for session in sessions:
                await session.close()


_SESSIONS = _Sessions()


async def aclose_http_sessions() -> None:
    """Close the pooled sessions this event loop opened (the next call opens new ones)."""
    with anyio.CancelScope(shield=True):
        await _SESSIONS.aclose()


@asynccontextmanager
async def http_sessions() -> AsyncIterator[None]:
    """Scope for a run: the pooled sessions opened inside are closed on the way out."""
    try:
        yield
    finally:
        await aclose_http_sessions()


class _ToolsJSON:
    """The JSON text of the tool lists requests offer, encoded once per distinct list.

    An agent offers the env's tools with every model call: ~12 kB of small nested objects, most
    of what encoding a request costs (~50 us of ~65), while the conversation around them is a few
    long strings. A list's `marshal` bytes (format 2: no back-references, so they depend on the
    content alone) name its content exactly, types and key order included, for a fifth of what
    encoding it costs; equal bytes mean the same JSON. A list `marshal` cannot write (a subclass,
    an object) is encoded every time.
    """

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._texts: dict[bytes, str] = {}

    def dumps(self, tools: list[Any]) -> str:
        try:
            key = marshal.dumps(tools, 2)
        except ValueError:
            return json.dumps(tools)
        text = self._texts.pop(key, None)
        if text is None:
            text = json.dumps(tools)
            if len(self._texts) >= self.size:
                del self._texts[next(iter(self._texts))]  # the least recently used
        self._texts[key] = text
        return text


_TOOLS_JSON = _ToolsJSON()


def request_json(body: dict[str, Any]) -> str:
    """`json.dumps(body)`, to the byte, with the `tools` list (the last key, where the harness
    puts it) encoded by `_ToolsJSON`."""
    tools = body.get("tools")
    if type(tools) is not list or not tools or next(reversed(body)) != "tools":
        return json.dumps(body)
    rest = {k: v for k, v in body.items() if k != "tools"}
    head = json.dumps(rest)[:-1] + ", " if rest else "{"
    return f'{head}"tools": {_TOOLS_JSON.dumps(tools)}}}'


def _error_message(status: int, text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error or body)[:500]


async def chat_completion(
    *,
    api_base: str,
    api_key: str | None,
    body: dict[str, Any],
    timeout_s: float,
) -> dict[str, Any]:
    """POST one chat completion and return the decoded response.

    Raises `TransientHTTPError` for what a retry may fix, `ContextOverflow` for a prompt that does
    not fit, and `ProviderError` for any other error answer.
    """
    session = _SESSIONS.get(api_base, api_key)
    url = api_base.rstrip("/") + "/chat/completions"
    try:
        async with session.post(
            url, data=request_json(body), timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            status, text = response.status, await response.text()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise TransientHTTPError(f"{url}: {type(exc).__name__}: {exc}") from exc
    if status >= 400:
        message = _error_message(status, text)
        if status == 429 or status >= 500:
            raise TransientHTTPError(f"HTTP {status}: {message}", status)
        if any(marker in message.lower() for marker in _OVERFLOW_MARKERS):
            raise ContextOverflow(message)
        raise ProviderError(f"HTTP {status}: {message}")
    try:
        answer: dict[str, Any] = json.loads(text)
    except ValueError as exc:
        raise ProviderError(f"{url}: answer is not JSON: {text[:200]!r}") from exc
    return answer
