"""One URL for a fleet spread over N worker processes: every core of one machine.

`envforge serve` in one process is one event loop on one core. With `--workers N` it is instead:

- **N workers** (`http_worker`), each today's app (`http_app.build_app`) with its own `Fleet` on a
  private `127.0.0.1` port, reachable only with a private token that only the front holds. A
  worker names its episodes with its own prefix, `w<index>g<generation>-`, so an episode id says
  which process owns it and the front needs no table of episodes and no lock to route by it.
- **One front** (this module) that owns the public port and what must be checked once for the whole
  fleet: `HTTPGuard` (Host/Origin, body size and read time), the connection caps (`serve_http`), the
  public bearer token on the control plane, and the per-client cap on open episodes *counted across
  workers*: a client spread over N workers still gets its cap once, not N times.

Routing. `POST /control/episodes` places the new episode on the next live worker (round robin);
every later request that names an episode (`/control/episodes/<id>...`, `/envs/<env>/episodes/<id>/
mcp`, the user side `.../<id>/user/<key>/mcp`) goes to the worker its prefix names. The env-wide MCP
URL (`/envs/<env>/mcp`) goes by the legacy `Mcp-Session-Id` (which the front prefixes with the
worker's name on the way out), else by the episode named in the request's `_meta`, else round
robin. Responses are streamed through unbuffered, so an MCP SSE stream reaches its client event by
event. A path with a `.` or `..` segment is refused (400): the front routes on the path as sent and
the worker would get it with those segments resolved, i.e. another URL (a control one, say). An id
whose prefix names no worker is answered as the workers answer an unknown episode; one whose worker
has since been restarted answers 410 "episode lost: its worker exited".

Per-client caps. The front counts each client's open episodes (those it created through the front,
less those closed through it). Episodes also end by expiring or with their legacy session, which
only the worker sees, so a client at its cap is recounted from the workers' own listings before it
is refused: the count can be high, never low, and the refusal is exact. Legacy MCP sessions are
counted the same way: a request that opens one (handshake era, no `Mcp-Session-Id`, on any MCP URL)
holds a slot while it is served and its session holds it from the answer on; one ended by the
client's DELETE frees it, and a client at its cap is recounted from the workers' own tables
(`GET /control/sessions`, which names only the asking client's sessions) before it is refused.
Each worker enforces the whole cap too, as a backstop. Connections end at the front, so their
per-client cap (`serve_http`) counts every worker already. The episodes-in-all cap and each
client's MiB budget are split evenly over the workers (a worker's share is enforced there): a
client may get less than its cap of those, never more.

Workers. Each is supervised: when one exits, its episodes are lost (their clients get 410), it is
started again with the next generation (so no old id can reach the new process), and new episodes
are placed on it once it listens. A worker exits when the front's pipe to it closes.

Where workers run is a `Launcher`'s one job: `LocalLauncher` starts them as child processes of the
front; `RayLauncher` starts each inside a Ray actor on any node of a cluster (`serve --ray`); both
live in `launchers`. Placement (`_place`), the owner of an id (`_owner`) and forwarding
(`_forward`) take only a worker's address (`Running`), so routing, tokens and caps are the same
wherever the workers are.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import anyio
from anyio.abc import TaskStatus
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.errors import EpisodeNotFound
from ..runtime.mcp_server import CLIENT_SCOPE_KEY, EPISODE_META_KEY
from .http_app import Reservations, session_cap_refusal
from .http_guard import FORWARDED_CLIENT_HEADER, HTTPGuard, bearer_matches, check_token, is_loopback
from .http_worker import WorkerConfig
from .launchers import WORKER_START_TIMEOUT, Launcher, LocalLauncher, RayLauncher, Running

log = logging.getLogger(__name__)

# bounded: int() of a forged index of over 4300 digits raises (a 500 and a traceback per request)
_PREFIX = re.compile(r"^w(\d{1,6})g(\d{1,12})-")
_EPISODE_PATH = re.compile(r"^/(?:control/episodes|envs/[^/]+/episodes)/([^/]+)")
_ENV_MCP = re.compile(r"^/envs/[^/]+/mcp$")
_DROPPED = frozenset(
    {
        b"host",
        b"authorization",
        b"origin",
        FORWARDED_CLIENT_HEADER,
        b"content-length",
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"upgrade",
        b"proxy-authorization",
    }
)
_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade"})
_NOT_RELAYED = _HOP | {b"date", b"server"}
"""A worker's answer headers the front does not pass on: hop-by-hop ones, and those the front's own
server adds to every answer (relayed, each went out twice)."""


@dataclass
class _Worker:
    index: int
    generation: int = 0
    running: Running | None = None
    up: anyio.Event = field(default_factory=anyio.Event)
    restarts: int = 0

    @property
    def prefix(self) -> str:
        return f"w{self.index}g{self.generation}-"


def _json(body: Any, status: int) -> JSONResponse:
    return JSONResponse(body, status)


def _lost(episode_id: str) -> JSONResponse:
    return _json(
        {"error": f"episode lost: its worker exited ({episode_id!r}); create a new one"},
        410,
    )


class FleetFront:
    """The front's ASGI app (wrap it in `HTTPGuard`, as `build_front` does) and its workers."""

    def __init__(
        self,
        config: WorkerConfig,
        workers: int,
        *,
        token: str | None,
        max_episodes_per_client: int,
        max_sessions_per_client: int | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("--workers must be >= 1")
        self.config = config
        self.launcher = launcher or LocalLauncher()
        self.token = token
        self.max_episodes_per_client = max_episodes_per_client
        self.max_sessions_per_client = max_sessions_per_client
        self._sessions: dict[str, set[str]] = {}
        self._sessions_opening = Reservations()
        self.workers = [_Worker(i) for i in range(workers)]
        self._secret = config.token
        self._next = 0
        self._owned: dict[str, set[str]] = {}
        self._opening: Counter[str] = Counter()
        self._http: aiohttp.ClientSession | None = None

    # -- workers -------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start every worker, report ready once all listen, and keep them running."""
        # aiohttp, not httpx: httpx's pool scans every open connection on each request, ~4 ms a
        # call at 32 in flight (harness/openai_http.py measured the same), more than a worker's call
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, connect=30.0)
        session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )
        async with session as self._http:
            async with anyio.create_task_group() as tg:
                for worker in self.workers:
                    tg.start_soon(self._keep, worker)
                with anyio.fail_after(WORKER_START_TIMEOUT):
                    for worker in self.workers:
                        await worker.up.wait()
                task_status.started()

    async def _keep(self, worker: _Worker) -> None:
        """Run `worker`, and start it again (next generation) whenever it exits."""
        while True:

            def listening(running: Running) -> None:
                worker.running = running
                worker.up.set()

            code = await self.launcher.run(replace(self.config, episode_prefix=worker.prefix), listening)
            worker.up = anyio.Event()
            worker.running = None
            worker.generation += 1
            worker.restarts += 1
            log.warning("fleet worker %d exited (status %s); starting it again", worker.index, code)
            await anyio.sleep(min(5.0, 0.1 * worker.restarts))

    def _owner(self, episode_id: str) -> _Worker | JSONResponse:
        """The live worker that owns `episode_id`, or the answer for an id no live worker owns."""
        match = _PREFIX.match(episode_id)
        worker = self.workers[int(match[1])] if match and int(match[1]) < len(self.workers) else None
        if worker is None or match is None or int(match[2]) > worker.generation:
            return _json({"error": str(EpisodeNotFound(episode_id))}, 404)
        if int(match[2]) < worker.generation or not worker.up.is_set():
            return _lost(episode_id)
        return worker

    def _place(self) -> _Worker | None:
        """The next live worker, round robin."""
        for _ in range(len(self.workers)):
            worker = self.workers[self._next % len(self.workers)]
            self._next += 1
            if worker.up.is_set():
                return worker
        return None

    # -- requests ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if any(part in (".", "..") for part in path.split("/")):
            # routed here as one URL, it would reach the worker as another: the HTTP client
            # removes dot segments, so `/envs/e/episodes/<id>/../../../../control/episodes` (an MCP
            # URL here, no public token asked) would arrive at the worker's control plane
            await _json({"error": "a path with '.' or '..' segments is refused"}, 400)(scope, receive, send)
            return
        if path == "/healthz":
            up = sum(w.up.is_set() for w in self.workers)
            await _json({"ok": True, "workers": len(self.workers), "up": up}, 200)(scope, receive, send)
            return
        if path.startswith("/control/"):
            if self.token is not None and not bearer_matches(scope, self.token):
                await _json({"error": "missing, malformed or wrong bearer token"}, 401)(scope, receive, send)
                return
            await self._control(scope, receive, send)
            return
        found = _EPISODE_PATH.match(path)
        if found:
            owner = self._owner(found[1])
            if isinstance(owner, JSONResponse):
                await owner(scope, receive, send)
            else:
                await self._mcp(owner, scope, receive, send)
            return
        if _ENV_MCP.match(path):
            await self._env_mcp(scope, receive, send)
            return
        await _json({"error": f"no route {path}"}, 404)(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self.run)
                await send({"type": "lifespan.startup.complete"})
                await receive()
                tg.cancel_scope.cancel()
        except Exception as exc:  # a worker that never came up
            await send(
                {"type": "lifespan.startup.failed", "message": f"fleet workers did not start: {exc!r}"}
            )
            return
        await send({"type": "lifespan.shutdown.complete"})

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/control/episodes" and method == "POST":
            await self._create(scope, receive, send)
        elif path == "/control/episodes" and method == "GET":
            rows = [row for listing in await self._gather("/control/episodes") for row in listing["episodes"]]
            await _json({"episodes": rows}, 200)(scope, receive, send)
        elif path == "/control/stats":
            totals: Counter[str] = Counter()
            for counts in await self._gather("/control/stats"):
                totals.update(counts)
            body = {k: totals[k] for k in ("open_episodes", "created", "expired")}
            fleet = {
                "workers": len(self.workers),
                "worker_restarts": sum(w.restarts for w in self.workers),
                "worker_pids": [w.running.pid if w.running else None for w in self.workers],
                "worker_nodes": [w.running.node if w.running else None for w in self.workers],
                "worker_addresses": [w.running.netloc if w.running else None for w in self.workers],
            }
            await _json(body | fleet, 200)(scope, receive, send)
        elif (found := _EPISODE_PATH.match(path)) is not None:
            owner = self._owner(found[1])
            if isinstance(owner, JSONResponse):
                await owner(scope, receive, send)
                return
            status = await self._forward(owner, scope, receive, send)
            if method == "DELETE" and status == 200:
                for ids in self._owned.values():
                    ids.discard(found[1])
        else:
            worker = self._place()
            if worker is None:
                await _json({"error": "no fleet worker is running; try again shortly"}, 503)(
                    scope, receive, send
                )
                return
            await self._forward(worker, scope, receive, send)

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        client: str = scope.get(CLIENT_SCOPE_KEY, "")
        cap = self.max_episodes_per_client
        if self._held(client) >= cap:
            await self._recount(client)
        held = self._held(client)
        if held >= cap:
            message = (
                f"client {client} has {held} episodes open (limit {cap} per client, across every worker); "
                "close one first"
            )
            await _json({"error": message}, 429)(scope, receive, send)
            return
        worker = self._place()
        if worker is None:
            await _json({"error": "no fleet worker is running; try again shortly"}, 503)(scope, receive, send)
            return
        self._opening[client] += 1
        try:
            chunks: list[bytes] = []
            status = await self._forward(worker, scope, receive, send, keep=chunks)
        finally:
            self._opening[client] -= 1
            if self._opening[client] <= 0:
                del self._opening[client]
        if status == 201:
            episode_id = json.loads(b"".join(chunks))["episode_id"]
            self._owned.setdefault(client, set()).add(episode_id)

    def _held(self, client: str) -> int:
        return len(self._owned.get(client, ())) + self._opening[client]

    async def _recount(self, client: str) -> None:
        """`client`'s open episodes as the live workers list them (expired ones are gone there),
        and those created through the front while they were listed (a worker listed before one
        of them was made lacks it: without these, concurrent creates got past the cap)."""
        before = set(self._owned.get(client, ()))
        ids: set[str] = set()
        for listing in await self._gather("/control/episodes"):
            ids.update(row["episode_id"] for row in listing["episodes"] if row.get("owner") == client)
        ids |= self._owned.get(client, set()) - before
        if ids:
            self._owned[client] = ids
        else:
            self._owned.pop(client, None)

    def _live(self) -> list[_Worker]:
        return [w for w in self.workers if w.up.is_set()]

    async def _gather(self, path: str) -> list[dict[str, Any]]:
        """`GET path` on every live worker; one that has just exited (not yet restarted) has nothing."""
        return [answer for _, answer in await self._gather_from(path)]

    async def _gather_from(
        self, path: str, client: str | None = None
    ) -> list[tuple[_Worker, dict[str, Any]]]:
        """`_gather`, each answer with the worker that gave it; asked as `client` when one is named."""
        assert self._http is not None
        headers = {"authorization": f"Bearer {self._secret}"}
        if client is not None:
            headers[FORWARDED_CLIENT_HEADER.decode("latin-1")] = client
        found = []
        for worker in self._live():
            running = worker.running
            if running is None:
                continue
            try:
                async with self._http.get(f"http://{running.netloc}{path}", headers=headers) as answer:
                    if answer.status == 200:
                        found.append((worker, await answer.json()))
            except aiohttp.ClientError:
                continue
        return found

    # -- legacy MCP sessions, counted per client across workers ---------------------------------

    def _sessions_held(self, client: str) -> int:
        return len(self._sessions.get(client, ())) + self._sessions_opening[client]

    async def _recount_sessions(self, client: str) -> None:
        """`client`'s open sessions as the live workers' own tables have them (idled-out ones are
        gone), and those opened while they were listed (as `_recount` does for episodes)."""
        before = set(self._sessions.get(client, ()))
        ids = {
            worker.prefix + session
            for worker, listing in await self._gather_from("/control/sessions", client)
            for session in listing.get("sessions", [])
        }
        ids |= self._sessions.get(client, set()) - before
        if ids:
            self._sessions[client] = ids
        else:
            self._sessions.pop(client, None)

    async def _mcp(
        self, worker: _Worker, scope: Scope, receive: Receive, send: Send, *, body: bytes | None = None
    ) -> None:
        """Forward an MCP request, holding the client to its session cap across every worker."""
        client: str = scope.get(CLIENT_SCOPE_KEY, "")
        headers = Headers(scope=scope)
        session, version = headers.get("mcp-session-id"), headers.get("mcp-protocol-version")
        cap = self.max_sessions_per_client
        if session:
            status = await self._forward(worker, scope, receive, send, body=body)
            if scope["method"] == "DELETE" and status == 200:
                self._sessions.get(client, set()).discard(session)
            return
        stateless = version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS
        if cap is None or not client or stateless:  # no session to open (as the workers decide it)
            await self._forward(worker, scope, receive, send, body=body)
            return
        if self._sessions_held(client) >= cap:
            await self._recount_sessions(client)
        held = self._sessions_held(client)
        if held >= cap:
            await session_cap_refusal(client, held, cap, ", across every worker")(scope, receive, send)
            return
        release = self._sessions_opening.take(client)

        def started(status: int, out: list[tuple[bytes, bytes]]) -> None:
            """The session holds its slot from its answer on (not the reservation too: that would
            refuse a client opening its next one the moment this answer arrives)."""
            opened = [v for k, v in out if k == b"mcp-session-id"] if status < 400 else []
            for value in opened:
                self._sessions.setdefault(client, set()).add(value.decode("latin-1"))
            release()

        try:
            await self._forward(worker, scope, receive, send, body=body, on_start=started)
        finally:
            release()

    async def _env_mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An env-wide MCP URL: by legacy session, else by the episode in `_meta`, else round robin."""
        session = Headers(scope=scope).get("mcp-session-id")
        if session:
            match = _PREFIX.match(session)
            target = self._owner(match[0] + "0") if match else None
            if not isinstance(target, _Worker):
                message = f"session {session!r} lost: its worker exited, or it never existed"
                error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
                await _json(error, 404)(scope, receive, send)
                return
            await self._mcp(target, scope, receive, send)
            return
        body = await _read_body(receive)
        worker: _Worker | JSONResponse | None = None
        episode_id = _meta_episode(body)
        if episode_id is not None:
            worker = self._owner(episode_id)
            if isinstance(worker, JSONResponse) and worker.status_code == 404:
                worker = None  # the worker answers an unknown episode in the call's own result
        if worker is None:
            worker = self._place()
        if worker is None:
            await _json({"error": "no fleet worker is running; try again shortly"}, 503)(scope, receive, send)
        elif isinstance(worker, JSONResponse):
            await worker(scope, receive, send)
        else:
            await self._mcp(worker, scope, receive, send, body=body)

    async def _forward(
        self,
        worker: _Worker,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        body: bytes | None = None,
        keep: list[bytes] | None = None,
        on_start: Callable[[int, list[tuple[bytes, bytes]]], None] | None = None,
    ) -> int:
        """Send the request to `worker` as the front's client, stream the answer back; its status.
        `on_start(status, headers)` sees the answer's head as it goes out."""
        assert self._http is not None
        running, prefix = worker.running, worker.prefix.encode()  # this generation's, read once
        if body is None:
            body = await _read_body(receive)
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
        headers = [(k, _strip_prefix(v) if k == b"mcp-session-id" else v) for k, v in headers]
        headers += [
            (b"host", running.netloc.encode() if running else b""),
            (b"authorization", f"Bearer {self._secret}".encode()),
            (FORWARDED_CLIENT_HEADER, scope.get(CLIENT_SCOPE_KEY, "").encode()),
        ]
        sent = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        try:
            if running is None:
                raise aiohttp.ClientConnectionError("the worker is not running")
            url = f"http://{running.netloc}" + scope["raw_path"].decode("latin-1")
            if scope.get("query_string"):
                url += "?" + scope["query_string"].decode("latin-1")
            response = await self._http.request(
                scope["method"], url, headers=sent, data=body, allow_redirects=False
            )
        except aiohttp.ClientError:
            answer = _json({"error": f"episode lost: its worker exited (worker {worker.index})"}, 410)
            await answer(scope, receive, send)
            return 410
        try:
            out = [
                (k, prefix + v if k == b"mcp-session-id" else v)
                for k, v in ((k.lower(), v) for k, v in response.raw_headers)
                if k not in _NOT_RELAYED
            ]
            if on_start is not None:
                on_start(response.status, out)
            await send({"type": "http.response.start", "status": response.status, "headers": out})
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
                try:
                    async for chunk in response.content.iter_any():
                        if keep is not None:
                            keep.append(chunk)
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except aiohttp.ClientError:
                    pass  # the worker went away mid-answer: end what was sent
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        finally:
            if response.content.at_eof():
                response.release()  # its connection goes back to the pool
            else:
                response.close()  # a stream cut short: its connection is useless
        return response.status


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Stop forwarding (an SSE stream may sit idle for long) once the client has gone."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _strip_prefix(session: bytes) -> bytes:
    match = _PREFIX.match(session.decode("latin-1"))
    return session[match.end() :] if match else session


