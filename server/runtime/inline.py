"""SQLite on the caller's thread, and reused connections for synthesis's many short episodes.

The inline pool here stands beside `dbthreads`' worker pool; only synthesis uses it.

Synthesis is one sequential coroutine per env, so it runs SQL inline (`InlineConnection`). Its
own episodes (the walk, the golden replay, one replay per dropped write) are short, and on a fresh
connection the first statement parses the whole schema and every statement is prepared anew:
0.3-0.5 ms per episode on the bundled envs, more than the tool calls it then makes. A
`ScratchPool` keeps connections instead and hands each new episode the new bytes
(`deserialize`: a memcpy; the parsed schema and prepared statements survive).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from ..core.connection import Connection, Cursor, Params, Result, fetch_rows
from .episodes import Episode, WriteTracker, episode_connector
from .fleet import Fleet
from .loader import Environment

_T = TypeVar("_T")
_P = ParamSpec("_P")


def _no_connector() -> sqlite3.Connection:
    raise ValueError("a scratch connection is handed its pooled connection, never opens one")


class InlineConnection(Connection):
    """A `Connection` that runs its SQLite work directly on the calling thread.

    Synthesis is one sequential coroutine per env, so handing every statement to a worker thread
    buys no parallelism and costs two thread switches per statement (about half the time of a
    tool call). Tools still see the same connection API and run the same SQL in the same order,
    so their results are the same.
    """

    def __del__(self) -> None:
        if self._raw is not None:
            self._raw.close()

    async def _open(self) -> sqlite3.Connection:
        return self._connector()

    async def run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if not self._accepting or not self._raw:
            raise ValueError("Connection closed")
        return fn(*args, **kwargs)

    def stop(self) -> None:
        self._accepting = False
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    async def close(self) -> None:
        self.stop()


class InlinePool:
    """Stands in for the episode store's `WorkerPool`: connections that run on the caller's thread."""

    async def connect(self, connector: Callable[[], sqlite3.Connection]) -> Connection:
        return await InlineConnection(connector)


def run_inline(fleet: Fleet) -> None:
    """Make `fleet`'s new episodes execute SQL on the event loop's thread (single-core synthesis)."""
    fleet.store.pool = InlinePool()  # type: ignore[assignment]


class _Authorizer(WriteTracker):
    """A `WriteTracker` that also records, per table, the columns UPDATEs may change ('' for a
    statement that inserts or deletes rows, or updates without naming a column)."""

    def __init__(self, tables: frozenset[str]) -> None:
        super().__init__(tables)
        self.columns: dict[str, set[str]] = {}

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
    ) -> int:
        if action == _READ and self.probe is None:  # most callbacks: one per column read
            return 0
        if arg1 and action in _ROW_WRITES:
            column = (arg2 or "") if action == sqlite3.SQLITE_UPDATE else ""
            self.columns.setdefault(arg1, set()).add(column)
        return super().__call__(action, arg1, arg2, db, src)

    def allow_writes(self, writable: frozenset[str] | None) -> bool:
        """As `SqlGuard.allow_writes`, without expiring statements on a narrower set: the pooled
        connection knows what every statement text it prepared writes (`_Pooled.by_sql`), and
        `ScratchConnection` refuses a cached one whose tables are not all allowed before running
        it. Only after trusted code ran (whose statements that record never saw) is an expiry due.
        Expiring would re-prepare synthesis's own readers too, after every write call."""
        stale = self.granted is None and writable is not None
        super().allow_writes(writable)
        return stale


_ROW_WRITES = frozenset({sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE})
_READ = sqlite3.SQLITE_READ


@dataclass(frozen=True)
class _Footprint:
    """What one statement text was seen to write: tables, updated columns, whether it may REPLACE."""

    tables: frozenset[str]
    columns: tuple[tuple[str, frozenset[str]], ...]
    replace: bool


@dataclass(eq=False)
class _Pooled:
    """One reusable connection: its authorizer, and what each statement text writes."""

    raw: sqlite3.Connection
    authorizer: _Authorizer
    by_sql: dict[str, _Footprint] = field(default_factory=dict)


