"""A small client for one episode, in-process or over HTTP, that always says which episode it means.

The harness and `envforge replay` talk MCP to the fleet exactly as an agent would; this wrapper
only adds the episode id to every request's `_meta`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import mcp_types as types
from mcp import Client

from .fleet import Fleet
from .mcp_server import EPISODE_META_KEY, ERROR_META_KEY
from .runtime import ToolResult


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
async def http_episode_client(url: str, episode_id: str) -> AsyncIterator[EpisodeClient]:
    """A streamable-HTTP MCP client (e.g. on `/envs/<env>/episodes/<id>/mcp`) bound to `episode_id`."""
    async with Client(url) as client:
        yield EpisodeClient(client, episode_id)
