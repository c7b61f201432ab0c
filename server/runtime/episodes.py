"""Episodes: isolated, in-memory copies of an environment's state, one per agent attempt.

Creating one deserialises a serialised database into a fresh in-memory SQLite connection (a
memcpy, not a replay of inserts), served by a small shared pool of worker threads. The store bounds how many
live at once, in all and per owning client, and expires idle ones, so a fleet serving many agents cannot
grow without limit and one client cannot take every slot.

Episode ids are 128-bit random capabilities: over HTTP, knowing an id is what lets a client use the
episode, so ids must not be guessable. The store remembers recently closed and expired ids, so a late
call is told that its episode expired rather than "unknown" (and nothing restarts it from the seed).
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from ..core import sqlheap
from ..core.connection import Connection
from ..core.dbthreads import PooledConnection, WorkerPool, dedicated_pool, default_pool, on_db_thread
from ..core.errors import ClientEpisodeLimitReached, EpisodeLimitReached, EpisodeNotFound
from ..core.sqlguard import Authorizer, SqlGuard, protect
from ..core.state import State, export_state, freeze, state_hash
from .loader import Environment

log = logging.getLogger(__name__)


_READ = sqlite3.SQLITE_READ
_WRITES = frozenset({sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE})
_SCHEMA_CHANGES = frozenset(
    {
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_ALTER_TABLE,
        sqlite3.SQLITE_CREATE_TEMP_TABLE,
        sqlite3.SQLITE_DROP_TEMP_TABLE,
    }
)


class WriteTracker(SqlGuard):
    """An episode's authorizer: the `SqlGuard` rules, plus a record of which tables its
    statements write.

    Exporting an episode then re-reads only those tables and shares the rest with the state it
    started from. It chains to an optional probe (the synthesiser's footprint measurement), so
    there is one authorizer per connection and neither silently replaces the other; the probe
    observes, the guard decides.
    """

    def __init__(self, tables: frozenset[str]) -> None:
        super().__init__()
        self.tables = tables
        self.written: set[str] = set()
        self.probe: Authorizer | None = None

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
    ) -> int:
        if action == _READ and self.probe is None:  # most callbacks: one per column read
            return 0
        if action in _WRITES:
            self.written.add(arg1 if arg1 in self.tables else "*")
        elif action in _SCHEMA_CHANGES:
            self.written.add("*")
        verdict = super().__call__(action, arg1, arg2, db, src)
        if self.probe is not None:
            self.probe(action, arg1, arg2, db, src)
        return verdict


#: How far an episode's database may grow past the state it started from. Tool writes add rows of
#: a few hundred bytes; a client that writes a megabyte into one episode is filling memory.
DEFAULT_EPISODE_GROWTH = 1024 * 1024
#: The bytes of episode databases one client may hold by default (`serve`'s
#: `--max-episode-mib-per-client`): a thousand episodes of a bundled env take ~1 GiB of it.
DEFAULT_EPISODE_BYTES_PER_CLIENT = 4096 * 1024 * 1024


def reserved_bytes(database: bytes, growth: int) -> int:
    """What an episode counts against its client's byte budget: its database twice (SQLite's copy,
    and the pages a write transaction journals in memory) and its room to grow."""
    return 2 * len(database) + growth


def episode_connector(
    data: bytes, tracker: WriteTracker, *, growth: int | None = DEFAULT_EPISODE_GROWTH
) -> Callable[[], sqlite3.Connection]:
    """How every episode's connection is opened (public so task synthesis opens its scratch
    databases exactly the same way: same isolation, foreign keys, guard and write tracking).

    The database may grow `growth` bytes past `data` (None: unbounded); a write past that fails
    with SQLite's "database or disk is full", so no episode holds more memory than it reserved."""

    # The connection keeps its connector for life: holding `data` there would keep a second copy
    # of every episode's database (SQLite has its own once it is open), so it is let go.
    held = [data]

    def connect() -> sqlite3.Connection:
        # Legacy isolation: DML opens a transaction implicitly and plain reads do not, so a read
        # tool costs one thread hop and a write tool's statements share one transaction.
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level="DEFERRED")
        source = held.pop()
        conn.deserialize(source)
        if growth is not None:
            (page_size,) = conn.execute("PRAGMA page_size").fetchone()
            conn.execute(f"PRAGMA max_page_count = {-(-(len(source) + growth) // page_size)}")
        conn.execute("PRAGMA foreign_keys = ON")
        if sqlheap.installed() is not None:
            # a sort's or temporary table's spill goes to SQLite's heap, under its limit, and not
            # to disk: a GROUP BY over 1,000 values of 4 MB spilled its sort to files, ~9 s, first
            conn.execute("PRAGMA temp_store = MEMORY")
        protect(conn, tracker)
        return conn

    return connect


