"""One MCP server per environment, whose tool calls are routed to the caller's episode.

mcp 2.x hands tools no session, so the episode is found from the request itself:

- a *pinned* episode: the per-episode URL `/envs/<env>/episodes/<id>/mcp` (any stock client) or
  the server's default episode (stdio). `_meta["envforge/episode"]` may repeat the pinned id but
  never redirect the call to another episode: a different id is refused.
- else the `_meta` key `envforge/episode` (our harness, on the plain env URL). Episode ids are
  128-bit random capabilities, so naming one is proof of having been given it.
- else a legacy (handshake-era) MCP session: each gets an episode of its own, created on its first
  call and closed with the session. Only session ids the SDK issued and validated count: on the
  stateless 2026 protocol there are no sessions, and an `Mcp-Session-Id` header a 2026-era request
  carries is ignored, so inventing (or copying) one gets nothing.

A request with none of these (a stateless client on the plain env URL) may read the seed state
but is refused writes, so two clients can never silently share writes. An episode that expired or
was closed answers an error saying so; nothing is ever restarted from the seed behind a client.

An env with user tools (dual control: `side="user"`) has a second server, `EnvUserMCPServer`, that
lists and calls only those, and only in one episode: the one its per-episode user URL names
(`/envs/<env>/episodes/<id>/user/<key>/mcp`, where `key` is `Fleet.user_key(id)`), or the default
episode it was made for in process. It has no plain URL, no `_meta` routing and no session
episodes. Setup and check tools are never listed nor called by either server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from ..core.errors import EpisodeLimitReached, EpisodeNotFound
from .calls import ToolResult, execute
from .episodes import Episode, EpisodeStore
from .loader import Environment

EPISODE_META_KEY = "envforge/episode"
CLIENT_SCOPE_KEY = "envforge.client"
"""ASGI scope key where the HTTP app puts the caller's client key (see `http_guard.client_key`)."""
ERROR_META_KEY = "envforge/error"
"""`_meta` key of a failed call's result: its `ToolResult.kind` (`refused`, `invalid`, `env_error`),
so a client can tell an env's crash from a refusal without parsing text."""


class EpisodeHost(Protocol):
    """What an env's MCP server needs of whoever serves it (a `Fleet`): the envs, the episode
    store, and the episode lifecycle. Defined here, where it is used, so the server does not
    import the fleet that builds it."""

    @property
    def envs(self) -> Mapping[str, Environment]: ...

    @property
    def store(self) -> EpisodeStore: ...

    async def shared_seed_episode(self, env_name: str) -> Episode: ...

    async def create_episode(self, env_name: str, *, owner: str | None = None) -> Episode: ...

    async def close_episode(self, episode_id: str) -> None: ...

    def user_key_matches(self, episode_id: str, key: str) -> bool: ...


def list_tools_result(env: Environment, side: Literal["agent", "user"] = "agent") -> types.ListToolsResult:
    tools = [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input_schema,
            annotations=types.ToolAnnotations(
                read_only_hint=spec.read_only,
                destructive_hint=not spec.read_only,
                open_world_hint=False,
            ),
        )
        for spec in env.tools_of(side).values()
    ]
    return types.ListToolsResult(tools=tools)


def _as_call_result(result: ToolResult) -> types.CallToolResult:
    meta = {ERROR_META_KEY: result.kind} if result.is_error else None
    return types.CallToolResult(
        content=[types.TextContent(text=result.text)], is_error=result.is_error, meta=meta
    )


def _refusal(text: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=f"Error: {text}")], is_error=True, meta={ERROR_META_KEY: "invalid"}
    )


