"""Episode databases hosted in a confined env's worker: a tool's SQL runs there, beside the tool.

A confined tool's statements are model-written, and one SQLite step (a JSON function over a
16 MiB document, a sort of huge values) can run for seconds and ask for gigabytes where no
progress handler reaches it. Run in the serving process, such a step kept a core busy after its
call was answered and grew the server's memory. So a served episode's statements run here, in the
env's sandboxed worker (`confined_worker`), under the worker's rlimits and seccomp filter: a call
past its time limit is ended by killing the worker, which ends the step with it, and a statement
that asks for too much memory is refused by this process's own SQLite heap limit (or ends only
this process at its address-space limit).

The serving process keeps each episode's committed state and is its only authority: a call
carries the version it holds, and the bytes of that version when this worker may not have them
(`Host.open`); the tool runs in one transaction on this copy, under the same bounds as before
(`SqlGuard` narrowed to the tool's `writes=`, the linear SQL functions, the program-size and
LIKE-pattern limits, the episode's page cap, a deadline through the progress handler); a change
is committed here and sent back whole, and the serving process decides whether to keep it. A
worker that dies, a call that is cancelled or a result that is not kept leave the serving
process's copy as it was; the next call sends it again.

This module is imported inside the worker: it depends on the core modules only (no loader,
runtime, episodes, fleet or transports).
"""

from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self, TypeVar

from ..core import sqlheap
from ..core.errors import ToolError
from ..core.sqlguard import SqlGuard, end_transaction, protect
from .confined_protocol import MAX_MESSAGE_BYTES

PROGRESS_STEPS = 16
"""SQLite VM instructions between two looks at the clock, counted where the program jumps (a
loop's step). A loop step can hold 16 MiB operations (`hex(zeroblob(8e6))`), so looking every
sixteen rather than every thousand stops such a loop within a few of them; a straight run with
no jump is bounded by `MAX_PROGRAM` instead."""
MAX_LIKE_PATTERN = 64
"""The longest LIKE or GLOB pattern a model-written statement may use. Matching runs inside one VM
step, out of the progress handler's reach, in time that grows with text x pattern: at 64, a
16 MiB text takes ~0.8 s at worst (256: 3.3 s). Real patterns ('%smith%') are short."""
MAX_PROGRAM = 2000
"""The most VM instructions a model-written statement may compile to (`SQLITE_LIMIT_VDBE_OP`):
a tool's statements take a few hundred, and a straight run of 16 MiB operations, which no
deadline reaches, is bounded by it."""

MAX_HOSTED = 256
"""Episodes one worker keeps at most; the least recently used is let go first (the serving
process sends its state again when it is next called)."""
MAX_HOSTED_BYTES = 512 * 1024 * 1024
"""What the hosted episodes may reserve of the worker's SQLite heap in all (each its database
twice, its room to grow and a connection's structures, as `episodes.reserved_bytes` counts)."""
DEFAULT_WORK_MIB = 768
"""The statements' working memory in the worker's SQLite heap, besides the hosted databases:
room for a statement that parses a few 16 MiB JSON documents (~220 MiB each), under the
worker's 2 GiB address space with the hosted databases (`MAX_HOSTED_BYTES`) and the
interpreter. With 256 MiB, a statement of two such documents was refused for memory before its
call's time limit could end it, depending on how fast it ran."""


def out_of_memory_text(work_bytes: int) -> str:
    """What the agent reads when a statement asked the worker's SQLite heap for too much."""
    return (
        "a statement of this call needed more memory than the server lets SQL use "
        f"({work_bytes / 2**20:g} MiB beyond the episodes' databases, in the env's sandboxed worker); "
        "nothing of this call was kept"
    )


