"""A small client for one episode, in-process or over HTTP, that always says which episode it means.

The harness and `envforge replay` talk MCP to the fleet exactly as an agent would; this wrapper
only adds the episode id to every request's `_meta`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, nullcontext
from typing import Any, cast

import mcp_types as types
from mcp import Client
from pydantic import TypeAdapter

from ..runtime.calls import ToolResult
from ..runtime.fleet import Fleet
from ..runtime.mcp_server import EPISODE_META_KEY, ERROR_META_KEY, EnvUserMCPServer


class EpisodeClient:
    """MCP calls bound to one episode."""

    def __init__(self, client: Client, episode_id: str) -> None:
        self.client = client
        self.episode_id = episode_id
        # mcp types `_meta` as an open TypedDict (PEP 728 extra items), which mypy cannot read yet
        self._meta = cast(types.RequestParamsMeta, {EPISODE_META_KEY: episode_id})

    async def list_tools(self) -> list[types.Tool]:
        return (await self.client.list_tools()).tools

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        result = await self.client.call_tool(name, arguments or {}, meta=self._meta)
        text = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
        return result_from_mcp(text, bool(result.is_error), result.meta)


def result_from_mcp(text: str, is_error: bool, meta: dict[str, Any] | None) -> ToolResult:
    """A `ToolResult` from an MCP result: the kind from `_meta` (`envforge/error`), else `refused`
    for an error (a server that does not say) and `ok` otherwise."""
    if not is_error:
        return ToolResult(text, False)
    kind = (meta or {}).get(ERROR_META_KEY)
    return ToolResult(text, True, kind if kind in ("refused", "invalid", "env_error") else "refused")


@asynccontextmanager
async def episode_client(fleet: Fleet, env_name: str, episode_id: str) -> AsyncIterator[EpisodeClient]:
    """An in-process MCP client on `env_name`'s server, bound to `episode_id`."""
    async with Client(fleet.mcp(env_name).server) as client:
        yield EpisodeClient(client, episode_id)


@asynccontextmanager
async def user_episode_client(fleet: Fleet, env_name: str, episode_id: str) -> AsyncIterator[EpisodeClient]:
    """An in-process MCP client on the user side of `episode_id` (dual control): the user's tools
    only, in that episode only (over HTTP: `http_episode_client` on its `user_mcp_path`)."""
    fleet.env(env_name)
    async with Client(EnvUserMCPServer(fleet, env_name, default_episode_id=episode_id).server) as client:
        yield EpisodeClient(client, episode_id)


class EnvClients:
    """One in-process MCP client per env of `fleet`, shared by all of that env's episodes.

    An episode needs no session of its own: every request names its episode in `_meta`, and the
    server's tool listing is the env's (listed once here, see `_ListedEpisodeClient`). A client per
    episode paid a handshake, a `tools/list` and the validation of its (large) result per trial:
    about 2 ms of the harness's CPU a trial. Concurrent requests on one session are fine: the
    in-process dispatcher tracks each request by its own id. Enter and exit it in one task (the
    clients hold task groups), around the tasks that use it.
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._clients: dict[str, Client] = {}
        self._listings: dict[str, bytes] = {}
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> EnvClients:
        async with AsyncExitStack() as stack:
            for name in self.fleet.envs:
                client = await stack.enter_async_context(Client(self.fleet.mcp(name).server))
                self._clients[name] = client
                # listed once through the shared session (which keeps the output schemas it checks
                # call results against); each episode then gets its own copy from this JSON
                self._listings[name] = _TOOL_LIST.dump_json((await client.list_tools()).tools, by_alias=True)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._clients.clear()
        await self._stack.aclose()

    def episode(self, env_name: str, episode_id: str) -> AbstractAsyncContextManager[EpisodeClient]:
        """`env_name`'s shared client bound to `episode_id` (leaving the context closes nothing)."""
        client = _ListedEpisodeClient(self._clients[env_name], episode_id, self._listings[env_name])
        return nullcontext(client)


_TOOL_LIST = TypeAdapter(list[types.Tool])


class _ListedEpisodeClient(EpisodeClient):
    """An `EpisodeClient` on a shared session whose `list_tools` answers from the env's listing,
    fetched once (an in-process env server's tools never change): a fresh copy per call, so no
    caller can change another's, for a twentieth of a `tools/list` round trip's CPU."""

    def __init__(self, client: Client, episode_id: str, listing: bytes) -> None:
        super().__init__(client, episode_id)
        self._listing = listing

    async def list_tools(self) -> list[types.Tool]:
        return _TOOL_LIST.validate_json(self._listing)


@asynccontextmanager
async def http_episode_client(url: str, episode_id: str) -> AsyncIterator[EpisodeClient]:
    """A streamable-HTTP MCP client (e.g. on `/envs/<env>/episodes/<id>/mcp`) bound to `episode_id`."""
    async with Client(url) as client:
        yield EpisodeClient(client, episode_id)
