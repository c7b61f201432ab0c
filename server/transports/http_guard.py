"""The checks every HTTP request to a fleet passes before any route sees it.

The fleet is reachable by anything that can open a socket to it, including a browser page the
operator happens to have open (DNS rebinding, cross-origin form posts), so the app refuses what a
legitimate client never sends: a non-loopback `Host` on a loopback-bound server, a cross-origin
`Origin`, a body over the size limit (413) or one that stalls (408). It also names the client
(`client_key`), which the episode store uses to cap how many episodes one client may hold.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..runtime.mcp_server import CLIENT_SCOPE_KEY

MAX_JSON_DEPTH = 32
"""Deeper JSON than any control-plane body needs (state is table -> rows -> row object)."""


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the server on this machine.

    An empty host and the wildcards (`0.0.0.0`, `::`) bind every interface, so they are not.
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(token: str | None) -> None:
    """A token must be printable ASCII: it is compared byte for byte with an HTTP header."""
    if token is not None and (not token or not all(33 <= ord(c) < 127 for c in token)):
        raise ValueError("the bearer token must be non-empty printable ASCII without spaces")


def bearer_matches(scope: Scope, token: str) -> bool:
    """Whether the request carries exactly `Authorization: Bearer <token>` (one header, exact bytes).

    Compared as bytes, so a malformed or non-ASCII credential is simply a mismatch (401), never
    an exception.
    """
    given = [v for k, v in scope.get("headers", []) if k == b"authorization"]
    if len(given) != 1:
        return False
    return hmac.compare_digest(given[0], b"Bearer " + token.encode("ascii"))


FORWARDED_CLIENT_HEADER = b"x-envforge-client"
"""The client a fleet's front forwards a request for (`http_front`): believed only from a request
that carries the worker's own private token, which only the front holds."""


def client_key(scope: Scope, token: str | None, *, trust_forwarded: bool = False) -> str:
    """Who is calling, for per-client limits: the bearer token when the server checks one and the
    request carries it, else the remote address. Unchecked credentials are ignored, so inventing
    tokens does not make a client many clients. A worker behind a front (`trust_forwarded`) takes
    the client the front names, on a request with the worker's token only."""
    if token is not None and bearer_matches(scope, token):
        forwarded = _header(scope, FORWARDED_CLIENT_HEADER)
        if trust_forwarded and forwarded:
            return forwarded
        return "token:" + hashlib.sha256(token.encode("ascii")).hexdigest()[:12]
    client = scope.get("client")
    return f"addr:{client[0] if client else 'unknown'}"


class BadJSON(ValueError):
    """A request body that is not acceptable JSON; its message is the 400 answer."""


def parse_json(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode a body, refusing malformed, non-UTF-8 or nested-deeper-than-`max_depth` JSON."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadJSON("body is not valid JSON") from exc
    if _depth_exceeds(value, max_depth):
        raise BadJSON(f"body JSON is nested deeper than {max_depth} levels")
    return value


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children: Iterable[Any] = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _header(scope: Scope, name: bytes) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _hostname(netloc: str) -> str:
    """`host` of `host[:port]`, also for bracketed IPv6 (`[::1]:8000`)."""
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def _refuse(status: int, message: str, *, close: bool = False) -> JSONResponse:
    headers = {"connection": "close"} if close else None
    return JSONResponse({"error": message}, status, headers=headers)


class HTTPGuard:
    """ASGI middleware: Host/Origin checks, body size and body read-time limits, client naming."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        loopback: bool,
        token: str | None,
        max_body_bytes: int,
        body_timeout: float,
        body_deadline: float,
        trust_forwarded: bool = False,
    ) -> None:
        self.app = app
        self.trust_forwarded = trust_forwarded
        self.loopback = loopback
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.body_deadline = body_deadline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._check_origin(scope) or self._check_length(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        scope[CLIENT_SCOPE_KEY] = client_key(scope, self.token, trust_forwarded=self.trust_forwarded)
        await self._limited(scope, receive, send)

    def _check_origin(self, scope: Scope) -> JSONResponse | None:
        host = _header(scope, b"host")
        if self.loopback and (host is None or not is_loopback(_hostname(host))):
            return _refuse(421, f"Host {host!r} is not a loopback name; this server only answers on loopback")
        origin = _header(scope, b"origin")
        if origin is None:
            return None
        parts = urlsplit(origin)
        same_origin = parts.scheme in ("http", "https") and host is not None and parts.netloc == host
        if not same_origin or (self.loopback and not is_loopback(parts.hostname or "")):
            return _refuse(403, f"cross-origin request from {origin!r} refused")
        return None

    def _check_length(self, scope: Scope) -> JSONResponse | None:
        declared = _header(scope, b"content-length")
        if declared is None:
            return None
        if not declared.strip().isdigit():
            return _refuse(400, "malformed Content-Length", close=True)
        if int(declared) > self.max_body_bytes:
            return _refuse(413, f"body over {self.max_body_bytes} bytes", close=True)
        return None

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a receive that enforces the body's size and read time.

        The body may stall at most `body_timeout` between chunks and must be complete within
        `body_deadline` of the request's start, so a body trickled in just under the stall limit
        cannot hold its connection (and its slot under the connection cap) for ever.
        On a breach the app is told the client went away (so it stops), and the client gets 413
        or 408 if no response had started; whatever the app answers to that disconnect is dropped.
        """
        received = 0
        body_done = False
        breach: JSONResponse | None = None
        started = False
        deadline = anyio.current_time() + self.body_deadline

        async def guarded_receive() -> Message:
            nonlocal received, body_done, breach
            if body_done or breach is not None:
                return await receive() if breach is None else {"type": "http.disconnect"}
            left = deadline - anyio.current_time()
            with anyio.move_on_after(min(self.body_timeout, left)) as waited:
                message = await receive()
            if waited.cancelled_caught:
                why = (
                    f"request body stalled for {self.body_timeout:g} s"
                    if left > self.body_timeout
                    else f"request body not complete within {self.body_deadline:g} s"
                )
                breach = _refuse(408, why, close=True)
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    breach = _refuse(413, f"body over {self.max_body_bytes} bytes", close=True)
                    return {"type": "http.disconnect"}
                body_done = not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if breach is not None and not started:
                return  # the app's answer to the "disconnect" (the MCP SDK's is a 500): the breach answers
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, tracking_send)
        except Exception:
            if breach is None or started:
                raise
        if breach is not None and not started:
            await breach(scope, receive, send)
