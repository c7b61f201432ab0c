"""A fleet: several environments, one episode store, and an MCP server per environment.

This is the in-process API that the harness, the synthesiser and the tests use; the HTTP app
(`http_app.py`) and stdio (`stdio.py`) are thin transports over it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio

from ..core import sqlheap
from ..core.state import ExportedState, State, state_hash
from ..core.tooldef import CallSide
from ..sandbox.schema_host import STATE_DATABASE_MAX_BYTES, DatabaseTooLarge, build_state_bounded
from .calls import ToolResult, execute
from .episodes import Episode, EpisodeStore
from .loader import Environment, load_env
from .mcp_server import EnvMCPServer, EnvUserMCPServer

STATE_BUILDS_PER_CLIENT = 2
"""How many of one client's states may be built into databases at once (the rest wait their turn)."""


class Fleet:
    """Environments served together; episodes of any of them live in one bounded store."""

    def __init__(
        self,
        envs: Iterable[Environment],
        *,
        max_episodes: int = 4096,
        ttl_seconds: float = 1800.0,
        max_episodes_per_client: int | None = None,
        max_episode_bytes_per_client: int | None = None,
        sqlite_work_bytes: int | None = None,
        episode_prefix: str = "",
    ) -> None:
        """`sqlite_work_bytes`: bound SQLite's heap in this whole process (`sqlheap`) to what the
        fleet's episodes hold plus this much working memory for statements; for the serving
        process only (`envforge serve`), since the limit applies to every connection it has.
        Raises `sqlheap.HeapLimitUnavailable` when SQLite has no hard heap limit."""
        self.envs: dict[str, Environment] = {}
        for env in envs:
            if env.name in self.envs:
                raise ValueError(f"two environments are named {env.name!r}")
            self.envs[env.name] = env
        self.store = EpisodeStore(
            max_episodes=max_episodes,
            ttl_seconds=ttl_seconds,
            max_per_owner=max_episodes_per_client,
            max_bytes_per_owner=max_episode_bytes_per_client,
            id_prefix=episode_prefix,
        )
        self._servers: dict[str, EnvMCPServer] = {}
        self._user_servers: dict[str, EnvUserMCPServer] = {}
        self._user_secret = secrets.token_bytes(32)
        self._builds: dict[str | None, anyio.Semaphore] = {}  # per owner: states being built
        self._seed_views: dict[str, Episode] = {}
        self._seed_lock = anyio.Lock()
        if sqlite_work_bytes is not None:
            sqlheap.install(sqlite_work_bytes)

    @classmethod
    def from_dirs(cls, dirs: Iterable[str | Path], **kwargs: Any) -> Fleet:
        return cls([load_env(d) for d in dirs], **kwargs)

    def env(self, name: str) -> Environment:
        try:
            return self.envs[name]
        except KeyError:
            raise KeyError(f"unknown env {name!r}; this fleet serves {sorted(self.envs)}") from None

    def mcp(self, env_name: str) -> EnvMCPServer:
        """The env's MCP server (created once), for in-process clients and the HTTP app."""
        self.env(env_name)
        if env_name not in self._servers:
            self._servers[env_name] = EnvMCPServer(self, env_name)
        return self._servers[env_name]

    def user_mcp(self, env_name: str) -> EnvUserMCPServer:
        """The MCP server of the env's user side (created once): each episode's user endpoint."""
        self.env(env_name)
        if env_name not in self._user_servers:
            self._user_servers[env_name] = EnvUserMCPServer(self, env_name)
        return self._user_servers[env_name]

    def user_key(self, episode_id: str) -> str:
        """The capability that reaches `episode_id`'s user side (dual control), apart from its id.

        The agent holds its episode's id (it is in its URL), so the id alone must not reach the
        user's tools: the user endpoint also needs this key, an HMAC of the id under a secret of
        this fleet, given only to whoever created the episode (the control plane's answer).
        Derived, not stored: nothing to forget when the episode ends."""
        return hmac.new(self._user_secret, episode_id.encode(), hashlib.sha256).hexdigest()[:32]

    def user_key_matches(self, episode_id: str, key: str) -> bool:
        return hmac.compare_digest(self.user_key(episode_id), key)

    async def create_episode(
        self,
        env_name: str,
        *,
        state: State | None = None,
        database: bytes | None = None,
        owner: str | None = None,
        size_hint: int = 0,
    ) -> Episode:
        """A new isolated episode from the seed state, a canonical `state`, or a serialised `database`.

        `owner` (a client key) counts it against that client's cap on open episodes.
        `size_hint`: how large `state` was as JSON (the HTTP body). An episode counts twice its
        database, which is at least half its JSON (keys are written once, not per row), so a
        state whose JSON alone passes the client's budget is refused unbuilt.
        """
        env = self.env(env_name)
        if state is None:
            return await self.store.create(env, database, owner=owner)
        # A client's state costs its size in CPU and memory to build, so: refused first if it
        # cannot fit; built off the event loop (a 16 MiB state took ~1 s from every client); and
        # at most STATE_BUILDS_PER_CLIENT at once per client, each counted against its budget
        # before the next starts (eight built at once all passed the check, then six were refused
        # with their databases already made).
        builds = self._builds.setdefault(owner, anyio.Semaphore(STATE_BUILDS_PER_CLIENT))
        try:
            async with builds:
                await self.store.make_room(owner, size_hint + self.store.growth_bytes)
                # SQLite's heap holds the database being built and its serialised copy meanwhile
                if env.manifest.trust == "confined":
                    # its model-written schema's triggers, CHECKs and generated columns run on every
                    # row the client chose: built in a child under a deadline and a memory bound
                    database = await self._build_confined(env, state, owner)
                else:
                    building = 2 * size_hint + self.store.growth_bytes
                    sqlheap.hold(building)
                    try:
                        database = await anyio.to_thread.run_sync(env.database_from_state, state)
                    finally:
                        sqlheap.let_go(building)
                return await self.store.create(env, database, owner=owner)
        finally:  # a client with no build in flight holds no semaphore (clients come and go)
            idle = builds.value == STATE_BUILDS_PER_CLIENT and not builds.statistics().tasks_waiting
            if idle and self._builds.get(owner) is builds:
                del self._builds[owner]

    async def _build_confined(self, env: Environment, state: State, owner: str | None) -> bytes:
        """A confined env's state built in its child, whose database may be at most the fixed
        `STATE_DATABASE_MAX_BYTES` and what `owner`'s byte budget has room for: a 4.6 KB state
        under a schema storing a megabyte per row built 180 MB, and taking it back cost this
        process +459 MiB at its peak before the budget refused it."""
        cap = STATE_DATABASE_MAX_BYTES
        room = self.store.database_room(owner)
        if room is not None:
            cap = min(cap, room)
        try:
            return await anyio.to_thread.run_sync(build_state_bounded, env, state, cap)
        except DatabaseTooLarge as exc:
            if exc.size <= STATE_DATABASE_MAX_BYTES:  # over the client's budget: its own refusal
                await self.store.make_room(owner, 2 * exc.size + self.store.growth_bytes)
            mib = 1024 * 1024
            raise ValueError(
                f"its database would be {exc.size / mib:.1f} MiB; a posted state's database may be "
                f"at most {cap / mib:.1f} MiB"
            ) from None

    async def shared_seed_episode(self, env_name: str) -> Episode:
        """The one read-only view of the seed state given to connections without an episode.

        It lives outside the episode store (`EpisodeStore.open_view`): every stateless client
        reads it, so no client path may name, list, export, close or write it.
        """
        async with self._seed_lock:
            view = self._seed_views.get(env_name)
            if view is None or view.closed:
                view = await self.store.open_view(self.env(env_name))
                self._seed_views[env_name] = view
            view.touch()
            return view

    async def call(
        self,
        episode_id: str,
        tool: str,
        arguments: dict[str, Any] | None = None,
        side: CallSide = "agent",
    ) -> ToolResult:
        """Call a tool directly in the runtime (no MCP framing): for synthesis, replay checks, a
        simulated user's own tools (`side="user"`) and a task's setup and checks."""
        return await execute(self.store.get(episode_id), tool, arguments or {}, side)

    async def export(self, episode_id: str) -> ExportedState:
        state = await self.store.get(episode_id).export()
        return ExportedState(state, state_hash(state))

    async def export_state(self, episode_id: str) -> State:
        """The episode's state without its hash: hashing reads the whole state (megabytes for a
        large seed), and a caller that scores with its own digest need not pay for it twice."""
        return await self.store.get(episode_id).export()

    async def close_episode(self, episode_id: str) -> None:
        await self.store.close(episode_id)

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """`async with Fleet(...)`: its episodes (and confined workers) end with the block, however."""
        await self.aclose()

    async def aclose(self) -> None:
        await self.store.close_all()
        views, self._seed_views = list(self._seed_views.values()), {}
        for view in views:
            await self.store.close_view(view)
        if any(env.manifest.trust == "confined" for env in self.envs.values()):
            from ..sandbox.confined_tools import detach_workers

            detach_workers(asyncio.get_running_loop())
