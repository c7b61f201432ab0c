"""One MCP server per environment, whose tool calls are routed to the caller's episode.

mcp 2.x hands tools no session, so the episode is found from the request itself, in order:
the `_meta` key `envforge/episode` (our harness), the per-episode URL
`/envs/<env>/episodes/<id>/mcp` (any stock client), the server's default episode (stdio), or
the legacy `Mcp-Session-Id` (each legacy HTTP session gets an episode of its own). A request
carrying none of these (a stateless 2026-era client on the plain env URL) may read the seed
state but is refused writes, so two clients can never silently share writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from .episodes import Episode
from .errors import EpisodeNotFound
from .runtime import ToolResult, execute

if TYPE_CHECKING:
    from .fleet import Fleet

EPISODE_META_KEY = "envforge/episode"
ERROR_META_KEY = "envforge/error"
"""`_meta` key of a failed call's result: its `ToolResult.kind` (`refused`, `invalid`, `env_error`),
so a client can tell an env's crash from a refusal without parsing text."""


def list_tools_result(fleet: Fleet, env_name: str) -> types.ListToolsResult:
    env = fleet.envs[env_name]
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
        for spec in env.tools.values()
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

    def __init__(self, fleet: Fleet, env_name: str, default_episode_id: str | None = None) -> None:
        self.fleet = fleet
        self.env_name = env_name
        self.default_episode_id = default_episode_id
        self._session_episodes: dict[str, str] = {}
        self._tools = list_tools_result(fleet, env_name)
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
        episode_id = meta.get(EPISODE_META_KEY) if isinstance(meta, dict) else None
        request = ctx.request
        if episode_id is None and request is not None:
            episode_id = getattr(request, "path_params", {}).get("episode_id")
        if episode_id is None:
            episode_id = self.default_episode_id
        if episode_id is None and request is not None:
            session_id = request.headers.get("mcp-session-id")
            if session_id:
                episode_id = self._session_episodes.get(session_id)
                if episode_id is None or self.fleet.store.find(episode_id) is None:
                    episode = await self.fleet.create_episode(self.env_name)
                    self._session_episodes[session_id] = episode.id
                    self._forget_dead_sessions()
                    return episode
        if episode_id is None:
            if writes:
                return _refusal(
                    "this connection is not bound to an episode, so writes are refused. Connect to "
                    f"/envs/{self.env_name}/episodes/<id>/mcp (create one on the control plane), or use a "
                    "client that keeps an MCP session (Mcp-Session-Id) to get a private episode."
                )
            return await self.fleet.shared_seed_episode(self.env_name)
        try:
            episode = self.fleet.store.get(str(episode_id))
        except EpisodeNotFound as exc:
            return _refusal(str(exc))
        if episode.env.name != self.env_name:
            return _refusal(
                f"episode {episode_id!r} belongs to env {episode.env.name!r}, not {self.env_name!r}"
            )
        return episode

    def _forget_dead_sessions(self) -> None:
        """Drop session->episode entries whose episode expired, so the map cannot grow without bound."""
        if len(self._session_episodes) > 2 * max(16, len(self.fleet.store)):
            self._session_episodes = {
                s: e for s, e in self._session_episodes.items() if self.fleet.store.find(e) is not None
            }

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        spec = self.fleet.envs[self.env_name].tools.get(params.name)
        writes = spec is not None and not spec.read_only
        resolved = await self._resolve(ctx, writes)
        if isinstance(resolved, types.CallToolResult):
            return resolved
        return _as_call_result(await execute(resolved, params.name, params.arguments))
