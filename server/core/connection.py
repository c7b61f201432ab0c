"""envforge's own asynchronous SQLite connection: awaitable statements over a `sqlite3.Connection`.

SQLite wants every statement of a connection on one thread, and the event loop must not wait for
them, so each statement is a job run elsewhere and awaited here. Where a job runs is the
subclass's one decision: on a shared worker thread (`dbthreads.PooledConnection`: episodes), or
inline on the caller's thread (`inline.InlineConnection`: synthesis). The server owns this layer
rather than borrowing aiosqlite's, because it needs what aiosqlite keeps private: its own threads
in place of one per connection, jobs queued from callbacks that answer from the thread, the raw
connection for the runtime's own jobs there (authorizer, commit, export, deserialize), and
`interrupt` from any thread (docs/architecture.md, "The database layer").

What a tool sees is unchanged: `execute` is awaitable for a cursor or usable as `async with`,
cursors fetch asynchronously, and `in_transaction`/`total_changes` read the connection directly.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterable, Mapping, Sequence
from typing import Any, Generic, ParamSpec, Self, TypeVar

_T = TypeVar("_T")
_P = ParamSpec("_P")
Params = Sequence[Any] | Mapping[str, Any]


class Result(Generic[_T]):
    """A statement's pending outcome: `await` it, or `async with` it (a cursor is closed after)."""

    __slots__ = ("_coro", "_obj")

    def __init__(self, coro: Coroutine[Any, Any, _T]) -> None:
        self._coro = coro

    def __await__(self) -> Generator[Any, None, _T]:
        return self._coro.__await__()

    async def __aenter__(self) -> _T:
        self._obj = await self._coro
        return self._obj

    async def __aexit__(self, *exc: object) -> None:
        if isinstance(self._obj, Cursor):
            await self._obj.close()


class Cursor:
    """A `sqlite3.Cursor` whose fetches run as jobs of its connection, in order with its statements."""

    __slots__ = ("_cur", "_db", "chunk")

    def __init__(self, db: Connection, cur: sqlite3.Cursor) -> None:
        self._db, self._cur, self.chunk = db, cur, 64

    async def fetchone(self) -> Any:
        return await self._db.run(self._cur.fetchone)

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        if size is None:
            return await self._db.run(self._cur.fetchmany)
        return await self._db.run(self._cur.fetchmany, size)

    async def fetchall(self) -> list[Any]:
        return await self._db.run(self._cur.fetchall)

    async def close(self) -> None:
        await self._db.run(self._cur.close)

    async def execute(self, sql: str, parameters: Params | None = None) -> Self:
        await self._db.run(self._cur.execute, sql, [] if parameters is None else parameters)
        return self

    async def executemany(self, sql: str, parameters: Iterable[Params]) -> Self:
        await self._db.run(self._cur.executemany, sql, parameters)
        return self

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cur.lastrowid

    @property
    def description(self) -> Any:
        return self._cur.description

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Any]:
        while rows := await self.fetchmany(self.chunk):
            for row in rows:
                yield row

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def fetch_rows(conn: sqlite3.Connection, sql: str, parameters: Params) -> list[Any]:
    """On the connection's thread: run one statement and return all its rows."""
    return conn.execute(sql, parameters).fetchall()


class Connection(ABC):
    """An asynchronous SQLite connection; subclasses choose where its jobs run (`run`).

    `await Connection(...)` opens it: the connector runs as its first job, so the `sqlite3`
    connection is created where its statements will run.
    """

    def __init__(self, connector: Callable[[], sqlite3.Connection]) -> None:
        self._connector = connector
        self._raw: sqlite3.Connection | None = None
        self._accepting = True

    # -- where jobs run: the subclass's part --

    @abstractmethod
    async def run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run `fn(*args, **kwargs)` where the connection's jobs run, after every job queued
        before it. Raises ValueError when the connection is closed."""
        ...

    @abstractmethod
    def stop(self) -> Any:
        """Refuse new jobs and close the `sqlite3` connection once the queued ones are done."""
        ...

    @abstractmethod
    async def _open(self) -> sqlite3.Connection:
        """Run the connector where the jobs will run."""
        ...

    # -- the connection itself --

    @property
    def raw(self) -> sqlite3.Connection:
        """The `sqlite3` connection, for a job running where the connection's jobs run (pass it to
        `run`); anywhere else only `interrupt` and reading attributes are safe. ValueError once
        closed."""
        raw = self._raw
        if raw is None:
            raise ValueError("no active connection")
        return raw

    @property
    def closed(self) -> bool:
        """Whether its `sqlite3` connection is closed (or was never opened)."""
        return self._raw is None

    @property
    def is_open(self) -> bool:
        """Whether it takes jobs: opened, and not yet stopped or closed."""
        return self._accepting and self._raw is not None

    def interrupt(self) -> None:
        """Stop the statement that is running, at SQLite's next check (safe from any thread)."""
        raw = self._raw
        if raw is not None:
            raw.interrupt()

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction

    @property
    def total_changes(self) -> int:
        return self.raw.total_changes

    def __await__(self) -> Generator[Any, None, Self]:
        return self._connect().__await__()

    async def _connect(self) -> Self:
        if self._raw is None:
            try:
                self._raw = await self._open()
            except BaseException:
                self.stop()
                self._raw = None
                raise
        return self

    async def close(self) -> None:
        """Close it after every queued job; later jobs raise ValueError."""
        if self._raw is None:
            return
        try:
            await self.run(self.raw.close)
        finally:
            self._raw = None
            done = self.stop()
            if done is not None:
                await done

    # -- statements --

    def execute(self, sql: str, parameters: Params | None = None) -> Result[Cursor]:
        """Run one statement: await it for a `Cursor`, or `async with` it (closed after)."""
        return Result(self._execute(sql, [] if parameters is None else parameters))

    async def _execute(self, sql: str, parameters: Params) -> Cursor:
        return Cursor(self, await self.run(self.raw.execute, sql, parameters))

    def executemany(self, sql: str, parameters: Iterable[Params]) -> Result[Cursor]:
        """Run one statement once per parameter set."""
        return Result(self._executemany(sql, parameters))

    async def _executemany(self, sql: str, parameters: Iterable[Params]) -> Cursor:
        return Cursor(self, await self.run(self.raw.executemany, sql, parameters))

    def execute_fetchall(self, sql: str, parameters: Params | None = None) -> Result[list[Any]]:
        """Run one statement and return all its rows, in one job."""
        return Result(self._execute_fetchall(sql, [] if parameters is None else parameters))

    async def _execute_fetchall(self, sql: str, parameters: Params) -> list[Any]:
        return await self.run(fetch_rows, self.raw, sql, parameters)

    async def commit(self) -> None:
        await self.run(self.raw.commit)

    async def rollback(self) -> None:
        await self.run(self.raw.rollback)
