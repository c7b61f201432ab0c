"""The fleet over HTTP: every env's MCP endpoint plus a control plane, in one ASGI app.

Agents see only `/envs/<env>/mcp` and `/envs/<env>/episodes/<id>/mcp`. The harness uses
`/control/...` to create, export and close episodes; agents never see it in their tool list, and
it demands a bearer token whenever the server listens beyond loopback.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .errors import EpisodeLimitReached, EpisodeNotFound
from .fleet import Fleet


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection on loopback (a browser page must not reach a local fleet)."""
    if is_loopback(host):
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


class _EpisodeGate:
    """Answers 404 for unknown episodes before the MCP transport opens a session for them."""

    def __init__(self, fleet: Fleet, env_name: str, inner: StreamableHTTPASGIApp) -> None:
        self.fleet, self.env_name, self.inner = fleet, env_name, inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        episode_id = scope.get("path_params", {}).get("episode_id")
        episode = self.fleet.store.find(episode_id) if episode_id else None
        if episode is None or episode.env.name != self.env_name:
            await JSONResponse({"error": f"no episode {episode_id!r} in env {self.env_name!r}"}, 404)(
                scope, receive, send
            )
            return
        await self.inner(scope, receive, send)


def _episode_json(fleet: Fleet, episode_id: str) -> dict[str, Any]:
    episode = fleet.store.get(episode_id)
    return {
        "episode_id": episode.id,
        "env": episode.env.name,
        "mcp_path": f"/envs/{episode.env.name}/episodes/{episode.id}/mcp",
    }


def build_app(
    fleet: Fleet,
    *,
    host: str = "127.0.0.1",
    token: str | None = None,
    reap_interval: float | None = None,
) -> Starlette:
    """The fleet's ASGI app. `token` is required (and enforced) when `host` is not loopback."""
    if not is_loopback(host) and not token:
        raise ValueError(f"binding to {host} exposes the control plane: pass a bearer token")

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given, f"Bearer {token}")

    def guard(handler: Any) -> Any:
        async def wrapped(request: Request) -> Response:
            if not authorized(request):
                return JSONResponse({"error": "missing or wrong bearer token"}, 401)
            try:
                return await handler(request)
            except EpisodeNotFound as exc:
                return JSONResponse({"error": str(exc)}, 404)
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
                    for env in fleet.envs.values()
                ]
            }
        )

    async def create_episode(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": 'body must be JSON: {"env": NAME, "state"?: {...}}'}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("env"), str):
            return JSONResponse({"error": "body must be a JSON object with a string 'env'"}, 400)
        if body["env"] not in fleet.envs:
            return JSONResponse({"error": f"unknown env {body['env']!r}; served: {sorted(fleet.envs)}"}, 404)
        state = body.get("state")
        if state is not None and not isinstance(state, dict):
            return JSONResponse({"error": "'state' must be an object of table -> rows"}, 400)
        try:
            episode = await fleet.create_episode(body["env"], state=state)
        except ValueError as exc:
            return JSONResponse({"error": f"invalid state: {exc}"}, 400)
        return JSONResponse(_episode_json(fleet, episode.id), 201)

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

    routes: list[Route] = [
        Route("/healthz", health),
        Route("/control/envs", guard(list_envs)),
        Route("/control/stats", guard(stats)),
        Route("/control/episodes", guard(create_episode), methods=["POST"]),
        Route("/control/episodes/{episode_id}/state", guard(export_episode), methods=["GET"]),
        Route("/control/episodes/{episode_id}", guard(close_episode), methods=["DELETE"]),
    ]
    managers: list[StreamableHTTPSessionManager] = []
    for name in fleet.envs:
        manager = StreamableHTTPSessionManager(app=fleet.mcp(name).server, security_settings=_security(host))
        managers.append(manager)
        mcp_app = StreamableHTTPASGIApp(manager)
        routes.append(Route(f"/envs/{name}/mcp", mcp_app))
        routes.append(Route(f"/envs/{name}/episodes/{{episode_id}}/mcp", _EpisodeGate(fleet, name, mcp_app)))

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

    return Starlette(routes=routes, lifespan=lifespan)