@dataclass(eq=False)
class Episode:
    """One isolated database plus the lock that serialises calls made in it."""

    id: str
    env: Environment
    conn: Connection
    created_at: float
    last_used: float
    # fast_acquire: an uncontended acquire must not yield to the event loop (~20 us per call)
    tracker: WriteTracker
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))
    base_state: State | None = field(default=None, repr=False)
    """The frozen state the episode started from, when known: unwritten tables are shared with it."""
    closed: bool = False
    calls: int = 0
    owner: str | None = None
    """Who created it (a client key such as `addr:127.0.0.1`), for the per-client cap and the listing."""
    guard: WriteTracker = field(default=None, repr=False)  # type: ignore[assignment]
    """The authorizer installed on the connection (the tracker itself, unless the connection is
    shared and keeps one of its own, as synthesis's scratch connections do)."""
    read_only: bool = False
    """Only read tools may run in it (the runtime refuses the rest): the shared seed view, which
    every stateless client reads and so no client may change."""
    reserved_bytes: int = 0
    """What it counts against its owner's byte budget: its starting database and room to grow."""
    stopped: str | None = None
    """Why it was given up (`abandon`): a call answered while one of its statements still ran."""
    heap_held: int = 0
    """What it holds of SQLite's heap budget (`sqlheap.hold`), let go when it is shut down."""

    def __post_init__(self) -> None:
        if self.guard is None:
            self.guard = self.tracker

    def touch(self) -> None:
        self.last_used = time.monotonic()

    async def export(self) -> State:
        """The canonical state (see `state.export_state`), read inside the episode's thread.

        Tables no statement wrote are taken from `base_state` (same objects, already frozen).
        """
        only = None
        if self.base_state is not None and "*" not in self.tracker.written:
            only = set(self.tracker.written)
        async with self.lock:
            fresh = await on_db_thread(
                self.conn,
                export_state,
                self.conn.raw,
                self.env.tables,
                self.env.manifest.volatile_columns,
                only,
            )
        if only is None or self.base_state is None:
            return fresh
        base = self.base_state
        return {t.name: fresh[t.name] if t.name in only else base[t.name] for t in self.env.tables}

    async def set_probe(self, probe: Authorizer | None) -> None:
        """Route every statement's authorizer callbacks also to `probe` (None to stop).

        Re-installing the authorizer expires prepared statements, so statements cached earlier
        are authorized (and so probed) again.
        """
        async with self.lock:
            self.guard.probe = probe
            await on_db_thread(self.conn, self.guard.install, self.conn.raw)

    async def state_hash(self) -> str:
        return state_hash(await self.export())

    def abandon(self, reason: str) -> None:
        """Give the episode up while a statement still runs on its connection's thread.

        SQLite checks a statement's deadline only between program steps, and one step of a
        model-written statement can outlast any deadline. The call that sent it is answered at its
        time limit instead of waiting for it: the episode is closed (later calls are told why),
        the statement is interrupted where SQLite can be, and the connection's own thread
        (`DedicatedPool`) closes the connection, discarding the open transaction, and ends when the
        step returns. Nothing of the call is committed.
        """
        self.closed = True
        self.stopped = reason
        self.conn.interrupt()
        self.conn.stop()

    async def snapshot(self) -> bytes:
        """The serialised database, to start another episode from exactly this state."""
        async with self.lock:
            return await on_db_thread(self.conn, lambda: self.conn.raw.serialize())


EPISODE_ID_BYTES = 16
"""128 bits: an episode id is a bearer capability on the MCP endpoints."""

_REMEMBERED_ENDS = 65536
"""How many closed/expired ids the store remembers to explain a late call (about 5 MB at most)."""


