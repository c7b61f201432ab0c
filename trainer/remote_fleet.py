"""A fleet behind `envforge serve`, with the surface of the in-process `Fleet` that rollout envs use.

Rollout workers on other machines (Ray actors, see `ray_workers.py`) need not run the environments
themselves: with a fleet URL, episodes live on the server and tools execute there. The env
definitions are still loaded from local env dirs, because the rollout envs read them for the system
prompt, task setup and scoring; only episode operations go over the network: the control plane for
create/export/close (the harness's `HTTPBackend`, which also turns network failures into
`InfraError`) and streamable-HTTP MCP for tool calls, bound to the episode like any agent's.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from envforge.harness import HTTPBackend
from envforge.server import (
    Environment,
    EpisodeClient,
    ExportedState,
    Fleet,
    State,
    ToolResult,
    episode_client,
    http_episode_client,
    state_hash,
)


@dataclass
class RemoteEpisode:
    id: str


@dataclass
class RemoteMCP:
    """Where `fleet.mcp(env)` serves: the URL mcp's `Client` connects to.

    The per-env endpoint serves any episode named in the request's `_meta`, which `EpisodeClient`
    always sends.
    """

    server: str


class RemoteFleet:
    """`env`, `mcp`, `create_episode`, `call`, `export`, `close_episode` and `aclose`, over HTTP.

    `episode_client` opens an episode's MCP client as the server's `episode_client` does for an
    in-process fleet (`open_episode_client` picks the one that fits)."""

    def __init__(self, base_url: str, envs: Iterable[Environment], *, token: str | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.envs = {e.name: e for e in envs}
        self.http = HTTPBackend(self.base, token)

    def env(self, name: str) -> Environment:
        try:
            return self.envs[name]
        except KeyError:
            raise KeyError(f"unknown env {name!r}; loaded here: {sorted(self.envs)}") from None

    def mcp(self, env_name: str) -> RemoteMCP:
        self.env(env_name)
        return RemoteMCP(f"{self.base}/envs/{env_name}/mcp")

    async def create_episode(self, env_name: str, *, state: State | None = None) -> RemoteEpisode:
        self.env(env_name)
        return RemoteEpisode(await self.http.create(env_name, state))

    async def call(self, episode_id: str, tool: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        """One tool call on its own MCP session (the rollout envs' `use_mcp=False` path)."""
        async with http_episode_client(self.base + self.http.paths[episode_id], episode_id) as client:
            return await client.call_tool(tool, arguments or {})

    async def export(self, episode_id: str) -> ExportedState:
        state = await self.http.export(episode_id)
        return ExportedState(state, state_hash(state))

    async def export_state(self, episode_id: str) -> State:
        return await self.http.export(episode_id)

    async def close_episode(self, episode_id: str) -> None:
        await self.http.close(episode_id)

    def episode_client(self, env_name: str, episode_id: str) -> AbstractAsyncContextManager[EpisodeClient]:
        """What the server's `episode_client` opens on an in-process fleet, over streamable HTTP."""
        return http_episode_client(self.mcp(env_name).server, episode_id)

    async def aclose(self) -> None:
        await self.http.aclose()


EpisodeFleet = Fleet | RemoteFleet
"""Where rollout envs play episodes: in this process, or on an `envforge serve` (same surface)."""


def open_episode_client(
    fleet: EpisodeFleet, env_name: str, episode_id: str
) -> AbstractAsyncContextManager[EpisodeClient]:
    """An MCP client bound to one episode of `fleet`, whichever kind it is."""
    if isinstance(fleet, RemoteFleet):
        return fleet.episode_client(env_name, episode_id)
    return episode_client(fleet, env_name, episode_id)