class _InlineCursor(Cursor):
    """A `Cursor` whose fetches and close call SQLite directly.

    Through `run` they would take two more coroutine hops each, to run the same call on the same
    thread. Statements still go through `run` (`ScratchConnection.execute`), where writes are
    tracked; fetching steps a prepared statement, which the authorizer is not asked about.
    """

    __slots__ = ()

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        return self._cur.fetchmany() if size is None else self._cur.fetchmany(size)

    async def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    async def close(self) -> None:
        self._cur.close()


class ScratchConnection(InlineConnection):
    """An inline connection over a pooled `sqlite3.Connection`, tracking writes per statement.

    The episode's `WriteTracker` learns what its statements write from the SQLite authorizer,
    which runs only when a statement is prepared. Installing a new authorizer per episode would
    expire every cached statement and so bring back the schema parse this pool exists to avoid.
    So the pooled connection keeps one authorizer for life (a `WriteTracker` of its own, `seen`),
    and every statement's text is remembered with the tables it was authorized to write: a
    statement served from the cache writes what it wrote when it was prepared (same text, same
    schema, same program). Each statement's tables go to the episode's tracker and to
    `written_since`, which tells a caller what one tool call wrote.
    """

    def __init__(self, pooled: _Pooled, tracker: WriteTracker) -> None:
        super().__init__(_no_connector)
        self._raw = pooled.raw
        self.pooled = pooled
        self.tracker = tracker
        self.written_since: set[str] = set()
        # Per table written since the last take, the columns updated ('' for whole rows), and
        # whether a statement may have replaced rows (whose deletions go unreported).
        self.columns_since: dict[str, set[str]] = {}
        self.replace_since = False
        self.taken_columns: dict[str, set[str]] | None = None

    async def run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return self._run(fn, *args, **kwargs)

    def _run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """`run`'s work, called directly where a coroutine hop would only add overhead."""
        if not self._accepting or not self._raw:
            raise ValueError("Connection closed")
        seen = self.pooled.authorizer
        seen.written.clear()
        seen.columns.clear()
        # a statement, as `execute` passes it or as `Db`'s fetch helpers do (connection first)
        sql = args[0] if args and type(args[0]) is str else None
        if sql is None and len(args) > 1 and type(args[1]) is str:
            sql = args[1]
        if sql is not None and seen.writable is not None:
            # A cached statement is not authorized again: what its text writes decides.
            known = self.pooled.by_sql.get(sql)
            if known is not None and not known.tables <= seen.writable:
                outside = sorted(known.tables - seen.writable)
                seen.denied = f"writing table {outside[0]!r} is not among this tool's writes"
                raise sqlite3.DatabaseError("not authorized")
        try:
            return fn(*args, **kwargs)
        finally:
            if sql is not None:  # what its text was seen to write
                self._note(self._footprint(sql, seen))
            elif seen.written:  # something else that wrote (nothing here does): no column detail
                self.tracker.written |= seen.written
                self.written_since |= seen.written
                for t in seen.written:
                    self.columns_since.setdefault(t, set()).add("")

    def _footprint(self, sql: str, seen: _Authorizer) -> _Footprint | None:
        by_sql = self.pooled.by_sql
        known = by_sql.get(sql)
        if seen.written or seen.columns:
            columns = dict(known.columns) if known else {}
            for t, cols in seen.columns.items():
                columns[t] = columns.get(t, frozenset()) | cols
            known = by_sql[sql] = _Footprint(
                tables=(known.tables if known else frozenset()) | seen.written,
                columns=tuple(sorted(columns.items())),
                replace="REPLACE" in sql.upper(),
            )
        return known

    def _note(self, footprint: _Footprint | None) -> None:
        if footprint is None or not footprint.tables:
            return
        self.tracker.written |= footprint.tables
        self.written_since |= footprint.tables
        for t, cols in footprint.columns:
            self.columns_since.setdefault(t, set()).update(cols)
        self.replace_since = self.replace_since or footprint.replace

    def execute(self, sql: str, parameters: Params | None = None) -> Result[Cursor]:
        """`Connection.execute`, with a cursor that fetches without the `run` hop."""
        return Result(self._inline_execute(sql, [] if parameters is None else parameters))

    async def _inline_execute(self, sql: str, parameters: Params) -> Cursor:
        return _InlineCursor(self, self._run(self.raw.execute, sql, parameters))

    def execute_fetchall(self, sql: str, parameters: Params | None = None) -> Result[list[Any]]:
        """`Connection.execute_fetchall`, without the `run` hop (awaitable, or `async with`, as
        the method it overrides)."""
        return Result(self._inline_fetchall(sql, [] if parameters is None else parameters))

    async def _inline_fetchall(self, sql: str, parameters: Params) -> list[Any]:
        return self._run(fetch_rows, self.raw, sql, parameters)

    def take_written(self) -> set[str]:
        """Tables written (or, for failed calls, about to be) since the last take; resets.

        The columns updated since then go to `taken_columns` (None when a statement may have
        replaced rows, or wrote a table outside the env's: then only whole tables tell).
        """
        out, self.written_since = self.written_since, set()
        columns, self.columns_since = self.columns_since, {}
        self.taken_columns = None if self.replace_since or "*" in out else columns
        self.replace_since = False
        return out

    def detach(self) -> sqlite3.Connection | None:
        """Stop serving calls and hand the underlying connection back."""
        raw, self._raw, self._accepting = self._raw, None, False
        return raw

    def __del__(self) -> None:  # the pool owns the connection
        pass


