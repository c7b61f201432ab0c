"""A small pool of threads that runs every episode's SQLite work.

A thread per connection (aiosqlite's design) would mean thousands of threads for thousands of
episodes, and on a 2-core machine the context switches between 32 busy ones cost more than the
queries. Here each episode's connection is pinned to one of a few shared worker threads: its
statements still run in order on one thread (SQLite's requirement), episodes on different workers
still run in parallel, and closing an episode releases its connection without a thread to stop.
Tools see the same connection API wherever it runs (`connection.Connection`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import sqlite3
import threading
import warnings
from collections.abc import Callable, Coroutine
from queue import SimpleQueue
from typing import Any, ParamSpec, TypeVar, cast

from .connection import Connection

_Job = tuple[asyncio.Future[Any] | None, Callable[[], Any]]

_T = TypeVar("_T")
_P = ParamSpec("_P")


def on_db_thread(
    conn: Connection, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
) -> Coroutine[Any, Any, _T]:
    """Await it to run `fn(*args, **kwargs)` on the thread that owns `conn`'s SQLite connection,
    in order with its other jobs (`conn.run`; the job is queued when the await starts)."""
    return conn.run(fn, *args, **kwargs)


class _Completion:
    """Receives a queued job's outcome in place of a future and hands it straight to a callback.

    The thread loop (`_work`) delivers a job's outcome with
    `future.get_loop().call_soon_threadsafe(deliver, future, ...)`, and `deliver` checks `done()`
    then calls `set_result` or `set_exception`; this object offers exactly that, so the callback
    runs in that one loop pass, not in a second one scheduled by a future's done-callbacks.
    """

    __slots__ = ("_done", "_loop", "_then")

    def __init__(self, loop: asyncio.AbstractEventLoop, then: Callable[[Any, BaseException | None], None]):
        self._loop, self._then, self._done = loop, then, False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._done

    def set_result(self, value: Any) -> None:
        self._done = True
        self._then(value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._done = True
        self._then(None, exc)


def submit_on_db_thread(
    conn: PooledConnection,
    fn: Callable[_P, _T],
    *args: Any,
    then: Callable[[_T | None, BaseException | None], None],
) -> None:
    """Queue `fn(*args)` on `conn`'s thread now; `then(value, None)` or `then(None, exc)` runs on
    the event loop when it is done.

    `on_db_thread` for callers that are callbacks, not coroutines (a pipe's reader): the job is
    queued before this returns, in order with every other job of the connection, so a rollback
    queued after it also comes after it. Raises ValueError when the connection is closed.
    """
    if not conn.is_open:
        raise ValueError("Connection closed")
    completion = _Completion(asyncio.get_running_loop(), then)
    # duck-typed as the future the thread loop expects (see `_Completion`)
    conn.queue.put_nowait((cast("asyncio.Future[Any]", completion), functools.partial(fn, *args)))


def post_on_db_thread(conn: PooledConnection, fn: Callable[[], Any]) -> None:
    """Queue `fn()` on `conn`'s thread now, in order with its other jobs; nothing comes back.

    For a job that answers for itself from the thread (a confined worker's statement, written
    straight to the worker's pipe) and wakes the event loop only when it must. `fn` must not
    raise. Raises ValueError when the connection is closed.
    """
    if not conn.is_open:
        raise ValueError("Connection closed")
    conn.queue.put_nowait((None, fn))


def _deliver(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _end_thread() -> None:
    """The last job of a dedicated thread (`DedicatedPool`): its loop returns after it."""


def _work(queue: SimpleQueue[_Job]) -> None:
    while True:
        future, function = queue.get()
        if function is _end_thread:
            return
        try:
            value, ok = function(), True
        except BaseException as exc:  # handed to the awaiting coroutine, never swallowed
            value, ok = exc, False
        if future is not None:
            try:
                future.get_loop().call_soon_threadsafe(_deliver, future, ok, value)
            except RuntimeError:
                # its event loop is closed (a run that ended with this job queued): nobody awaits
                # the result, and the thread must live on for every other connection it serves
                pass


class _Worker:
    def __init__(self, name: str) -> None:
        self.queue: SimpleQueue[_Job] = SimpleQueue()
        self.thread = threading.Thread(target=_work, args=(self.queue,), name=name, daemon=True)
        self.thread.start()


class WorkerPool:
    """`size` daemon threads, started on first use; connections are assigned round-robin."""

    def __init__(self, size: int = 4) -> None:
        if size < 1:
            raise ValueError("a worker pool needs at least one thread")
        self.size = size
        self._workers: list[_Worker] = []
        self._next = itertools.count()
        self._lock = threading.Lock()

    def _worker(self) -> _Worker:
        with self._lock:
            if len(self._workers) < self.size:
                self._workers.append(_Worker(f"envforge-sqlite-{len(self._workers)}"))
                return self._workers[-1]
            return self._workers[next(self._next) % self.size]

    async def connect(self, connector: Callable[[], sqlite3.Connection]) -> PooledConnection:
        """A connection whose work runs on one of the pool's threads."""
        conn = PooledConnection(connector, self._worker())
        return await conn


class DedicatedPool(WorkerPool):
    """A thread of its own for every connection, ended when the connection closes.

    For episodes of confined envs, whose statements are model-written: SQLite checks a statement's
    deadline only between program steps, and one step (a JSON function over a 16 MiB document)
    can run for seconds. On a thread of its own such a statement holds up its own episode only,
    never another env's or another episode's queue, and a call that gives up on it
    (`Episode.abandon`) leaves the thread to finish it and end.
    """

    def __init__(self) -> None:
        super().__init__(1)

    async def connect(self, connector: Callable[[], sqlite3.Connection]) -> PooledConnection:
        conn = PooledConnection(connector, _Worker("envforge-sqlite-confined"), dedicated=True)
        return await conn


class PooledConnection(Connection):
    """A `Connection` whose jobs run on a worker thread it borrows (or, dedicated, owns)."""

    def __init__(
        self, connector: Callable[[], sqlite3.Connection], worker: _Worker, *, dedicated: bool = False
    ) -> None:
        super().__init__(connector)
        self.queue = worker.queue
        self.thread = worker.thread
        """The thread its jobs run on."""
        self._dedicated = dedicated
        self.guard: Any = None
        """The authorizer an episode installed on the connection (`EpisodeStore`), for whoever
        must lift it for the project's own work, such as replacing the whole database."""

    def __del__(self) -> None:
        # dropped unclosed: close it and let a thread of its own end (the sqlite3 connection
        # would close itself when collected, but the thread would wait on its queue for good)
        if self._raw is None:
            return
        warnings.warn(f"{self!r} was deleted before being closed", ResourceWarning, stacklevel=1)
        self.stop()

    @property
    def dedicated(self) -> bool:
        """Whether it has a thread of its own (`DedicatedPool`: an episode of a confined env)."""
        return self._dedicated

    async def run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if not self._accepting or self._raw is None:
            raise ValueError("Connection closed")
        future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((future, functools.partial(fn, *args, **kwargs)))
        return await future

    async def _open(self) -> sqlite3.Connection:
        future: asyncio.Future[sqlite3.Connection] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((future, self._connector))
        return await future

    def stop(self) -> asyncio.Future[Any] | None:
        """Close the sqlite connection only; a shared thread keeps serving other episodes."""
        self._accepting = False

        def close_only() -> None:
            if self._raw is not None:
                self._raw.close()
                self._raw = None

        try:
            future: asyncio.Future[Any] | None = asyncio.get_event_loop().create_future()
        except Exception:
            future = None
        self.queue.put_nowait((future, close_only))
        if self._dedicated:
            self.queue.put_nowait((None, _end_thread))
        return future


def _default_size() -> int:
    """Threads for SQLite work: ENVFORGE_SQLITE_THREADS, else 1.

    Tool queries are short, so one thread that drains its queue back to back beats several that
    hand the GIL to each other (measured on 2 cores: docs/benchmarks.md). Raise it for envs with
    heavy queries on machines with more cores.
    """
    return max(1, int(os.environ.get("ENVFORGE_SQLITE_THREADS", "1")))


default_pool = WorkerPool(_default_size())
dedicated_pool = DedicatedPool()