class HostGuard(SqlGuard):
    """A hosted episode's authorizer: the `SqlGuard` rules, and the tables its statements write
    (sent back with a committed change, so the serving process re-reads just those)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: set[str] = set()

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, db: str | None, src: str | None
    ) -> int:
        if action == sqlite3.SQLITE_READ:
            return sqlite3.SQLITE_OK
        verdict = super().__call__(action, arg1, arg2, db, src)
        if verdict == sqlite3.SQLITE_OK and action in _WRITES:
            self.written.add(arg1 or "")
        return verdict


_WRITES = frozenset({sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE})


class Hosted:
    """One episode's database in this worker, at `version` of the serving process's copy."""

    __slots__ = ("busy", "conn", "guard", "held", "version")

    def __init__(self, data: bytes, version: int, max_pages: int) -> None:
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level="DEFERRED")
        conn.deserialize(data)
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        conn.execute(f"PRAGMA max_page_count = {max(1, max_pages)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA temp_store = MEMORY")  # a sort's spill stays under the heap limit
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_MESSAGE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN)
        conn.setlimit(sqlite3.SQLITE_LIMIT_VDBE_OP, MAX_PROGRAM)
        self.guard = HostGuard()
        protect(conn, self.guard)
        self.conn, self.version = conn, version
        self.held = 2 * max(len(data), max_pages * page_size) + sqlheap.CONNECTION_BYTES
        self.busy = False  # a call runs on it: never let go under it

    def close(self) -> None:
        self.conn.close()


class Host:
    """The episodes this worker holds, by key, least recently used first."""

    def __init__(self, work_bytes: int) -> None:
        self.work_bytes = work_bytes
        self.episodes: OrderedDict[int, Hosted] = OrderedDict()
        self.bytes = 0

    def open(self, key: int, version: int, state: bytes | None, max_pages: int) -> Hosted | None:
        """The episode at `version`: from `state` when given, else the copy held here if it is
        that version; None when it is not (the caller answers `stale`)."""
        hosted = self.episodes.get(key)
        if state is None:
            if hosted is None or hosted.version != version:
                return None
            self.episodes.move_to_end(key)
            return hosted
        if hosted is not None:
            self._drop(key)
        hosted = Hosted(state, version, max_pages)
        idle = [k for k, h in self.episodes.items() if not h.busy]  # least recently used first
        while idle and (len(self.episodes) >= MAX_HOSTED or self.bytes + hosted.held > MAX_HOSTED_BYTES):
            self._drop(idle.pop(0))
        self.episodes[key] = hosted
        self.bytes += hosted.held
        sqlheap.hold(hosted.held)
        return hosted

    def _drop(self, key: int) -> None:
        hosted = self.episodes.pop(key)
        self.bytes -= hosted.held
        hosted.close()
        sqlheap.let_go(hosted.held)

    def forget(self, key: int) -> None:
        """Let the episode go (its copy is no longer the serving process's version)."""
        if key in self.episodes:
            self._drop(key)


class CallState:
    """What a call's statements met that decides its outcome whatever the tool did with the error:
    SQLite's heap limit (`out_of_memory`) or the call's deadline (`stopped`)."""

    __slots__ = ("deadline", "out_of_memory", "stopped")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.out_of_memory = False
        self.stopped = False

    def past_deadline(self) -> bool:
        self.stopped = self.stopped or time.monotonic() > self.deadline
        return self.stopped


Params = Sequence[Any] | Mapping[str, Any]
_T = TypeVar("_T")


ROW_COST = 64
"""Bytes a fetched row is counted for, besides its values (as `confined_tools` counts a result)."""
VALUE_COST = 16
"""Bytes each value is counted for, besides a string's or blob's length."""


def fetch_counted(cur: sqlite3.Cursor) -> list[tuple[Any, ...]]:
    """Every row of `cur`, counted as it comes: past `MAX_MESSAGE_BYTES` (a blob as base64) the
    statement fails with "result too large", as it does when its rows travel to the serving
    process (synthesis's path), so a tool behaves the same wherever its SQL runs."""
    rows: list[tuple[Any, ...]] = []
    size = 0
    for row in cur:
        size += ROW_COST + VALUE_COST * len(row)
        for value in row:
            kind = type(value)
            if kind is str:
                size += len(value)
            elif kind is bytes:
                size += len(value) * 4 // 3
        if size > MAX_MESSAGE_BYTES:
            raise sqlite3.OperationalError("result too large")
        rows.append(row)
    return rows


class FetchedCursor:
    """A cursor over a statement's rows fetched whole, as a tool's cursor reads them (`fetchone`,
    `fetchall`, `fetchmany`, `async for`), whether the statement ran here or in the parent."""

    description: Any
    rowcount: int
    lastrowid: int | None
    _rows: list[tuple[Any, ...]]

    async def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    async def fetchmany(self, size: int = 1) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows[:size], self._rows[size:]
        return rows

    async def close(self) -> None:
        self._rows = []

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> tuple[Any, ...]:
        if not self._rows:
            raise StopAsyncIteration
        return self._rows.pop(0)


class LocalCursor(FetchedCursor):
    """The rows of one statement run on the worker's copy, fetched whole (as a remote statement's are)."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        try:
            self.description = cur.description
            self._rows = fetch_counted(cur)
            self.rowcount = cur.rowcount
            self.lastrowid = cur.lastrowid
        finally:
            cur.close()


class _PendingCursor:
    """`db.execute(...)`: awaitable for a cursor, or `async with` (as `Db.execute` allows)."""

    def __init__(self, db: LocalDb, sql: str, params: Params) -> None:
        self._db, self._sql, self._params = db, sql, params

    def _run(self) -> LocalCursor:
        return self._db._run(lambda conn: LocalCursor(conn.execute(self._sql, self._params)))

    def __await__(self) -> Any:
        return _ready(self._run()).__await__()

    async def __aenter__(self) -> LocalCursor:
        return self._run()

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _ready(value: Any) -> Any:
    return value


class LocalDb:
    """`envforge.server.Db`'s methods over a hosted episode's connection, run right here."""

    __slots__ = ("_conn", "_state")

    def __init__(self, conn: sqlite3.Connection, state: CallState) -> None:
        self._conn, self._state = conn, state

    def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        try:
            return work(self._conn)
        except MemoryError:
            self._state.out_of_memory = True
            raise

    def execute(self, sql: str, params: Params = ()) -> _PendingCursor:
        return _PendingCursor(self, sql, params)

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        self._run(lambda conn: conn.executemany(sql, rows).close())

    async def execute_fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return list(self._run(lambda conn: LocalCursor(conn.execute(sql, params))._rows))

    async def fetch_all(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        cur = self._run(lambda conn: LocalCursor(conn.execute(sql, params)))
        names = [d[0] for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur._rows]

    async def fetch_one(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        def first(conn: sqlite3.Connection) -> dict[str, Any] | None:
            cur = conn.execute(sql, params)
            try:
                row = cur.fetchone()
                return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))
            finally:
                cur.close()

        return self._run(first)

    async def fetch_value(self, sql: str, params: Params = ()) -> Any:
        def value(conn: sqlite3.Connection) -> Any:
            cur = conn.execute(sql, params)
            try:
                row = cur.fetchone()
                return None if row is None else row[0]
            finally:
                cur.close()

        return self._run(value)

    async def require_one(self, sql: str, params: Params, missing: str) -> dict[str, Any]:
        row = await self.fetch_one(sql, params)
        if row is None:
            raise ToolError(missing)
        return row


def begin(hosted: Hosted, writes: frozenset[str], deadline: float) -> tuple[LocalDb, CallState, int]:
    """Arm `hosted` for one call of a tool that may write `writes`: its handle, its state, and the
    connection's change count before it."""
    state = CallState(deadline)
    hosted.busy = True
    guard = hosted.guard
    if guard.allow_writes(writes):
        guard.install(hosted.conn)
    guard.written.clear()
    hosted.conn.set_progress_handler(state.past_deadline, PROGRESS_STEPS)
    return LocalDb(hosted.conn, state), state, hosted.conn.total_changes


def finish(hosted: Hosted, commit: bool) -> str | None:
    """End the call's transaction: commit (when asked and something changed) or roll back. The
    error of a COMMIT that failed (rolled back then), else None."""
    conn = hosted.conn
    hosted.busy = False
    conn.set_progress_handler(None, 0)
    if commit:
        try:
            end_transaction(conn, hosted.guard, True)
            return None
        except sqlite3.Error as exc:
            failure = str(exc)
        end_transaction(conn, hosted.guard, False)
        return failure
    end_transaction(conn, hosted.guard, False)
    return None