class _Unshared:
    """The lock of an episode that only its one caller uses (a scratch episode): never waits."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None

    def locked(self) -> bool:
        return False


_UNSHARED = _Unshared()


class ScratchPool:
    """Reusable connections for one env's scratch episodes (outside any fleet's store).

    Connections are set up exactly as the episode store sets up its own (`server.episodes`),
    under the same SQL guard: the pooled connection's authorizer is the episode's `guard`, so
    `calls.execute` narrows it to each tool's `writes=`. Calls to a scratch episode go through
    `calls.execute`, as `Fleet.call` sends them.
    """

    def __init__(self, env: Environment, size: int = 4) -> None:
        self.env = env
        self.size = size
        self.tables = frozenset(t.name for t in env.tables)
        self._idle: list[_Pooled] = []
        self._opened = 0

    def open(self, database: bytes) -> Episode:
        if self._idle:
            pooled = self._idle.pop()
            pooled.authorizer.deserialize(pooled.raw, database)
        else:
            authorizer = _Authorizer(self.tables)
            raw = episode_connector(database, authorizer)()
            pooled = _Pooled(raw=raw, authorizer=authorizer)
        self._opened += 1
        tracker = WriteTracker(self.tables)
        return Episode(
            id=f"scratch-{self._opened}",
            env=self.env,
            conn=ScratchConnection(pooled, tracker),
            created_at=0.0,
            last_used=0.0,
            tracker=tracker,
            lock=_UNSHARED,  # type: ignore[arg-type]
            guard=pooled.authorizer,
        )

    def close(self, episode: Episode) -> None:
        """Close a scratch episode; its connection is kept when nothing of it can reach the next.

        A connection left inside a transaction, with foreign keys off, or with anything in its
        temp schema (none of which a tool should leave, and none of which `deserialize` resets)
        is closed instead.
        """
        episode.closed = True
        conn = episode.conn
        assert isinstance(conn, ScratchConnection)
        raw = conn.detach()
        if raw is None:
            return
        if (
            len(self._idle) >= self.size
            or raw.in_transaction
            or raw.execute("PRAGMA foreign_keys").fetchone() != (1,)
            or raw.execute("SELECT count(*) FROM temp.sqlite_master").fetchone() != (0,)
        ):
            raw.close()
            return
        self._idle.append(conn.pooled)

    def close_all(self) -> None:
        while self._idle:
            self._idle.pop().raw.close()
