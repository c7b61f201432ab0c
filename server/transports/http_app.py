"""The fleet over HTTP: every env's MCP endpoint plus a control plane, in one ASGI app.

Agents see only `/envs/<env>/mcp` and `/envs/<env>/episodes/<id>/mcp`. An env with user tools
(dual control) also serves each episode's user side at `/envs/<env>/episodes/<id>/user/<key>/mcp`,
whose path the control plane gives its creator (`user_mcp_path`; `Fleet.user_key`). The harness uses
`/control/...` to create, list, export and close episodes; agents never see it in their tool list,
and it demands a bearer token whenever the server listens beyond loopback. Every request first
passes `http_guard.HTTPGuard` (Host/Origin, body size and read time).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from ..core.errors import ClientEpisodeLimitReached, EpisodeLimitReached, EpisodeNotFound
from ..runtime.episodes import Episode
from ..runtime.fleet import Fleet
from ..runtime.mcp_server import CLIENT_SCOPE_KEY
from .http_guard import BadJSON, HTTPGuard, bearer_matches, check_token, is_loopback, parse_json
from .http_limits import HTTPLimits

Handler = Callable[[Request], Awaitable[Response]]


DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_BODY_DEADLINE = 120.0

__all__ = ["build_app", "is_loopback"]


def _security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection on loopback (a browser page must not reach a local fleet)."""
    if is_loopback(host):
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


