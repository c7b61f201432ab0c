"""One worker of a multi-process fleet (`http_front`): today's HTTP app on a private port.

Run as `python -m envforge.server.transports.http_worker` (`worker_command`), its config as the
first line of its stdin, by the front, or on another machine by the front's Ray actor (`launchers`),
never by hand. It serves its own `Fleet` (episode ids start with the prefix the front gave it, so
the front routes by id alone) on `config.host` (loopback, or its node's address under Ray), answers
only requests that carry the front's private token (every one the front forwards does; a client
that finds the worker's address cannot go round the front's guard and caps), and takes the client
the front names (`http_guard.FORWARDED_CLIENT_HEADER`) for its per-client counts. It prints its
port as one line on stdout once it listens, and exits when its stdin closes: a front (or actor)
that dies, even by SIGKILL, leaves no worker behind. The config comes on stdin, not the command
line, because it holds the private token and every local user can read every process's arguments.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from dataclasses import asdict, dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..runtime.fleet import Fleet
from .http_app import build_app
from .http_guard import bearer_matches
from .http_limits import HTTPLimits, serve_http


@dataclass(frozen=True)
class WorkerConfig:
    """What the front tells a worker; the caps are this worker's share (`http_front` splits them)."""

    env_dirs: list[str]
    episode_prefix: str
    token: str
    max_episodes: int
    max_episodes_per_client: int
    max_episode_bytes_per_client: int
    max_sessions_per_client: int
    ttl: float
    max_body_bytes: int
    body_timeout: float
    body_deadline: float
    sqlite_work_bytes: int | None
    host: str = "127.0.0.1"

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def worker_command() -> list[str]:
    """The command line that runs one worker (in this Python, whichever machine); write
    `worker_stdin(config)` to its stdin first, then hold the pipe open for as long as it should run."""
    return [sys.executable, "-m", "envforge.server.transports.http_worker"]


def worker_stdin(config: WorkerConfig) -> bytes:
    """What a worker reads first on stdin: its config, one line (it holds the private token)."""
    return config.to_json().encode() + b"\n"


class _FrontOnly:
    """Refuse every request without the front's private token (403), MCP URLs included."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not bearer_matches(scope, self.token):
            refused = JSONResponse({"error": "a fleet worker answers its front only"}, 403)
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _exit_when_orphaned() -> None:
    """Exit as soon as stdin (a pipe from the front) reaches its end."""

    def watch() -> None:
        while sys.stdin.buffer.read(4096):
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def main() -> None:
    config = WorkerConfig(**json.loads(sys.stdin.buffer.readline()))
    _exit_when_orphaned()
    fleet = Fleet.from_dirs(
        config.env_dirs,
        max_episodes=config.max_episodes,
        ttl_seconds=config.ttl,
        max_episodes_per_client=config.max_episodes_per_client,
        max_episode_bytes_per_client=config.max_episode_bytes_per_client,
        sqlite_work_bytes=config.sqlite_work_bytes,
        episode_prefix=config.episode_prefix,
    )
    app = build_app(
        fleet,
        host=config.host,
        token=config.token,
        max_body_bytes=config.max_body_bytes,
        body_timeout=config.body_timeout,
        body_deadline=config.body_deadline,
        limits=HTTPLimits(max_sessions_per_client=config.max_sessions_per_client),
        trust_forwarded=True,
    )
    sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((config.host, 0))
    port = sock.getsockname()[1]

    def listening() -> None:
        sys.stdout.write(f"{port}\n")
        sys.stdout.flush()

    # every connection comes from the front (one address): no per-address cap below the total
    limits = HTTPLimits(max_connections_per_client=HTTPLimits().effective_max_connections() - 1)
    front_only = _FrontOnly(app, config.token)
    serve_http(front_only, host=config.host, port=port, limits=limits, sock=sock, on_listening=listening)


if __name__ == "__main__":
    main()
