"""A per-client cap on the OpenEnv sessions of `envforge.integrations.openenv`'s app.

OpenEnv's own cap (`max_concurrent_envs`) counts sessions over all clients, so one client that
opens them all (64 WebSockets, held idle) locks every other client out: OpenEnv answers them
CAPACITY_REACHED until it lets go. This ASGI middleware counts each client's sessions and
refuses one past `per_client` before OpenEnv makes it, leaving the rest to others.

The client is who `envforge serve` caps per client (`envforge.server.client_key`): the remote
address, as the OpenEnv app checks no token. Behind uvicorn's `proxy_headers` (on by default)
uvicorn takes that address from `X-Forwarded-For` of any loopback peer, so any local process
could call itself many clients; serve the app with `proxy_headers=False`, as `envforge serve` does.

What holds a session:
- a WebSocket on `/ws` (what OpenEnv's `EnvClient` speaks): one session for its lifetime,
  counted while it is open; past the cap it is accepted and answered with OpenEnv's own error
  message (code CAPACITY_REACHED), which OpenEnv's client raises, then closed;
- `/mcp`, over HTTP (`openenv/session/create` makes a session no connection holds, so nothing
  ever frees it) and WebSocket: envforge's environment has no MCP tools (every other MCP method
  there answers "Environment does not support MCP"; envforge's MCP server is `envforge serve`),
  so `/mcp` is refused, with a one-line reason, and holds nothing.
"""

from __future__ import annotations

import json

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from envforge.server import client_key

CAPACITY_CODE = "CAPACITY_REACHED"
"""OpenEnv's error code for a session it cannot open (`WSErrorCode.CAPACITY_REACHED`)."""

REFUSAL_WAIT_S = 10.0
"""How long a refused `/ws` connection waits for the client's first message (no session held)."""

NO_MCP = (
    "envforge's OpenEnv environment has no MCP tools: its sessions are OpenEnv's WebSocket (/ws); "
    "envforge's MCP server is `envforge serve`"
)


def default_per_client(max_sessions: int) -> int:
    """Half the server's sessions, at least one: never all of them, as `envforge serve` caps a
    client's connections at half its cap."""
    return max(1, max_sessions // 2)


class SessionsPerClient:
    """ASGI middleware: at most `per_client` `/ws` sessions open per client; `/mcp` refused."""

    def __init__(self, app: ASGIApp, *, per_client: int) -> None:
        if per_client < 1:
            raise ValueError(f"max_sessions_per_client must be at least 1, not {per_client}")
        self.app = app
        self.per_client = per_client
        self.held: dict[str, int] = {}
        """client -> its open `/ws` sessions (one event loop: no lock is needed)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = _route_path(scope)
        is_mcp = path == "/mcp" or path.startswith("/mcp/")
        if scope["type"] not in ("http", "websocket") or not (path == "/ws" or is_mcp):
            await self.app(scope, receive, send)
            return
        if is_mcp:
            await _refuse_mcp(scope, receive, send)
            return
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        client = client_key(scope, None)
        held = self.held.get(client, 0)
        if held >= self.per_client:
            why = (
                f"this client ({client.removeprefix('addr:')}) holds {held} OpenEnv sessions, "
                f"its cap (max_sessions_per_client={self.per_client}): close one first"
            )
            await _refuse_session(scope, receive, send, why)
            return
        self.held[client] = held + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.held[client] - 1
            if left:
                self.held[client] = left
            else:
                del self.held[client]


def _route_path(scope: Scope) -> str:
    """The path the app's routes match: without the prefix it is mounted under (`root_path`), so
    a mounted app's `/prefix/ws` is capped as its `/ws`."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


async def _refuse_session(scope: Scope, receive: Receive, send: Send, why: str) -> None:
    """Refuse a `/ws` session with OpenEnv's own error message, which OpenEnv's client raises on
    its first reset or step. The socket stays open until that first message (at most
    `REFUSAL_WAIT_S`): closed at once, the client's send would fail on the closed socket, with
    the reason lost, before its read found the message."""
    socket = WebSocket(scope, receive, send)
    await socket.accept()
    await socket.send_text(json.dumps({"type": "error", "data": {"message": why, "code": CAPACITY_CODE}}))
    with anyio.move_on_after(REFUSAL_WAIT_S):
        if (await receive())["type"] == "websocket.disconnect":
            return
    await socket.close(code=1008, reason="session cap per client")


async def _refuse_mcp(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "websocket":
        socket = WebSocket(scope, receive, send)
        await socket.close(code=1008, reason="no MCP here")
        return
    await JSONResponse({"error": NO_MCP}, status_code=404)(scope, receive, send)