def _meta_episode(body: bytes) -> str | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    found = meta.get(EPISODE_META_KEY) if isinstance(meta, dict) else None
    return found if isinstance(found, str) else None


def build_front(
    env_dirs: Sequence[str],
    workers: int,
    *,
    host: str = "127.0.0.1",
    token: str | None = None,
    max_episodes: int = 4096,
    max_episodes_per_client: int = 1024,
    max_episode_bytes_per_client: int = 4096 << 20,
    max_sessions_per_client: int = 1024,
    ttl: float = 1800.0,
    max_body_bytes: int = 16 << 20,
    body_timeout: float = 30.0,
    body_deadline: float = 120.0,
    sqlite_work_bytes: int | None = None,
    ray_address: str | None = None,
) -> tuple[ASGIApp, FleetFront]:
    """The front app for `workers` processes serving `env_dirs`, guarded as one fleet's app is.

    The caps are the fleet's totals; see the module docstring for which are split over workers.
    With `ray_address` ("auto", or a cluster's HOST:PORT) each worker runs in a Ray actor on some node of
    that cluster (joined here: a ValueError says why not); else it is a child process on loopback."""
    check_token(token)
    if not is_loopback(host) and not token:
        raise ValueError(
            f"binding to {host or 'every interface'} exposes the control plane: pass a bearer token"
        )
    config = WorkerConfig(
        env_dirs=[str(d) for d in env_dirs],
        episode_prefix="",
        token=secrets.token_urlsafe(32),
        max_episodes=max(1, max_episodes // workers),
        max_episodes_per_client=max_episodes_per_client,
        max_episode_bytes_per_client=max(1, max_episode_bytes_per_client // workers),
        max_sessions_per_client=max_sessions_per_client,
        ttl=ttl,
        max_body_bytes=max_body_bytes,
        body_timeout=body_timeout,
        body_deadline=body_deadline,
        sqlite_work_bytes=sqlite_work_bytes,
    )
    launcher = RayLauncher(ray_address, workers) if ray_address is not None else None
    front = FleetFront(
        config,
        workers,
        token=token,
        max_episodes_per_client=max_episodes_per_client,
        max_sessions_per_client=max_sessions_per_client,
        launcher=launcher,
    )
    app = HTTPGuard(
        front,
        loopback=is_loopback(host),
        token=token,
        max_body_bytes=max_body_bytes,
        body_timeout=body_timeout,
        body_deadline=body_deadline,
    )
    return app, front
