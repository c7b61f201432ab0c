"""Serving envs over MCP from Python: a fleet behind one HTTP app, or one env over stdio.

`envforge serve` is this module plus its flags and its announcements. The server's own pieces
(`Fleet`, `build_app`, `HTTPLimits`, `serve_http`) stay the reference; what this adds is what
every caller would otherwise assemble and check by hand: the limits a public fleet needs, each
checked before any env is served (a cap of 0 would refuse every client, a timeout of 0 every
request), and the listening socket bound first, so that a busy port is the caller's error to
report before anything is announced, not a log line inside uvicorn.
"""

from __future__ import annotations

import functools
import os
import socket
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import anyio
from starlette.applications import Starlette

from envforge.server import Environment, Fleet, HTTPLimits, build_app, serve_http, serve_stdio

from .settings import SettingError

MIB = 1024 * 1024


def sqlite_work_bytes(sqlite_work_mib: int) -> int:
    """SQLite's hard heap limit for the server's statements beyond the open episodes' databases,
    in bytes; at least 1 MiB (0 would lift the bound on model-written SQL's memory)."""
    if sqlite_work_mib < 1:
        raise SettingError("{sqlite_work_mib} must be >= 1", "sqlite_work_mib")
    return sqlite_work_mib * MIB


@dataclass(frozen=True)
class ServeLimits:
    """What an HTTP fleet bounds, per server and per client (a client: its bearer token, else its
    address); the defaults are `envforge serve`'s. Raises `SettingError` on a cap below 1 or a
    timeout that is not positive."""

    max_episodes: int = 4096
    max_episodes_per_client: int = 1024
    max_episode_mib_per_client: int = 4096
    """Each episode counts twice its starting database and 1 MiB to grow."""
    max_sessions_per_client: int = 1024
    """Legacy MCP sessions (not episodes) one client may hold open."""
    ttl: float = 1800.0
    """Seconds an idle episode lives."""
    max_connections: int = 4096
    """Also kept under the file-descriptor limit."""
    max_connections_per_client: int | None = None
    """None: half of `max_connections`."""
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    """Seconds a client may stall while sending a body."""
    body_deadline: float = 120.0
    """Seconds a client may take to send a whole body, however it trickles."""
    max_body_bytes: int = 16 << 20
    sqlite_work_mib: int = 256

    def __post_init__(self) -> None:
        sqlite_work_bytes(self.sqlite_work_mib)
        counts = (
            "max_episodes",
            "max_episodes_per_client",
            "max_episode_mib_per_client",
            "max_sessions_per_client",
            "max_connections",
            "max_connections_per_client",
            "max_body_bytes",
        )
        values = [getattr(self, name) for name in counts]
        if min(v for v in values if v is not None) < 1:
            *most, last = (f"{{{name}}}" for name in counts)
            raise SettingError(f"{', '.join(most)} and {last} must be >= 1", *counts)
        if min(self.header_timeout, self.body_timeout, self.body_deadline) <= 0:
            raise SettingError(
                "{header_timeout}, {body_timeout} and {body_deadline} must be positive",
                "header_timeout",
                "body_timeout",
                "body_deadline",
            )

    def http_limits(self) -> HTTPLimits:
        """The connection-level part, as the server's `serve_http` and `build_app` take it."""
        return HTTPLimits(
            max_connections=self.max_connections,
            header_timeout=self.header_timeout,
            max_sessions_per_client=self.max_sessions_per_client,
            max_connections_per_client=self.max_connections_per_client,
        )


@dataclass(frozen=True)
class HttpServer:
    """A fleet's app with its socket already bound: `port` is the real one (asked 0, a free one)."""

    app: Starlette
    fleet: Fleet
    sock: socket.socket
    host: str
    port: int
    limits: ServeLimits

    def url(self, env: str) -> str:
        """Where agents reach `env`'s MCP server."""
        return f"http://{self.host}:{self.port}/envs/{env}/mcp"

    def run(self, on_listening: Callable[[], None] | None = None) -> None:
        """Serve until interrupted; `on_listening` runs once connections are accepted, and only then."""
        serve_http(
            self.app,
            host=self.host,
            port=self.port,
            limits=self.limits.http_limits(),
            sock=self.sock,
            on_listening=on_listening,
        )


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (port 0: a free one) for uvicorn to listen on; raises
    `OSError` for a busy port or an address this machine does not have."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock


def http_server(
    envs: Sequence[Environment],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    limits: ServeLimits | None = None,
) -> HttpServer:
    """Every env of `envs` in one app (`/envs/<env>/mcp`, the control plane under `/control/`),
    bound to `host:port` and ready to `run`.

    Binding off loopback needs `token` (`ValueError`); SQLite without a hard heap limit cannot
    bound model SQL's memory (`RuntimeError`); a busy port or a bad address is an `OSError`."""
    limits = limits or ServeLimits()
    fleet = Fleet(
        list(envs),
        max_episodes=limits.max_episodes,
        ttl_seconds=limits.ttl,
        max_episodes_per_client=limits.max_episodes_per_client,
        max_episode_bytes_per_client=limits.max_episode_mib_per_client * MIB,
        sqlite_work_bytes=sqlite_work_bytes(limits.sqlite_work_mib),
    )
    app = build_app(
        fleet,
        host=host,
        token=token,
        max_body_bytes=limits.max_body_bytes,
        body_timeout=limits.body_timeout,
        body_deadline=limits.body_deadline,
        limits=limits.http_limits(),
    )
    sock = listening_socket(host, port)
    return HttpServer(app, fleet, sock, host, sock.getsockname()[1], limits)


def launched_over_pipes(stream: IO[Any] | None = None) -> bool:
    """Whether `stream` (default `sys.stdin`) is a pipe or a socket: how an MCP client launches a
    stdio server. A stream with no file behind it (a test runner's stand-in) is not one.

    Launchers differ in what they pass on: the MCP Inspector takes `--transport` as its own option,
    so `serve ENV --transport stdio` reaches envforge as `serve ENV`. A terminal, `/dev/null` (a
    server started in the background or by a service manager) or a file is not a client talking,
    so those keep the HTTP default."""
    try:
        mode = os.fstat((sys.stdin if stream is None else stream).fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def serve_env_stdio(env: Environment, *, sqlite_work_mib: int = 256) -> None:
    """Serve one env with one episode over stdio until stdin closes: what a desktop client launches."""
    anyio.run(functools.partial(serve_stdio, env, sqlite_work_bytes=sqlite_work_bytes(sqlite_work_mib)))