class EnvMCPServer:
    """Builds the low-level `mcp.server.Server` for one env of a fleet and resolves episodes."""

    def __init__(self, fleet: EpisodeHost, env_name: str, default_episode_id: str | None = None) -> None:
        self.fleet = fleet
        self.env_name = env_name
        self.default_episode_id = default_episode_id
        self._session_episodes: dict[str, str] = {}
        self._session_lock = anyio.Lock()
        self._tools = list_tools_result(fleet.envs[env_name])
        env = fleet.envs[env_name]
        self.server: Server[Any] = Server(
            f"envforge-{env_name}",
            version=env.manifest.version,
            description=env.manifest.description,
            instructions=env.policy,
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
        )

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return self._tools

    async def _resolve(self, ctx: ServerRequestContext[Any], writes: bool) -> Episode | types.CallToolResult:
        meta = ctx.meta or {}
        named = meta.get(EPISODE_META_KEY) if isinstance(meta, dict) else None
        request = ctx.request
        pinned = getattr(request, "path_params", {}).get("episode_id") if request is not None else None
        pinned = pinned or self.default_episode_id
        if pinned is not None:
            if named is not None and str(named) != pinned:
                return _refusal(
                    f"this endpoint is bound to episode {pinned!r}; _meta[{EPISODE_META_KEY!r}] names "
                    "another episode, which is refused (use that episode's own URL)"
                )
            return self._episode(pinned)
        if named is not None:
            return self._episode(str(named))
        session_id = _issued_session_id(ctx)
        if session_id is not None:
            return await self._session_episode(session_id, _client_of(request))
        if writes:
            return _refusal(
                "this connection is not bound to an episode, so writes are refused. Connect to "
                f"/envs/{self.env_name}/episodes/<id>/mcp (create one on the control plane), or use a "
                "client that keeps an MCP session (Mcp-Session-Id) to get a private episode."
            )
        return await self.fleet.shared_seed_episode(self.env_name)

    def _episode(self, episode_id: str) -> Episode | types.CallToolResult:
        try:
            episode = self.fleet.store.get(episode_id)
        except EpisodeNotFound as exc:
            return _refusal(str(exc))
        if episode.env.name != self.env_name:
            return _refusal(
                f"episode {episode_id!r} belongs to env {episode.env.name!r}, not {self.env_name!r}"
            )
        return episode

    async def _session_episode(self, session_id: str, owner: str | None) -> Episode | types.CallToolResult:
        """The legacy session's own episode: created on first use, never re-created once it ended.

        Creation is serialised, so two concurrent first calls of one session share one episode.
        """
        episode_id = self._session_episodes.get(session_id)
        if episode_id is not None:
            return self._episode(episode_id)
        async with self._session_lock:
            episode_id = self._session_episodes.get(session_id)
            if episode_id is not None:
                return self._episode(episode_id)
            try:
                episode = await self.fleet.create_episode(self.env_name, owner=owner)
            except EpisodeLimitReached as exc:
                return _refusal(str(exc))
            self._session_episodes[session_id] = episode.id
            self._forget_dead_sessions()
            return episode

    async def end_session(self, session_id: str) -> None:
        """The MCP session ended (HTTP DELETE): close the episode it created, if still open."""
        episode_id = self._session_episodes.pop(session_id, None)
        if episode_id is not None and self.fleet.store.find(episode_id) is not None:
            await self.fleet.close_episode(episode_id)

    def _forget_dead_sessions(self) -> None:
        """Bound the session->episode map: drop sessions whose episode ended, keeping the most
        recent ones while there is room, so a session whose episode just expired is told so
        (rather than getting a fresh episode) for as long as possible."""
        limit = 2 * max(1024, len(self.fleet.store))
        if len(self._session_episodes) <= limit:
            return
        store = self.fleet.store
        alive = {s: e for s, e in self._session_episodes.items() if store.find(e) is not None}
        ended = [(s, e) for s, e in self._session_episodes.items() if s not in alive]
        room = max(0, limit // 2 - len(alive))
        self._session_episodes = dict(ended[len(ended) - room :] if room else []) | alive

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        spec = self.fleet.envs[self.env_name].tools.get(params.name)
        writes = spec is not None and not spec.read_only
        resolved = await self._resolve(ctx, writes)
        if isinstance(resolved, types.CallToolResult):
            return resolved
        return _as_call_result(await execute(resolved, params.name, params.arguments))


def _issued_session_id(ctx: ServerRequestContext[Any]) -> str | None:
    """The legacy MCP session id of this request, only where the SDK issued and validated it.

    On the handshake-era transport the session manager answers 404 to an unknown
    `Mcp-Session-Id` before the request reaches us, so one seen here is a live session. A
    2026-era request never has a session (the protocol is stateless), so its header is ignored.
    """
    request = ctx.request
    if request is None or ctx.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    session_id = request.headers.get("mcp-session-id")
    return session_id or None


def _client_of(request: Any) -> str | None:
    """The client key the HTTP app stored on the request's scope, if any."""
    scope = getattr(request, "scope", None)
    return scope.get(CLIENT_SCOPE_KEY) if isinstance(scope, dict) else None


USER_INSTRUCTIONS = (
    "You are the user of this environment, acting on your own side of it (your device) with these "
    "tools. The agent you talk to cannot use them; you cannot use the agent's."
)


class EnvUserMCPServer:
    """The user side of an env's episodes (dual control): lists and calls only its user tools,
    each call in the one episode the request is bound to."""

    def __init__(self, fleet: EpisodeHost, env_name: str, default_episode_id: str | None = None) -> None:
        self.fleet = fleet
        self.env_name = env_name
        self.default_episode_id = default_episode_id
        env = fleet.envs[env_name]
        self._tools = list_tools_result(env, "user")
        self.server: Server[Any] = Server(
            f"envforge-{env_name}-user",
            version=env.manifest.version,
            description=f"{env.manifest.description} (the user's side)",
            instructions=USER_INSTRUCTIONS,
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
        )

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return self._tools

    def _resolve(self, ctx: ServerRequestContext[Any]) -> Episode | types.CallToolResult:
        request = ctx.request
        path = getattr(request, "path_params", {}) if request is not None else {}
        pinned = path.get("episode_id")
        if pinned is not None:  # over HTTP: the URL's key must be the episode's user key
            if not self.fleet.user_key_matches(pinned, str(path.get("user_key", ""))):
                return _refusal(f"episode {pinned!r}: this is not its user endpoint")
        else:
            pinned = self.default_episode_id
        if pinned is None:
            return _refusal("this user endpoint is bound to no episode")
        meta = ctx.meta or {}
        named = meta.get(EPISODE_META_KEY) if isinstance(meta, dict) else None
        if named is not None and str(named) != pinned:
            return _refusal(
                f"this user endpoint is bound to episode {pinned!r}; _meta[{EPISODE_META_KEY!r}] names "
                "another episode, which is refused"
            )
        try:
            episode = self.fleet.store.get(pinned)
        except EpisodeNotFound as exc:
            return _refusal(str(exc))
        if episode.env.name != self.env_name:
            return _refusal(f"episode {pinned!r} belongs to env {episode.env.name!r}, not {self.env_name!r}")
        return episode

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        resolved = self._resolve(ctx)
        if isinstance(resolved, types.CallToolResult):
            return resolved
        return _as_call_result(await execute(resolved, params.name, params.arguments, "user"))
