"""An MCP client launches `envforge` as a stdio server, and launchers differ in what flags they pass
on: the MCP Inspector takes `--transport` as its own option, so `serve ENV --transport stdio`
reached envforge as `serve ENV`, which fell back to HTTP and died on a busy port ("Connection
closed"). Each test launches the server exactly as a client does, through the MCP SDK's
`stdio_client`, and talks to it."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from support.paths import ENVS, REPO

ENVFORGE = str(Path(sys.executable).parent / "envforge")


@contextmanager
def port_8000_busy() -> Iterator[None]:
    """Hold 127.0.0.1:8000 (or leave it to whoever already holds it): the HTTP fallback's port."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 8000))
        sock.listen()
    except OSError:
        pass  # already busy, which is the case under test
    try:
        yield
    finally:
        sock.close()


def talk(command: str, args: list[str]) -> tuple[list[str], str]:
    """Launch `command args` as an MCP client would; its tool names and one read call's text."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    async def main() -> tuple[list[str], str]:
        params = StdioServerParameters(command=command, args=args, env=env, cwd=str(REPO))
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                result = await session.call_tool("search_products", {})
                text = "".join(getattr(c, "text", "") for c in result.content)
                return [t.name for t in tools.tools], text

    return anyio.run(main)


def test_a_launcher_that_eats_the_transport_flag_still_gets_stdio() -> None:
    with port_8000_busy():
        names, text = talk(ENVFORGE, ["serve", str(ENVS / "retail_orders")])
    assert "place_order" in names and "search_products" in names
    assert text  # a real answer from the env's own database


def test_the_dedicated_mcp_command_serves_stdio_with_no_flags() -> None:
    with port_8000_busy():
        names, text = talk(ENVFORGE, ["mcp", str(ENVS / "retail_orders")])
    assert "cancel_order" in names and text


def readme_desktop_config() -> dict[str, Any]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Connecting an MCP client", 1)[1]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block, "README's desktop-client config block is missing"
    config: dict[str, Any] = json.loads(block.group(1))["mcpServers"]["retail_orders"]
    return config


def test_the_readmes_desktop_config_launches_and_answers() -> None:
    config = readme_desktop_config()
    command = str(config["command"]).replace("/path/to/envforge", str(REPO))
    args = [str(a).replace("/path/to/envforge", str(REPO)) for a in config["args"]]
    if not Path(command).exists():
        pytest.skip(f"{command} is not installed here")
    with port_8000_busy():
        names, text = talk(command, args)
    assert "place_order" in names and text
    # and the same config with every `--flag value` pair a launcher might take dropped
    flagged = {i for i, a in enumerate(args) if a.startswith("--")}
    bare = [a for i, a in enumerate(args) if i not in flagged and i - 1 not in flagged]
    with port_8000_busy():
        names, _ = talk(command, bare)
    assert "place_order" in names


def test_only_a_pipe_or_socket_reads_as_a_launching_client(tmp_path: Path) -> None:
    import io
    import subprocess

    from envforge import launched_over_pipes

    read_end, write_end = os.pipe()
    with os.fdopen(read_end) as pipe, os.fdopen(write_end, "w"), open(os.devnull) as null:
        assert launched_over_pipes(pipe)
        assert not launched_over_pipes(null)  # started in the background, or by a service manager
    (tmp_path / "f").write_text("")
    with open(tmp_path / "f") as file:
        assert not launched_over_pipes(file)
    assert not launched_over_pipes(io.StringIO())  # a test runner's stand-in for stdin
    # `serve` with stdin from /dev/null (a background job) keeps the HTTP default: on a busy port 8000
    # it says so, where a stdio server would have read EOF and exited quietly
    with port_8000_busy():
        done = subprocess.run(
            [ENVFORGE, "serve", str(ENVS / "gym")],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2 and "cannot listen on 127.0.0.1:8000" in done.stderr, done.stderr