class Reservations:
    """Slots being opened, per client: one is taken before an opening request is served and given
    back once, when what it opened holds the slot itself or when the request ends, whichever
    comes first (held on after the answer, it would count that session twice)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def __getitem__(self, client: str) -> int:
        return self._counts[client]

    def take(self, client: str) -> Callable[[], None]:
        """Reserve a slot for `client`; the returned function gives it back (later calls do nothing)."""
        self._counts[client] += 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self._counts[client] -= 1
                if self._counts[client] <= 0:
                    del self._counts[client]

        return give_back


def session_cap_refusal(client: str, held: int, cap: int, where: str = "") -> JSONResponse:
    """The 429 for a client at its cap of legacy MCP sessions (`where`: how far the count reaches)."""
    return _jsonrpc_error(
        f"client {client} has {held} MCP sessions open (limit {cap} per client{where}); "
        "end one (HTTP DELETE with its Mcp-Session-Id) or let one idle out first",
        429,
    )


class _SessionSlots:
    """Legacy MCP sessions open per client, across every env of the app, capped per client.

    The SDK bounds sessions per env in all (10,000), not per client, and a session makes no
    episode until its first call, so without this one client could take every slot with bare
    `initialize` requests and leave the others a 503 for the sessions' 30-minute idle life. A
    slot is reserved before the opening request is served (concurrent ones cannot overshoot), kept
    when the answer carries a session id, and freed once the SDK no longer holds that session
    (deleted, idled out, failed): checked against the manager's own table when the client asks
    for more.
    """

    def __init__(self, per_client: int) -> None:
        self.per_client = per_client
        self._open: dict[str, dict[str, StreamableHTTPSessionManager]] = {}
        self._opening = Reservations()

    def held(self, client: str) -> int:
        sessions = self._open.get(client)
        if sessions:
            live = {s: m for s, m in sessions.items() if s in m._server_instances}
            if live:
                self._open[client] = live
            else:
                del self._open[client]
        return len(self._open.get(client, ())) + self._opening[client]

    def sessions_of(self, client: str) -> list[str]:
        """The ids of `client`'s open sessions (a multi-worker front recounts a client from these)."""
        self.held(client)
        return sorted(self._open.get(client, ()))

    async def open(
        self,
        client: str,
        manager: StreamableHTTPSessionManager,
        inner: StreamableHTTPASGIApp,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Serve a request that may open a session, if `client` has a slot left."""
        held = self.held(client)
        if held >= self.per_client:
            await session_cap_refusal(client, held, self.per_client)(scope, receive, send)
            return
        release = self._opening.take(client)

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                for name, value in message.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        # the session now holds the slot: release the reservation before the
                        # answer goes out, or a client that opens its next session the moment
                        # this answer arrives is counted twice for this one (a wrong 429 at the cap)
                        self._open.setdefault(client, {})[value.decode("latin-1")] = manager
                        release()
            await send(message)

        try:
            await inner(scope, receive, watch)
        finally:
            release()


class _MCPEndpoint:
    """An env's MCP endpoint with the episode rules the SDK cannot know.

    On a per-episode URL, an unknown, closed or expired episode answers 404 (saying which)
    before the transport opens a session for it. A 2026-era request carrying `Mcp-Session-Id`
    is refused: that protocol has no sessions, so the id can only be invented or copied. A
    successful DELETE of a legacy session closes the episode that session created.
    """

    def __init__(
        self,
        fleet: Fleet,
        env_name: str,
        inner: StreamableHTTPASGIApp,
        *,
        pinned: bool,
        slots: _SessionSlots,
        user: bool = False,
    ) -> None:
        self.fleet, self.env_name, self.inner, self.pinned = fleet, env_name, inner, pinned
        self.slots, self.user = slots, user

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        if self.pinned:
            episode_id = scope.get("path_params", {}).get("episode_id", "")
            episode = self.fleet.store.find(episode_id)
            key = scope.get("path_params", {}).get("user_key", "")
            keyed = not self.user or self.fleet.user_key_matches(episode_id, key)
            if not keyed:
                episode = None  # a wrong key answers as an unknown episode: nothing to tell them apart
            if episode is None and keyed and scope["method"] == "DELETE" and b"mcp-session-id" in headers:
                # a legacy session that outlived its episode is still ended at its client's asking:
                # else its slot stays taken (`_SessionSlots`) for the session's idle life
                await self.inner(scope, receive, send)
                return
            if episode is None or episode.env.name != self.env_name:
                message = str(EpisodeNotFound(episode_id, self.fleet.store.ended(episode_id)))
                await JSONResponse({"error": f"{message} (env {self.env_name!r})"}, 404)(scope, receive, send)
                return
        session_id = headers.get(b"mcp-session-id", b"").decode("latin-1")
        version = headers.get(b"mcp-protocol-version", b"").decode("latin-1")
        if session_id and version and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            await _jsonrpc_error(
                f"protocol {version} is stateless: Mcp-Session-Id is not accepted (sessions are issued "
                "only by the initialize handshake of earlier protocol versions)",
                400,
            )(scope, receive, send)
            return
        client = scope.get(CLIENT_SCOPE_KEY)
        if not session_id and not (version and version not in HANDSHAKE_PROTOCOL_VERSIONS) and client:
            # handshake era without a session: the SDK opens one for this request
            await self.slots.open(client, self.inner.session_manager, self.inner, scope, receive, send)
            return
        if scope["method"] != "DELETE" or not session_id:
            await self.inner(scope, receive, send)
            return
        status = 0

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.inner(scope, receive, watch)
        if 200 <= status < 300 and not self.user:
            await self.fleet.mcp(self.env_name).end_session(session_id)


def _jsonrpc_error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}, status)


def _episode_json(fleet: Fleet, episode_id: str) -> dict[str, Any]:
    episode = fleet.store.get(episode_id)
    found = {
        "episode_id": episode.id,
        "env": episode.env.name,
        "mcp_path": f"/envs/{episode.env.name}/episodes/{episode.id}/mcp",
    }
    if episode.env.tools_of("user"):
        found["user_mcp_path"] = user_mcp_path(fleet, episode.env.name, episode.id)
    return found


def user_mcp_path(fleet: Fleet, env_name: str, episode_id: str) -> str:
    """The path of an episode's user endpoint (dual control), with the key only its creator gets."""
    return f"/envs/{env_name}/episodes/{episode_id}/user/{fleet.user_key(episode_id)}/mcp"


def _episode_listing(episode: Episode) -> dict[str, Any]:
    """One row of `GET /control/episodes`; times are wall-clock seconds since the epoch."""
    offset = time.time() - time.monotonic()
    return {
        "episode_id": episode.id,
        "env": episode.env.name,
        "created_at": round(episode.created_at + offset, 3),
        "last_used_at": round(episode.last_used + offset, 3),
        "calls": episode.calls,
        "owner": episode.owner,
    }


def build_app(
    fleet: Fleet,
    *,
    host: str = "127.0.0.1",
    token: str | None = None,
    reap_interval: float | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    body_deadline: float = DEFAULT_BODY_DEADLINE,
    limits: HTTPLimits | None = None,
    trust_forwarded: bool = False,
) -> Starlette:
    """The fleet's ASGI app. `token` is required (and enforced) when `host` is not loopback.

    An empty `host` and the wildcard addresses count as non-loopback: they bind every interface.
    Of `limits` the app enforces `max_sessions_per_client` (the rest are the server's: `serve_http`).
    `trust_forwarded`: a worker behind `http_front`, which names each request's client for it.
    """
    check_token(token)
    if not is_loopback(host) and not token:
        raise ValueError(
            f"binding to {host or 'every interface'} exposes the control plane: pass a bearer token"
        )

    def guard(handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            if token is not None and not bearer_matches(request.scope, token):
                return JSONResponse({"error": "missing, malformed or wrong bearer token"}, 401)
            try:
                return await handler(request)
            except EpisodeNotFound as exc:
                return JSONResponse({"error": str(exc)}, 404)
            except ClientEpisodeLimitReached as exc:
                return JSONResponse({"error": str(exc)}, 429)
            except EpisodeLimitReached as exc:
                return JSONResponse({"error": str(exc)}, 503)

        return wrapped

    async def list_envs(request: Request) -> Response:
        return JSONResponse(
            {
                "envs": [
                    {
                        "name": env.name,
                        "version": env.manifest.version,
                        "description": env.manifest.description,
                        "tools": list(env.tools),
                        "mcp_path": f"/envs/{env.name}/mcp",
                    }
                    | ({"user_tools": list(users)} if (users := env.tools_of("user")) else {})
                    for env in fleet.envs.values()
                ]
            }
        )

    async def create_episode(request: Request) -> Response:
        content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if content_type != "application/json":
            return JSONResponse({"error": "Content-Type must be application/json"}, 415)
        raw = await request.body()
        try:
            body = parse_json(raw)
        except BadJSON as exc:
            return JSONResponse({"error": f'{exc}; expected {{"env": NAME, "state"?: {{...}}}}'}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("env"), str):
            return JSONResponse({"error": "body must be a JSON object with a string 'env'"}, 400)
        if body["env"] not in fleet.envs:
            return JSONResponse({"error": f"unknown env {body['env']!r}; served: {sorted(fleet.envs)}"}, 404)
        state = body.get("state")
        if state is not None and not isinstance(state, dict):
            return JSONResponse({"error": "'state' must be an object of table -> rows"}, 400)
        try:
            episode = await fleet.create_episode(
                body["env"], state=state, owner=request.scope.get(CLIENT_SCOPE_KEY), size_hint=len(raw)
            )
        except (ValueError, RecursionError) as exc:
            return JSONResponse({"error": f"invalid state: {exc}"}, 400)
        return JSONResponse(_episode_json(fleet, episode.id), 201)

    async def list_episodes(request: Request) -> Response:
        return JSONResponse({"episodes": [_episode_listing(e) for e in fleet.store.episodes()]})

    async def export_episode(request: Request) -> Response:
        state, digest = await fleet.export(request.path_params["episode_id"])
        return JSONResponse({"state": state, "state_hash": digest})

    async def close_episode(request: Request) -> Response:
        await fleet.close_episode(request.path_params["episode_id"])
        return JSONResponse({"closed": True})

    async def stats(request: Request) -> Response:
        return JSONResponse(
            {
                "open_episodes": len(fleet.store),
                "created": fleet.store.created,
                "expired": fleet.store.expired,
            }
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def list_sessions(request: Request) -> Response:
        """The asking client's own open legacy MCP sessions (never another client's)."""
        return JSONResponse({"sessions": slots.sessions_of(request.scope.get(CLIENT_SCOPE_KEY) or "")})

    routes: list[Route] = [
        Route("/healthz", health),
        Route("/control/envs", guard(list_envs)),
        Route("/control/stats", guard(stats)),
        Route("/control/sessions", guard(list_sessions)),
        Route("/control/episodes", guard(create_episode), methods=["POST"]),
        Route("/control/episodes", guard(list_episodes), methods=["GET"]),
        Route("/control/episodes/{episode_id}/state", guard(export_episode), methods=["GET"]),
        Route("/control/episodes/{episode_id}", guard(close_episode), methods=["DELETE"]),
    ]
    managers: list[StreamableHTTPSessionManager] = []
    slots = _SessionSlots((limits or HTTPLimits()).max_sessions_per_client)
    for name in fleet.envs:
        manager = StreamableHTTPSessionManager(app=fleet.mcp(name).server, security_settings=_security(host))
        managers.append(manager)
        mcp_app = StreamableHTTPASGIApp(manager)
        plain = _MCPEndpoint(fleet, name, mcp_app, pinned=False, slots=slots)
        pinned = _MCPEndpoint(fleet, name, mcp_app, pinned=True, slots=slots)
        routes.append(Route(f"/envs/{name}/mcp", plain))
        routes.append(Route(f"/envs/{name}/episodes/{{episode_id}}/mcp", pinned))
        if fleet.envs[name].tools_of("user"):
            user_manager = StreamableHTTPSessionManager(
                app=fleet.user_mcp(name).server, security_settings=_security(host)
            )
            managers.append(user_manager)
            user_app = _MCPEndpoint(
                fleet, name, StreamableHTTPASGIApp(user_manager), pinned=True, slots=slots, user=True
            )
            routes.append(Route(f"/envs/{name}/episodes/{{episode_id}}/user/{{user_key}}/mcp", user_app))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for manager in managers:
                await stack.enter_async_context(manager.run())
            async with anyio.create_task_group() as tg:
                tg.start_soon(fleet.store.run_reaper, reap_interval)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
            await fleet.aclose()

    guarded = Middleware(
        HTTPGuard,
        loopback=is_loopback(host),
        token=token,
        max_body_bytes=max_body_bytes,
        body_timeout=body_timeout,
        body_deadline=body_deadline,
        trust_forwarded=trust_forwarded,
    )
    return Starlette(routes=routes, lifespan=lifespan, middleware=[guarded])
