"""Serve one env over stdio: one process, one episode — what desktop MCP clients launch."""

from __future__ import annotations

from mcp.server.stdio import stdio_server

from ..runtime.fleet import Fleet
from ..runtime.loader import Environment
from ..runtime.mcp_server import EnvMCPServer


async def serve_stdio(env: Environment, *, sqlite_work_bytes: int | None = None) -> None:
    """Run until stdin closes; every call goes to the process's single episode.

    `sqlite_work_bytes`: SQLite's heap bound (`Fleet`)."""
    fleet = Fleet([env], max_episodes=4, sqlite_work_bytes=sqlite_work_bytes)
    episode = await fleet.create_episode(env.name)
    server = EnvMCPServer(fleet, env.name, default_episode_id=episode.id).server
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await fleet.aclose()