class EpisodeStore:
    """Creates, finds, expires and closes episodes; bounded in number (in all and per owner), idle
    ones expire after a TTL."""

    def __init__(
        self,
        *,
        max_episodes: int = 4096,
        ttl_seconds: float = 1800.0,
        max_per_owner: int | None = None,
        max_bytes_per_owner: int | None = None,
        growth_bytes: int = DEFAULT_EPISODE_GROWTH,
        pool: WorkerPool | None = None,
        id_prefix: str = "",
    ) -> None:
        self.pool = pool or default_pool
        self.id_prefix = id_prefix
        """Starts every episode id made here: a fleet of several worker processes names the owning
        worker in it, so the front routes an episode's requests by its id alone."""
        self.max_episodes = max_episodes
        self.max_per_owner = max_per_owner
        self.max_bytes_per_owner = max_bytes_per_owner
        """Bytes of episode databases one owner may hold (each its starting state plus
        `growth_bytes`): a count cap alone lets 1,024 episodes of a 16 MiB state hold ~30 GiB."""
        self.growth_bytes = growth_bytes
        self._bytes_per_owner: Counter[str] = Counter()
        self.ttl_seconds = ttl_seconds
        self._episodes: dict[str, Episode] = {}
        self._per_owner: Counter[str] = Counter()
        self._pending = 0
        self._ended: OrderedDict[str, str] = OrderedDict()
        self.created = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._episodes)

    def ids(self) -> list[str]:
        return list(self._episodes)

    def episodes(self) -> list[Episode]:
        return list(self._episodes.values())

    def open_for(self, owner: str) -> int:
        return self._per_owner[owner]

    async def make_room(self, owner: str | None, reserved: int | None = None) -> None:
        """Raise `EpisodeLimitReached` unless one more episode, counting `reserved` bytes against
        `owner` (None: the least any episode counts), fits: expired episodes are reaped first.

        Called before the work an episode costs (a client's state built into a database), so a
        client over its caps is refused before it spends the server's time, and again by `create`
        with the exact bytes."""
        need = reserved if reserved is not None else self.growth_bytes
        if self._full() or self._owner_full(owner) or (owner is not None and self._over_budget(owner, need)):
            await self.reap()
        if self._full():
            raise EpisodeLimitReached(
                f"{len(self._episodes)} episodes are open (limit {self.max_episodes}); close some first"
            )
        if owner is None:
            return
        if self._owner_full(owner):
            raise ClientEpisodeLimitReached(
                f"client {owner} has {self._per_owner[owner]} episodes open (limit {self.max_per_owner} "
                "per client); close some first"
            )
        if self._over_budget(owner, need):
            mib = 1024 * 1024
            raise ClientEpisodeLimitReached(
                f"client {owner} holds {self._bytes_per_owner[owner] / mib:.1f} MiB of episode databases "
                f"(limit {(self.max_bytes_per_owner or 0) / mib:.0f} MiB per client; this one needs "
                f"{need / mib:.1f} MiB: its database twice, for SQLite's copy and a write's journal, "
                f"and {self.growth_bytes / mib:.0f} MiB to grow); close some first"
            )

    async def create(
        self,
        env: Environment,
        database: bytes | None = None,
        episode_id: str | None = None,
        owner: str | None = None,
    ) -> Episode:
        """A new episode on a private copy of `database` (the env's seed state by default).

        Refused with `EpisodeLimitReached` when the store, or `owner`'s share of it, is full.
        """
        data = database if database is not None else env.seed_db
        reserved = reserved_bytes(data, self.growth_bytes)
        await self.make_room(owner, reserved)
        episode_id = episode_id or self.id_prefix + secrets.token_hex(EPISODE_ID_BYTES)
        if episode_id in self._episodes:
            raise ValueError(f"episode {episode_id!r} already exists")
        tracker = WriteTracker(frozenset(t.name for t in env.tables))
        # Reserve the slots before the first await, so concurrent creations cannot all pass the checks.
        self._pending += 1
        if owner is not None:
            self._per_owner[owner] += 1
            self._bytes_per_owner[owner] += reserved
        held = reserved + sqlheap.CONNECTION_BYTES
        sqlheap.hold(held)  # its database is about to live in SQLite's heap
        try:
            conn = await self._pool(env).connect(episode_connector(data, tracker, growth=self.growth_bytes))
        except BaseException:
            sqlheap.let_go(held)
            if owner is not None:
                self._release_owner(owner, reserved)
            raise
        finally:
            self._pending -= 1
        if isinstance(conn, PooledConnection):
            conn.guard = tracker
        now = time.monotonic()
        base = freeze(env.seed_state()) if database is None else None
        episode = Episode(
            id=episode_id,
            env=env,
            conn=conn,
            created_at=now,
            last_used=now,
            tracker=tracker,
            base_state=base,
            owner=owner,
            reserved_bytes=reserved,
            heap_held=held,
        )
        self._episodes[episode_id] = episode
        self.created += 1
        return episode

    async def open_view(self, env: Environment) -> Episode:
        """A read-only episode on `env`'s seed that the store neither lists nor resolves.

        It backs the seed view of stateless clients. Being outside the store, no id reaches it
        (`get`, `find`, the listing, export and close never see it) and it counts against no cap;
        `read_only` makes the runtime refuse write tools in it, and the `SqlGuard` denies a read
        tool's writes, so what every stateless client reads cannot change. The caller closes it
        with `close_view`.
        """
        tracker = WriteTracker(frozenset(t.name for t in env.tables))
        held = reserved_bytes(env.seed_db, DEFAULT_EPISODE_GROWTH) + sqlheap.CONNECTION_BYTES
        sqlheap.hold(held)
        try:
            conn = await self._pool(env).connect(episode_connector(env.seed_db, tracker))
        except BaseException:
            sqlheap.let_go(held)
            raise
        if isinstance(conn, PooledConnection):
            conn.guard = tracker
        now = time.monotonic()
        return Episode(
            id=f"seed view of {env.name}",
            env=env,
            conn=conn,
            created_at=now,
            last_used=now,
            tracker=tracker,
            base_state=freeze(env.seed_state()),
            read_only=True,
            heap_held=held,
        )

    async def close_view(self, episode: Episode) -> None:
        """Close an episode `open_view` made."""
        await self._shutdown(episode)

    def _pool(self, env: Environment) -> WorkerPool:
        """Where an episode's SQLite work runs: a thread of its own for a confined env, whose
        statements are model-written (`DedicatedPool`), else the store's shared pool."""
        return dedicated_pool if env.manifest.trust == "confined" else self.pool

    def _full(self) -> bool:
        return len(self._episodes) + self._pending >= self.max_episodes

    def _release_owner(self, owner: str, reserved: int) -> None:
        self._per_owner[owner] -= 1
        if self._per_owner[owner] <= 0:
            del self._per_owner[owner]
        self._bytes_per_owner[owner] -= reserved
        if self._bytes_per_owner[owner] <= 0:
            del self._bytes_per_owner[owner]

    def database_room(self, owner: str | None) -> int | None:
        """The largest database one more episode of `owner` could start from within its byte
        budget (None: no budget), so a build can be stopped at that size rather than refused
        once made."""
        if owner is None or self.max_bytes_per_owner is None:
            return None
        left = self.max_bytes_per_owner - self._bytes_per_owner[owner] - self.growth_bytes
        return max(0, left // 2)

    def _over_budget(self, owner: str, reserved: int) -> bool:
        return (
            self.max_bytes_per_owner is not None
            and self._bytes_per_owner[owner] + reserved > self.max_bytes_per_owner
        )

    def _owner_full(self, owner: str | None) -> bool:
        return (
            owner is not None
            and self.max_per_owner is not None
            and self._per_owner[owner] >= self.max_per_owner
        )

    def get(self, episode_id: str) -> Episode:
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EpisodeNotFound(episode_id, self._ended.get(episode_id))
        episode.touch()
        return episode

    def ended(self, episode_id: str) -> str | None:
        """ "closed" or "expired" for a recently ended episode, else None."""
        return self._ended.get(episode_id)

    def _forget(self, episode: Episode, reason: str) -> None:
        self._episodes.pop(episode.id, None)
        if episode.owner is not None:
            self._release_owner(episode.owner, episode.reserved_bytes)
        self._ended[episode.id] = reason
        while len(self._ended) > _REMEMBERED_ENDS:
            self._ended.popitem(last=False)

    def find(self, episode_id: str) -> Episode | None:
        return self._episodes.get(episode_id)

    async def close(self, episode_id: str) -> None:
        """Close an episode and release its connection. Unknown ids raise `EpisodeNotFound`."""
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise EpisodeNotFound(episode_id, self._ended.get(episode_id))
        self._forget(episode, "closed")
        await self._shutdown(episode)

    async def _shutdown(self, episode: Episode) -> None:
        episode.closed = True
        held, episode.heap_held = episode.heap_held, 0
        try:
            if episode.stopped is not None:
                return  # its connection is closing on its own thread (`Episode.abandon`)
            async with episode.lock:
                await episode.conn.close()
        finally:  # after the close, so its database is gone from SQLite's heap first
            sqlheap.let_go(held)

    async def reap(self) -> int:
        """Close episodes idle for longer than the TTL; returns how many were closed."""
        cutoff = time.monotonic() - self.ttl_seconds
        stale = [e for e in self._episodes.values() if e.last_used < cutoff and not e.lock.locked()]
        for episode in stale:
            self._forget(episode, "expired")
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
