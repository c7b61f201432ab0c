"""Episodes: isolated, in-memory copies of an environment's state, one per agent attempt.

Creating one deserialises a serialised database into a fresh in-memory SQLite connection (a
memcpy, not a replay of inserts), served by a small shared pool of worker threads. The store bounds how many
live at once and expires idle ones, so a fleet serving many agents cannot grow without limit.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiosqlite
import anyio

from .dbthreads import WorkerPool, default_pool
from .errors import EpisodeLimitReached, EpisodeNotFound
from .loader import Environment
from .state import State, export_state, state_hash

log = logging.getLogger(__name__)


def _connector(data: bytes) -> Callable[[], sqlite3.Connection]:
    def connect() -> sqlite3.Connection:
        # Legacy isolation: DML opens a transaction implicitly and plain reads do not, so a read
        # tool costs one thread hop and a write tool's statements share one transaction.
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level="DEFERRED")
        conn.deserialize(data)
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    return connect


@dataclass(eq=False)
class Episode:
    """One isolated database plus the lock that serialises calls made in it."""

    id: str
    env: Environment
    conn: aiosqlite.Connection
    created_at: float
    last_used: float
    # fast_acquire: an uncontended acquire must not yield to the event loop (~20 us per call)
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))
    closed: bool = False
    calls: int = 0

    def touch(self) -> None:
        self.last_used = time.monotonic()

    async def export(self) -> State:
        """The canonical state (see `state.export_state`), read inside the episode's thread."""
        async with self.lock:
            return await self.conn._execute(
                export_state, self.conn._conn, self.env.tables, self.env.manifest.volatile_columns
            )

    async def state_hash(self) -> str:
        return state_hash(await self.export())

    async def snapshot(self) -> bytes:
        """The serialised database, to start another episode from exactly this state."""
        async with self.lock:
            return await self.conn._execute(lambda: self.conn._conn.serialize())


class EpisodeStore:
    """Creates, finds, expires and closes episodes; bounded in number, idle ones expire after a TTL."""

    def __init__(
        self, *, max_episodes: int = 4096, ttl_seconds: float = 1800.0, pool: WorkerPool | None = None
    ) -> None:
        self.pool = pool or default_pool
        self.max_episodes = max_episodes
        self.ttl_seconds = ttl_seconds
        self._episodes: dict[str, Episode] = {}
        self.created = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._episodes)

    def ids(self) -> list[str]:
        return list(self._episodes)

    async def create(
        self, env: Environment, database: bytes | None = None, episode_id: str | None = None
    ) -> Episode:
        """A new episode on a private copy of `database` (the env's seed state by default)."""
        if len(self._episodes) >= self.max_episodes:
            await self.reap()
            if len(self._episodes) >= self.max_episodes:
                raise EpisodeLimitReached(
                    f"{len(self._episodes)} episodes are open (limit {self.max_episodes}); close some first"
                )
        episode_id = episode_id or secrets.token_hex(8)
        if episode_id in self._episodes:
            raise ValueError(f"episode {episode_id!r} already exists")
        conn = await self.pool.connect(_connector(database if database is not None else env.seed_db))
        now = time.monotonic()
        episode = Episode(id=episode_id, env=env, conn=conn, created_at=now, last_used=now)
        self._episodes[episode_id] = episode
        self.created += 1
        return episode

    def get(self, episode_id: str) -> Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EpisodeNotFound(episode_id)
        episode.touch()
        return episode

    def find(self, episode_id: str) -> Episode | None:
        return self._episodes.get(episode_id)

    async def close(self, episode_id: str) -> None:
        """Close an episode and release its connection. Unknown ids raise `EpisodeNotFound`."""
        episode = self._episodes.pop(episode_id, None)
        if episode is None:
            raise EpisodeNotFound(episode_id)
        await self._shutdown(episode)

    async def _shutdown(self, episode: Episode) -> None:
        episode.closed = True
        async with episode.lock:
            await episode.conn.close()

    async def reap(self) -> int:
        """Close episodes idle for longer than the TTL; returns how many were closed."""
        cutoff = time.monotonic() - self.ttl_seconds
        stale = [e for e in self._episodes.values() if e.last_used < cutoff and not e.lock.locked()]
        for episode in stale:
            self._episodes.pop(episode.id, None)
            await self._shutdown(episode)
        self.expired += len(stale)
        if stale:
            log.info("expired %d idle episodes", len(stale))
        return len(stale)

    async def close_all(self) -> None:
        for episode_id in list(self._episodes):
            await self.close(episode_id)

    async def run_reaper(self, interval: float | None = None) -> None:
        """Expire idle episodes forever (run it in a task group)."""
        interval = interval or max(0.05, min(60.0, self.ttl_seconds / 4))
        while True:
            await anyio.sleep(interval)
            await self.reap()
