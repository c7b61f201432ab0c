"""Connection-level limits for `envforge serve`: what uvicorn does not bound by itself.

uvicorn (h11) bounds the header size (`h11_max_incomplete_event_size`) and idle keep-alive time,
but not how long a client may take to send its request headers, nor how many sockets may be
open: idle sockets pile up until the process runs out of file descriptors, after which every
`accept()` fails and asyncio logs a traceback for each failure. Here:

- a connection cap, kept below the process's file-descriptor limit. At the cap, a new connection
  evicts the longest-idle connection (one with no request in flight); only when every connection
  is busy is the new one dropped. Idle sockets therefore cannot starve real clients.
- a cap per client address, below the total: past it a client's new connection evicts that
  client's own longest-idle one, or is dropped. Busy connections (a body trickling in, an SSE
  stream) cannot be evicted, so without it one client could hold every slot busy.
- a header read timeout: a connection that has not sent complete request headers within
  `header_timeout` seconds (from connect, or from the first byte of a keep-alive request) is closed.
- one rate-limited log line, without traceback, for resource exhaustion on `accept()`.

Body read time and size are bounded per request by `http_guard.HTTPGuard`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_FD_RESERVE = 64
"""Descriptors kept free for everything but client sockets (episodes' threads, logs, imports)."""


@dataclass(frozen=True)
class HTTPLimits:
    """The connection-level limits of one server, and how many legacy MCP sessions one client may
    hold open (`build_app` enforces that one: sessions are an app-level resource)."""

    max_connections: int = 4096
    header_timeout: float = 10.0
    keep_alive: float = 120.0
    max_header_bytes: int = 64 * 1024
    backlog: int = 512
    max_sessions_per_client: int = 1024
    max_connections_per_client: int | None = None
    """None: half the (effective) connection cap."""

    def effective_backlog(self) -> int:
        """`backlog`, at most a quarter of the descriptor limit.

        asyncio accepts up to `backlog` sockets per readiness event before any of their protocols
        runs (and can evict an idle connection), so that many descriptors must stay free on top of
        the connection cap.
        """
        soft = _descriptor_limit()
        return self.backlog if soft is None else max(8, min(self.backlog, soft // 4))

    def effective_max_connections(self) -> int:
        """`max_connections`, lowered to fit under the file-descriptor limit of this process with
        room for one accept burst and the process's own descriptors."""
        soft = _descriptor_limit()
        if soft is None:
            return self.max_connections
        return max(1, min(self.max_connections, soft - self.effective_backlog() - _FD_RESERVE))

    def effective_max_connections_per_client(self) -> int:
        """How many connections one client address may hold: never the whole cap."""
        cap = self.effective_max_connections()
        wanted = self.max_connections_per_client or cap // 2
        return max(1, min(wanted, cap - 1))


def _descriptor_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def guarded_protocol(limits: HTTPLimits) -> type[H11Protocol]:
    """An h11 protocol class enforcing `limits` (uvicorn takes the class as `http=`)."""
    cap = limits.effective_max_connections()
    per_client = limits.effective_max_connections_per_client()

    class Guarded(_GuardedH11Protocol):
        max_connections: ClassVar[int] = cap
        max_per_client: ClassVar[int] = per_client
        header_timeout: ClassVar[float] = limits.header_timeout

    return Guarded


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """Send each write at once (TCP_NODELAY). asyncio sets it only on sockets made with
    `IPPROTO_TCP`, and a socket bound for `serve_http` (proto 0) passes it on to every accepted
    one: a response written in pieces (headers, then body, then the end of a stream) then waits
    for the client's delayed ACK, ~40 ms a call."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _GuardedH11Protocol(H11Protocol):
    max_connections: ClassVar[int]
    max_per_client: ClassVar[int]
    header_timeout: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        _no_delay(transport)
        super().connection_made(transport)
        self._idle_since = time.monotonic()
        peer = self._peer()
        mine = [c for c in self.connections if isinstance(c, _GuardedH11Protocol) and c._peer() == peer]
        if len(mine) > self.max_per_client and not self._evict_idle(mine):
            self._drop()
            return
        if len(self.connections) > self.max_connections and not self._evict_idle(self.connections):
            self._drop()
            return
        self._arm_header_timer()

    def _peer(self) -> str | None:
        """The client's address (its port left out): what the per-client cap counts by."""
        return self.client[0] if self.client else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._idle():
            if self._header_timer is None:
                self._arm_header_timer()  # bytes of a next request are trickling in
        else:
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        self._idle_since = time.monotonic()
        super().on_response_complete()

    def _idle(self) -> bool:
        """No request in flight: before the first request's headers, or between requests."""
        return self.cycle is None or self.cycle.response_complete

    def _evict_idle(self, among: Iterable[object]) -> bool:
        """Close the longest-idle other connection `among` these; False when every one is busy."""
        idle = [
            c
            for c in among
            if c is not self
            and isinstance(c, _GuardedH11Protocol)
            and c._idle()
            and not c.transport.is_closing()
        ]
        if not idle:
            return False
        min(idle, key=lambda c: c._idle_since)._drop()
        return True

    def _drop(self) -> None:
        self._disarm_header_timer()
        if not self.transport.is_closing():
            self.transport.close()
        self.connections.discard(self)

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._idle() and not self.transport.is_closing():
            self.transport.close()


class ResourceErrorLogLimiter(logging.Filter):
    """Lets through one line per `interval` for out-of-resource errors, without the traceback.

    asyncio reports every failed `accept()` (EMFILE and friends) with a full traceback; under a
    descriptor flood that is megabytes a second. The first line of each interval says how many
    were suppressed since the last one.
    """

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._last = float("-inf")
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_resource_error(record):
            return True
        now = time.monotonic()
        if now - self._last < self.interval:
            self._suppressed += 1
            return False
        error = record.exc_info[1] if record.exc_info else None
        record.msg = "out of system resources (%s); %d similar errors suppressed in the last %.0f s"
        record.args = (error or record.getMessage(), self._suppressed, self.interval)
        record.exc_info = None
        record.exc_text = None
        self._last, self._suppressed = now, 0
        return True


def _is_resource_error(record: logging.LogRecord) -> bool:
    """An accept() that failed for lack of resources, or one of the retries asyncio schedules
    after each such failure (hundreds per second, which fail again once the socket is gone)."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, OSError) and error.errno in _RESOURCE_ERRNOS:
        return True
    message = str(record.msg)
    return "out of system resource" in message or "_start_serving" in message


def install_log_limiter(interval: float = 10.0) -> ResourceErrorLogLimiter:
    """Attach one limiter to the loggers that report accept() and connection failures."""
    limiter = ResourceErrorLogLimiter(interval)
    for name in ("asyncio", "uvicorn.error"):
        logging.getLogger(name).addFilter(limiter)
    return limiter


SHUTDOWN_GRACE_S = 4.0
"""How long `serve` shuts down gracefully after SIGTERM or SIGINT before the process exits anyway."""


def _exit_after(seconds: float, status: int) -> None:
    """Exit the process `seconds` from now whatever still runs.

    A graceful shutdown waits for requests in flight, and a request may wait on SQLite work that
    cannot be stopped at once (one step of a model-written statement, a state being built), or on
    a worker thread that the interpreter joins at exit: SIGTERM was once ignored for ten minutes.
    The timer is a daemon thread, so a shutdown that ends sooner never waits for it.
    """
    import threading

    timer = threading.Timer(seconds, os._exit, args=(status,))
    timer.daemon = True
    timer.start()


def serve_http(
    app: Any,
    *,
    host: str,
    port: int,
    limits: HTTPLimits,
    sock: socket.socket | None = None,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Run `app` under uvicorn with `limits` until interrupted.

    `sock`: a socket the caller bound already (so a busy port is its error to report, not a log line
    inside uvicorn); `on_listening` runs once the server accepts connections, and only then."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            _exit_after(SHUTDOWN_GRACE_S, 128 + sig)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and on_listening is not None:
                on_listening()

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=guarded_protocol(limits),
        # A fleet keeps many clients on pooled connections that sit idle between an agent's turns;
        # uvicorn's default 5 s keep-alive would close them under the client.
        timeout_keep_alive=int(limits.keep_alive),
        h11_max_incomplete_event_size=limits.max_header_bytes,
        backlog=limits.effective_backlog(),
        # uvicorn trusts X-Forwarded-For from loopback by default and rewrites the client address
        # with it, so any local process could name a new client per request and walk past every
        # per-client cap; the address a client is counted by is the peer's own
        proxy_headers=False,
    )
    install_log_limiter()  # after Config: it (re)configures uvicorn's loggers
    _Server(config).run(sockets=[sock] if sock is not None else None)
