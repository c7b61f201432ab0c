"""Tools of a confined (model-written) env: specs from a sandboxed worker, calls forwarded to it.

The serving process never imports a confined env's tools.py. `load_confined_tools` starts a
worker once to learn the tool specs (name, description, JSON schema, parameters, writes, line),
and returns `ToolSpec`s whose `fn(db, **kwargs)` forwards the call to a long-lived worker
(`ToolWorker`: started lazily, one per env, restarted when it dies or the event loop changes).
A call on a served episode (`_hosted`) runs its SQL in the worker, on the worker's copy of the
episode's committed state (`sqlhost`): a runaway statement ends with the worker, which is killed
at the call's limit, and a change comes back whole, to be checked and taken into the episode
here (`_accept`) or dropped. Any other call (synthesis's connections) has the worker's
`SqlRequest`s served here with the `Db` the runtime passed in, so the episode's transaction,
SQLite authorizer and rollback apply exactly as for trusted envs. A `ToolError` in the worker
becomes a `ToolError` here; anything else, a worker that dies mid-call or a call over its time
limit becomes `ConfinedToolCrash`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import os
import select
import selectors
import sqlite3
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, create_model

from ..core import sqlheap
from ..core.db import Db, connection_of
from ..core.dbthreads import PooledConnection, on_db_thread, post_on_db_thread
from ..core.errors import EnvLoadError, InvalidArguments, LoadProblem, ToolError, ToolTimeout
from ..core.manifest import EnvManifest
from ..core.tooldef import ToolSpec
from . import confinement
from .confined_protocol import (
    MAX_LINE_BYTES,
    MAX_MESSAGE_BYTES,
    STARTED,
    Call,
    Cancel,
    Init,
    LoadFailed,
    ProtocolError,
    Ready,
    Result,
    SqlReply,
    SqlRequest,
    ToolDescription,
    awaited_state,
    decode,
    decode_from_worker,
    encode,
    from_wire,
    rows_to_wire,
    to_wire,
)
from .sqlhost import MAX_LIKE_PATTERN, MAX_PROGRAM
from .sqlhost import PROGRESS_STEPS as _PROGRESS_STEPS

log = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).resolve().parent / "confined_worker.py"
START_TIMEOUT_S = 60.0
STDERR_LINES_LOGGED = 100
DEFAULT_LIMITS = confinement.Limits()


class ConfinedToolCrash(RuntimeError):
    """A confined tool failed as a bug, not as a refusal: an exception other than `ToolError`,
    its worker died mid-call, or it ran past its time limit."""


class ConfinedToolTimeout(ConfinedToolCrash, ToolTimeout):
    """A confined call ran past its time limit: in its worker, or in a statement it sent, which
    SQLite stopped at the same deadline (see `_Deadline`). Its worker was stopped."""


class ConfinedStatementStuck(ConfinedToolTimeout):
    """A call over its time limit whose statement was still running after `STUCK_GRACE_S`: it is
    answered now, and its episode given up (`abandons_episode`, acted on by the runtime)."""

    abandons_episode = True


class StatementOutOfMemory(ToolError):
    """A statement of the call asked SQLite for more memory than this process allows it
    (`sqlheap`: SQLITE_NOMEM, Python's `MemoryError`). SQLite undid the statement and freed what it
    took; the call is refused and rolled back, whatever the tool did with the statement's error."""


def _out_of_memory() -> StatementOutOfMemory:
    budget = sqlheap.installed()
    allowed = "" if budget is None else f" ({budget.work_bytes / 2**20:g} MiB beyond the episodes' databases)"
    return StatementOutOfMemory(
        f"a statement of this call needed more memory than the server lets SQL use{allowed}; "
        "nothing of this call was kept"
    )


class _Deadline:
    """When a call's statements must stop (`time.monotonic()`), read by SQLite's progress handler
    on whichever thread runs them.

    A statement runs in this process, on the episode's connection, where the worker's kill cannot
    reach it: without a deadline an endless query held the SQLite thread, which every episode of
    every env shares, for good (the call's rollback and every other episode's work queued behind
    it). A call that fails sets the deadline to the past (`expire`), so a statement of it still
    running or queued stops at once and the rollback follows.
    """

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at

    def expire(self) -> None:
        self.at = float("-inf")


class _StatementStopped(Exception):
    """SQLite stopped one of a call's statements at the call's deadline.

    Not an `sqlite3.Error`: it is not answered to the tool (which could catch it and send the next
    statement); the call itself fails as over its time limit.
    """


class _Unset:
    """Default of an optional argument the caller left out: the worker applies the real default."""

    def __copy__(self) -> _Unset:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Unset:
        return self


UNSET = _Unset()


class _Died:
    """Queued to each call in flight when its worker ends: which call's time limit ended it, if any."""

    __slots__ = ("killed_for",)

    def __init__(self, killed_for: int | None) -> None:
        self.killed_for = killed_for


class _Again(Exception):
    """A call on a served episode to send again (see `ToolWorker.call`); `error` if it may not."""

    def __init__(self, error: Exception, *, killed: bool = False) -> None:
        super().__init__(str(error))
        self.error, self.killed = error, killed


def worker_command(what: str, limits: confinement.Limits) -> list[str]:
    """The worker's argv, under OS confinement (raises `ConfinementUnavailable` when that is missing)."""
    argv = [confinement.PYTHON, "-I", str(WORKER_SCRIPT)]
    cmd = confinement.confined_command(argv, what=what, scratch_mb=limits.scratch_mb)
    return [*cmd, "--require-seccomp"] if cmd is not argv else cmd


class _StderrLog(asyncio.Protocol):
    """Logs the first lines a worker writes to stderr (tracebacks), then drops the rest."""

    def __init__(self, env: str) -> None:
        self.env = env
        self.budget = STDERR_LINES_LOGGED

    def data_received(self, data: bytes) -> None:
        for line in data.decode(errors="replace").splitlines():
            if self.budget > 0 and line.strip():
                self.budget -= 1
                log.warning("confined env %s: %s", self.env, line[:500])


class _WorkerOutput(asyncio.Protocol):
    """A worker's stdout as one event loop reads it: lines split, each acted on in this callback.

    No pump task and no queue between the pipe and a call: a statement is queued to the
    episode's SQLite thread, and a result handed to its call, straight from `data_received`.
    The first line (`Ready` or `LoadFailed`) goes to `first` instead. A line over
    `MAX_LINE_BYTES` (complete or not), or one that is not a per-call message, ends the worker.
    Output of a pipe from an earlier attachment (a detached loop) never touches the worker.
    """

    def __init__(
        self, worker: ToolWorker, proc: subprocess.Popen[bytes], first: asyncio.Future[bytes] | None
    ) -> None:
        self.worker, self.proc, self.attachment = worker, proc, worker._attachment
        self.first: asyncio.Future[bytes] | None = first
        self.buffer = bytearray()
        self.scanned = 0  # how much of `buffer` holds no newline
        self.awaiting: Result | None = None  # a result whose state's bytes are still to come

    def current(self) -> bool:
        return self.worker._proc is self.proc and self.worker._attachment == self.attachment

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        start = 0
        try:
            while True:
                if self.awaiting is not None:  # the state's raw bytes, after the result's line
                    result, need = self.awaiting, awaited_state(self.awaiting)
                    if len(buffer) - start < need:
                        break
                    result.state, start = bytes(buffer[start : start + need]), start + need
                    self.scanned, self.awaiting = start, None
                    if self.current():
                        self.worker._route(result)
                    continue
                end = buffer.find(b"\n", self.scanned)
                if end < 0:
                    break
                line, start = bytes(buffer[start : end + 1]), end + 1
                self.scanned = start
                if self.first is not None:
                    first, self.first = self.first, None
                    if not first.done():
                        first.set_result(line)
                    continue
                msg = decode_from_worker(line)
                if awaited_state(msg):
                    assert type(msg) is Result
                    self.awaiting = msg
                elif self.current():
                    self.worker._route(msg)
            if len(buffer) - start > MAX_LINE_BYTES:
                raise ProtocolError(f"a message exceeds the {MAX_LINE_BYTES}-byte limit")
        except ProtocolError as exc:
            self.buffer.clear()
            self.end(f"protocol violation: {exc}")
            return
        del buffer[:start]
        self.scanned = len(buffer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.end("it exited")

    def end(self, reason: str) -> None:
        if self.first is not None and not self.first.done():
            self.first.set_result(b"")
        self.first = None
        if self.current():
            self.worker.stop(reason)


_WORKERS: weakref.WeakSet[ToolWorker] = weakref.WeakSet()
"""Every live worker, so a closing fleet can detach those attached to its event loop."""


def detach_workers(loop: asyncio.AbstractEventLoop) -> None:
    """Detach every confined worker attached to `loop` that has no call in flight there."""
    for worker in list(_WORKERS):
        if worker.attached_to(loop):
            worker.detach()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _plain_connection(db: Any) -> PooledConnection | None:
    """The episode's connection when its statements can be run by function on its own thread.

    That is an episode's pooled connection, exactly. A connection that tracks writes in `execute`
    (synthesis's scratch connections) must see every statement through its own methods, and one
    that runs its work on the caller's thread (synthesis's inline connections) has no thread to
    queue to: those get None, and their statements take `serve_sql`.
    """
    conn = connection_of(db) if isinstance(db, Db) else None
    return conn if type(conn) is PooledConnection else None


class _Raise:
    """An exception, queued to a call in place of a message, that the call raises."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Statement:
    """A statement queued to the episode's SQLite thread: done once it has run (on that thread).

    The thread usually answers the worker itself (`ToolWorker._write_now`) and never wakes the
    event loop; a coroutine that must wait for the statement (`wait`) is woken when it is done.
    """

    __slots__ = ("_done", "_future", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._done = False
        self._future: asyncio.Future[None] | None = None

    def done(self) -> bool:
        return self._done

    def finish(self) -> None:
        """Mark it answered (any thread); set `_done` before reading `_future` (see `wait`)."""
        self._done = True
        future = self._future
        if future is not None:
            try:
                self._loop.call_soon_threadsafe(_settle, future)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def wait(self) -> asyncio.Future[None]:
        """On the loop: a future done once the statement is (`_future` is set before `_done` is
        read, so a `finish` on the thread either sees it or has already set `_done`)."""
        if self._future is None:
            self._future = self._loop.create_future()
        if self._done:
            _settle(self._future)
        return self._future


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _HostedCopy:
    """A served episode's connection as its env's worker knows it: a key, and the version of the
    committed state it holds (bumped by every change: one the worker sent and `_accept` took, or
    a write here, outside the worker, such as a task's setup rows, seen in `total_changes`)."""

    __slots__ = (
        "__weakref__",
        "_conn",
        "changes",
        "guard",
        "key",
        "max_pages",
        "page_size",
        "schema",
        "version",
    )

    def __init__(self, conn: PooledConnection, guard: Any) -> None:
        # weakly: `_COPIES` maps the connection to this, and a value that held its key would keep
        # every closed episode's connection for good
        self._conn, self.guard = weakref.ref(conn), guard
        self.key = next(_HOSTED_KEYS)
        self.version = 0
        self.changes = conn.total_changes
        self.max_pages = 0  # learnt with the first snapshot (`_snapshot`)
        self.page_size = 0
        self.schema: list[tuple[Any, ...]] = []

    @property
    def conn(self) -> PooledConnection:
        conn = self._conn()
        if conn is None:  # only while a call holds it, which keeps it alive
            raise ValueError("the episode's connection is gone")
        return conn

    def refresh(self) -> None:
        changes = self.conn.total_changes
        if changes != self.changes:
            self.version, self.changes = self.version + 1, changes


_HOSTED_KEYS = itertools.count(1)
_COPIES: weakref.WeakKeyDictionary[PooledConnection, _HostedCopy] = weakref.WeakKeyDictionary()


def _hosted(db: Any) -> _HostedCopy | None:
    """The hosted copy of a served episode's connection (one of `DedicatedPool`'s, which an
    `EpisodeStore` made), whose tool calls run their SQL in the worker; None for any other.

    Synthesis's scratch and inline connections keep the remote path (their statements are tracked
    here), and so does an episode being probed (`Episode.set_probe`: synthesis measures a tool's
    footprint through the episode's own authorizer, which must see every statement)."""
    conn = _plain_connection(db)
    if not isinstance(conn, PooledConnection) or not conn.dedicated or conn.guard is None:
        return None
    if getattr(conn.guard, "probe", None) is not None:
        return None
    copy = _COPIES.get(conn)
    if copy is None:
        copy = _COPIES[conn] = _HostedCopy(conn, conn.guard)
    return copy


def _schema(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name").fetchall()


def _snapshot(hosted: _HostedCopy) -> tuple[bytes, int]:
    """On the episode's thread: its committed database and its page cap (learnt once, with its
    schema and page size, which every state the worker sends back must keep)."""
    conn = hosted.conn.raw
    conn.set_authorizer(None)  # the project's own reads, not a tool's
    try:
        if not hosted.max_pages:
            (hosted.max_pages,) = conn.execute("PRAGMA max_page_count").fetchone()
            (hosted.page_size,) = conn.execute("PRAGMA page_size").fetchone()
            hosted.schema = _schema(conn)
        data = conn.serialize()
    finally:
        hosted.guard.install(conn)
    return data, hosted.max_pages


class _Ticket:
    """Whether a state a call committed in its worker is still wanted when its job runs."""

    __slots__ = ("wanted",)

    def __init__(self) -> None:
        self.wanted = True


def _state_problem(hosted: _HostedCopy, data: bytes) -> str | None:
    """What is wrong with a database a worker sent, for its episode, else None.

    The worker runs model-written code beside its copy, so what it sends is checked as untrusted:
    a SQLite file of the episode's page size, within the episode's page cap (its room to grow),
    with exactly the episode's schema (no table, view, index or trigger added, dropped or
    changed: a view or trigger planted here would run in this process). Its rows are the env's
    own business, as they are when its tools write them.
    """
    if len(data) < 100 or data[:16] != b"SQLite format 3\x00":
        return "is not a SQLite database"
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size != hosted.page_size or len(data) % page_size or data[18:20] != b"\x01\x01":
        return "is not in the episode's page format"
    if len(data) // page_size > hosted.max_pages:
        return "is larger than the episode may grow"
    scratch = sqlite3.connect(":memory:")
    try:
        scratch.deserialize(data)
        if _schema(scratch) != hosted.schema:
            return "changes the episode's schema"
    except sqlite3.Error as exc:
        return f"cannot be read ({type(exc).__name__})"
    finally:
        scratch.close()
    return None


def _accept(hosted: _HostedCopy, data: bytes, written: list[str], ticket: _Ticket) -> bool:
    """On the episode's thread: make `data` the episode's committed state, if the call still wants
    it and it passes `_state_problem` (else `ConfinedToolCrash`). Whether it was taken."""
    episode_conn = hosted.conn
    try:
        conn = episode_conn.raw
    except ValueError:  # closed on this thread already
        return False
    if not ticket.wanted:
        return False
    problem = _state_problem(hosted, data)
    if problem is not None:
        raise ConfinedToolCrash(f"its confined worker sent a database that {problem}; nothing was kept")
    conn.set_authorizer(None)  # `deserialize` re-attaches main; the page cap is the pager's, set again
    try:
        conn.deserialize(data)
        conn.execute(f"PRAGMA max_page_count = {hosted.max_pages}")
    finally:
        hosted.guard.install(conn)
    hosted.version, hosted.changes = hosted.version + 1, conn.total_changes
    tables = getattr(hosted.guard, "tables", None)
    record = getattr(hosted.guard, "written", None)
    if isinstance(record, set):  # the episode's `WriteTracker`: export re-reads just these
        record.update(t if tables is not None and t in tables else "*" for t in written)
    return True


class _PendingCall:
    """One call in flight: what the worker sent it and the call has not yet read, and its statements."""

    __slots__ = ("conn", "db", "deadline", "inbox", "last_statement", "transport", "waiter")

    def __init__(self, db: Any, transport: asyncio.WriteTransport, deadline: _Deadline) -> None:
        self.db, self.transport, self.deadline = db, transport, deadline
        self.conn = _plain_connection(db)
        self.inbox: collections.deque[Any] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.last_statement: _Statement | None = None  # done once every statement sent is

    def put(self, item: Any) -> None:
        self.inbox.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Any:
        while not self.inbox:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return self.inbox.popleft()


class ToolWorker:
    """One env's confined worker process, shared by every episode of that env."""

    def __init__(self, command: list[str], init: Init, tool_names: list[str], limits: confinement.Limits):
        self.command = command
        self.init = init
        self.tool_names = tool_names
        self.limits = limits
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._calls: dict[int, _PendingCall] = {}
        self._ids = itertools.count(1)
        self._death = ""
        self._read_transports: list[asyncio.BaseTransport] = []
        self._attachment = 0  # which (process, event loop) pairing the current pipes belong to
        self._write_lock = threading.Lock()
        """Held for every write to the worker's stdin, on the loop (`_write`) or a SQLite thread
        (`_write_now`), so that the two never interleave within a message."""
        self._stdin_fd: int | None = None  # the worker's stdin (ours, not a transport's) while it lives
        self._held: dict[int, int] = {}
        """The version of each served episode the live worker holds, as far as this side knows."""
        _WORKERS.add(self)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def attached_to(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self._loop is loop

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._transport is not None

    async def _ensure(self) -> asyncio.WriteTransport:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._lock is None:
            old, self._loop, self._lock = self._loop, loop, asyncio.Lock()
            if (old is None or old.is_closed()) and self._proc is not None and self._proc.poll() is None:
                # the loop that served it is gone (e.g. one loop per test): keep the worker, new pipes
                self._transport = None
                self._attachment += 1
                await self._connect(loop, None)
            else:
                self.stop("the event loop changed")
        async with self._lock:
            if not self.alive():
                self.stop("restarting")
                await self._start(loop)
        assert self._transport is not None
        return self._transport

    async def _connect(self, loop: asyncio.AbstractEventLoop, first: asyncio.Future[bytes] | None) -> None:
        """This loop's transports over duplicates of the worker's pipes (the originals stay ours).

        `first` receives the worker's first line when it is starting; a reattached worker has none.
        """
        proc = self._proc
        assert proc is not None and proc.stdout and proc.stderr and proc.stdin
        out, err, inp = (os.fdopen(os.dup(f.fileno()), mode, 0) for f, mode in (
            (proc.stdout, "rb"), (proc.stderr, "rb"), (proc.stdin, "wb")
        ))  # fmt: skip
        out_transport, _ = await loop.connect_read_pipe(lambda: _WorkerOutput(self, proc, first), out)
        err_transport, _ = await loop.connect_read_pipe(lambda: _StderrLog(self.init.env), err)
        self._read_transports = [out_transport, err_transport]
        transport, _ = await loop.connect_write_pipe(asyncio.Protocol, inp)
        with self._write_lock:
            self._transport = transport

    def detach(self) -> None:
        """Let go of the current event loop (its pipe transports); the process keeps running.

        The next call, from this loop or another, attaches again (new pipes, no restart). A fleet
        detaches when it closes, so no reader is left registered in a loop that goes on without it.
        """
        if self._calls:
            return  # calls in flight on this loop still need their pipes
        self._attachment += (
            1  # the old pipes' reader, if it ever runs again, must not declare the worker dead
        )
        with self._write_lock:
            for transport in [*self._read_transports, self._transport]:
                if transport is not None and not transport.is_closing():
                    try:
                        transport.close()
                    except RuntimeError:  # its event loop is already closed
                        pass
            self._read_transports, self._transport = [], None
        self._loop = self._lock = None

    async def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=confinement.child_environment(),
        )
        weakref.finalize(self, _kill, proc)
        self._proc = proc
        self._held = {}
        self._attachment += 1
        self.starts += 1
        first: asyncio.Future[bytes] = loop.create_future()
        await self._connect(loop, first)
        transport = self._transport
        assert transport is not None
        self._transport = None  # not alive until it said Ready
        self._write(transport, encode(self.init))
        try:
            ready = decode(STARTED, await asyncio.wait_for(first, START_TIMEOUT_S))
        except (TimeoutError, ProtocolError) as exc:
            _kill(proc)
            why = f"env {self.init.env!r}: its confined worker did not start ({exc})"
            raise ConfinedToolCrash(why) from exc
        if not isinstance(ready, Ready) or [t.name for t in ready.tools] != self.tool_names:
            _kill(proc)
            raise ConfinedToolCrash(f"env {self.init.env!r}: its confined worker came up with other tools")
        with self._write_lock:
            self._transport = transport
            self._stdin_fd = None if proc.stdin is None else proc.stdin.fileno()
        self._death = ""

    def _route(self, msg: SqlRequest | Result) -> None:
        """Hand one of the worker's messages to its call; a statement is run at once.

        Every statement is queued to the episode's SQLite thread behind the call's earlier ones,
        and answered from there: none runs on the event loop's thread, since one SQLite step (a
        JSON function over a 16 MiB document) can outlast any deadline and would hold every client.
        """
        pending = self._calls.get(msg.id)
        if pending is None:
            return  # a call that is over (cancelled, timed out): nothing it sends matters any more
        if type(msg) is SqlRequest and pending.conn is not None:
            conn = pending.conn
            loop = asyncio.get_running_loop()
            done = _Statement(loop)
            pending.last_statement = done
            then = functools.partial(self._answer, msg.id, pending, done)
            try:
                job = functools.partial(self._run_statement, conn.raw, msg, pending, done, loop, then)
                post_on_db_thread(conn, job)
            except ValueError as exc:  # the episode's connection is closed
                reply = encode(
                    SqlReply(id=msg.id, req=msg.req, error=str(exc), error_class="ProgrammingError")
                )
                then(reply, None)
            except Exception as exc:  # the call fails; the worker's pipe stays read
                then(None, exc)
            return
        pending.put(msg)

    def _run_statement(
        self,
        conn: sqlite3.Connection,
        msg: SqlRequest,
        pending: _PendingCall,
        done: _Statement,
        loop: asyncio.AbstractEventLoop,
        then: Any,
    ) -> None:
        """On the episode's SQLite thread: run one of the worker's statements and answer it.

        The answer goes straight to the worker's stdin when it fits one atomic pipe write and
        nothing is queued before it (`_write_now`): the event loop is not woken for it, one wake
        fewer per statement (each waits for a core on a loaded machine). An error, a large answer
        or a busy pipe go through the loop (`_answer`), as before.
        """
        reply: bytes | None = None
        error: BaseException | None = None
        try:
            reply = _answer_statement(conn, msg, pending.deadline)
        except BaseException as exc:  # handed to the call on the loop, never swallowed
            error = exc
        done.finish()  # it has run: a result of the call that comes next need not wait for it
        if reply is not None and len(reply) <= _ATOMIC_WRITE and self._write_now(pending, reply):
            return
        try:
            loop.call_soon_threadsafe(then, reply, error)
        except RuntimeError:  # its event loop is closed: nobody waits for the answer
            pass

    def _write_now(self, pending: _PendingCall, data: bytes) -> bool:
        """Write `data` to the worker's stdin from this (a SQLite) thread, if that keeps the order:
        the call's pipe is the live one and its transport holds nothing unwritten. Whether it was
        written; a write of at most PIPE_BUF bytes to a pipe is whole or not at all."""
        with self._write_lock:
            transport, fd = pending.transport, self._stdin_fd
            if fd is None or transport is not self._transport or transport.is_closing():
                return False
            if transport.get_write_buffer_size():
                return False
            try:
                return os.write(fd, data) == len(data)
            except OSError:  # a full pipe (the loop will buffer it) or a dead worker (the loop sees it)
                return False

    def _write(self, transport: asyncio.WriteTransport, data: bytes) -> None:
        """Write to the worker's stdin from the loop (see `_write_lock`)."""
        with self._write_lock:
            transport.write(data)

    def _answer(
        self,
        call_id: int,
        pending: _PendingCall,
        done: _Statement,
        reply: bytes | None,
        exc: BaseException | None,
    ) -> None:
        """On the loop: send a statement's answer, if its call still waits for it."""
        done.finish()
        if self._calls.get(call_id) is not pending:
            return
        if exc is not None:
            pending.put(_Raise(_out_of_memory() if isinstance(exc, MemoryError) else exc))
        elif reply is not None and not pending.transport.is_closing():
            self._write(pending.transport, reply)

    def stop(self, reason: str, killed_for: int | None = None) -> None:
        """Kill the worker (if any) and fail the calls it was running (`killed_for`: the call whose
        time limit ended it)."""
        proc, self._proc = self._proc, None
        with self._write_lock:  # no SQLite thread writes to a pipe being closed
            transport, self._transport, self._stdin_fd = self._transport, None, None
            if transport is not None and not transport.is_closing():
                try:
                    transport.close()
                except RuntimeError:  # its event loop is already closed
                    pass
            if proc is not None and proc.stdin is not None:
                proc.stdin.close()
        if proc is not None:
            _kill(proc)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            self._death = f"{reason}; exit status {proc.returncode}"
            for pending in self._calls.values():
                pending.put(_Died(killed_for))

    async def call(self, db: Any, tool: str, arguments: dict[str, Any], read_only: bool = False) -> str:
        """Run `tool` in the worker; the rendered result text.

        On a served episode (`_hosted`) the tool runs on the worker's copy of the episode's
        committed state, and a change it commits is taken into the episode here (`_accept`);
        otherwise the worker's statements are served with `db`. A call on a served episode is
        sent again, once, when the worker no longer held the episode's version (`stale`: the
        state goes with it), or when the worker was killed for another call's time limit while
        this one ran: nothing of it was kept, so it runs again on the new worker, within what
        is left of its own time limit.
        """
        hosted = _hosted(db)
        deadline = _Deadline(time.monotonic() + self.limits.call_timeout_s)
        if hosted is None:
            return await self._call(db, tool, arguments, deadline, None, read_only, False)
        with_state = retried = False
        while True:
            try:
                return await self._call(db, tool, arguments, deadline, hosted, read_only, with_state)
            except _Again as again:
                if (retried if again.killed else with_state) or time.monotonic() >= deadline.at:
                    raise again.error from None
                if again.killed:
                    retried = True
                else:
                    with_state = True

    async def _call(
        self,
        db: Any,
        tool: str,
        arguments: dict[str, Any],
        deadline: _Deadline,
        hosted: _HostedCopy | None,
        read_only: bool,
        with_state: bool,
    ) -> str:
        transport = await self._ensure()
        call_id = next(self._ids)
        limit = self.limits.call_timeout_s
        message = Call(id=call_id, tool=tool, arguments=to_wire(arguments))
        if hosted is not None:
            hosted.refresh()
            message.episode, message.version = hosted.key, hosted.version
            if with_state or self._held.get(hosted.key) != hosted.version:
                data, max_pages = await on_db_thread(hosted.conn, _snapshot, hosted)
                message.state, message.max_pages = data, max_pages
                transport = await self._ensure()  # the worker may have been replaced meanwhile
                self._held[hosted.key] = hosted.version
            else:
                message.max_pages = hosted.max_pages
        pending = _PendingCall(db, transport, deadline)
        self._calls[call_id] = pending
        proc = self._proc
        returned = again = answered = False
        try:
            self._write(transport, encode(message))
            async with asyncio.timeout(max(0.0, deadline.at - time.monotonic())):
                while True:
                    msg = await pending.get()
                    if type(msg) is _Died:
                        error = ConfinedToolCrash(f"tool '{tool}': its confined worker died ({self._death})")
                        if hosted is not None and msg.killed_for not in (None, call_id):
                            again = True
                            raise _Again(error, killed=True)
                        raise error
                    if type(msg) is _Raise:
                        raise msg.exc
                    if type(msg) is SqlRequest:
                        if not transport.is_closing():
                            self._write(transport, await serve_sql(db, msg, deadline))
                        continue
                    assert type(msg) is Result
                    answered = msg.outcome != "stale"
                    last = pending.last_statement
                    if last is not None and not last.done():
                        # a result sent before a statement's answer (a tool that did not await it):
                        # that statement still runs before the runtime commits or rolls back
                        await last.wait()
                    if msg.state is not None:
                        if hosted is None or read_only:
                            raise ConfinedToolCrash(f"tool '{tool}': its worker sent a state it may not")
                        await self._accept(hosted, msg)
                    if msg.outcome == "ok":
                        returned = True
                        return msg.text
                    if msg.outcome == "stale" and hosted is not None:
                        again = True
                        raise _Again(ConfinedToolCrash(f"tool '{tool}': its worker lost the episode"))
                    if msg.outcome == "refused":
                        raise ToolError(msg.text)
                    if msg.outcome == "invalid":
                        raise InvalidArguments(msg.text)
                    raise ConfinedToolCrash(msg.text)
        except (TimeoutError, _StatementStopped):
            if self._proc is proc:
                self.stop(f"a call to '{tool}' ran past {limit:g}s", killed_for=call_id)
            deadline.expire()
            why = f"it ran past its time limit of {limit:g}s and was stopped"
            if not await _statement_ends(pending):
                raise ConfinedStatementStuck(why) from None
            raise ConfinedToolTimeout(why) from None
        except StatementOutOfMemory:  # refused here: the worker's call waits for no more answers
            if self._transport is transport and not transport.is_closing():
                self._write(transport, encode(Cancel(id=call_id)))
            raise
        except asyncio.CancelledError:
            if self._transport is transport and not transport.is_closing():
                self._write(transport, encode(Cancel(id=call_id)))
            _interrupt(pending)
            raise
        finally:
            if not returned and not again:  # what of it still runs or waits on the SQLite thread stops
                deadline.expire()
            if hosted is not None and not answered:  # the worker's copy may be ahead of the episode's
                self._held.pop(hosted.key, None)
            self._calls.pop(call_id, None)

    async def _accept(self, hosted: _HostedCopy, msg: Result) -> None:
        """Take the state a call committed in the worker into the episode, unless the call is over
        (cancelled) before the job runs; the worker then holds a version the episode does not, and
        gets the episode's own state with its next call."""
        assert msg.state is not None
        data = msg.state
        ticket = _Ticket()
        self._held.pop(hosted.key, None)
        try:
            accepted = await on_db_thread(hosted.conn, _accept, hosted, data, msg.written or [], ticket)
        except BaseException:
            ticket.wanted = False
            raise
        if accepted:
            self._held[hosted.key] = hosted.version


_ATOMIC_WRITE = select.PIPE_BUF
"""The largest write to a pipe that POSIX makes atomic: an answer the SQLite thread writes itself."""
STUCK_GRACE_S = 0.5
"""How long a call over its time limit waits for its statement to stop before it is answered
without it (`ConfinedStatementStuck`): SQLite checks the deadline between program steps, which
come every few microseconds unless one step is a whole JSON document or sort of huge values."""


def _interrupt(pending: _PendingCall) -> None:
    """Interrupt the statement of `pending` that is running, if any (`sqlite3_interrupt`: from any
    thread; SQLite stops at its next check, as for the deadline)."""
    last = pending.last_statement
    conn = pending.conn
    if last is not None and not last.done() and conn is not None:
        conn.interrupt()


async def _statement_ends(pending: _PendingCall) -> bool:
    """Whether the call's pending statement (if any) ends within `STUCK_GRACE_S` of its deadline."""
    last = pending.last_statement
    if last is None or last.done():
        return True
    _interrupt(pending)
    await asyncio.wait([last.wait()], timeout=STUCK_GRACE_S)
    return last.done()


def _answer_statement(conn: sqlite3.Connection, msg: SqlRequest, deadline: _Deadline) -> bytes:
    """Run one of the worker's statements on the episode's connection; the encoded `SqlReply`.

    SQLite stops the statement at `deadline` (a progress handler: it holds this thread, which the
    worker's kill cannot free), and then `_StatementStopped` is raised instead of an answer. Runs
    on whichever thread calls it, so it bounds a statement on the SQLite thread and on the event
    loop's alike. No value it makes or reads may be longer than an answer can be
    (`SQLITE_LIMIT_LENGTH`): `zeroblob(10**9)` would otherwise be a gigabyte in this process
    before any count of the result could refuse it.
    """
    if time.monotonic() > deadline.at:
        raise _StatementStopped  # queued behind a call that has failed or run out of time
    stopped = False

    def past_deadline() -> bool:
        nonlocal stopped
        stopped = stopped or time.monotonic() > deadline.at
        return stopped

    conn.set_progress_handler(past_deadline, _PROGRESS_STEPS)
    length = conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_MESSAGE_BYTES)
    pattern = conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN)
    program = conn.setlimit(sqlite3.SQLITE_LIMIT_VDBE_OP, MAX_PROGRAM)
    try:
        reply = _run_request(conn, msg)
    finally:
        conn.setlimit(sqlite3.SQLITE_LIMIT_VDBE_OP, program)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, pattern)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, length)
        conn.set_progress_handler(None, 0)
    if stopped:  # its interruption was answered as an SQL error: the call fails instead
        raise _StatementStopped
    return reply


def _run_request(conn: sqlite3.Connection, msg: SqlRequest) -> bytes:
    """`_answer_statement`'s work: the same operations as the `Db` methods the worker's `RemoteDb`
    mirrors, one trip each."""
    params = from_wire(msg.params)
    if params is None:
        params = ()
    try:
        op = msg.op
        if op == "execute":
            columns, rows, rowcount, lastrowid = _run_statement(conn, msg.sql, params)
            reply = SqlReply(
                msg.id,
                msg.req,
                columns=columns,
                rows=rows,
                rowcount=rowcount,
                lastrowid=lastrowid,
            )
        elif op == "executemany":
            conn.executemany(msg.sql, params).close()
            reply = SqlReply(msg.id, msg.req)
        elif op == "execute_fetchall" or op == "fetch_all":
            columns, rows, _, _ = _run_statement(conn, msg.sql, params)
            if op == "fetch_all":
                reply = SqlReply(msg.id, msg.req, columns=(columns or []) if rows else [], rows=rows)
            else:
                reply = SqlReply(msg.id, msg.req, rows=rows)
        elif op == "fetch_one":
            row = _first_row(conn, msg.sql, params)
            reply = SqlReply(
                msg.id,
                msg.req,
                columns=[] if row is None else row[0],
                rows=[] if row is None else rows_to_wire([row[1]]),
            )
        else:
            value = _first_row(conn, msg.sql, params)
            reply = SqlReply(msg.id, msg.req, rows=rows_to_wire([[None if value is None else value[1][0]]]))
    except sqlite3.Error as exc:
        reply = SqlReply(msg.id, msg.req, error=str(exc), error_class=type(exc).__name__)
    except (TypeError, ValueError) as exc:
        reply = SqlReply(msg.id, msg.req, error=str(exc), error_class="ProgrammingError")
    except _ResultTooLarge:
        return _too_large(msg)
    try:
        return encode(reply)
    except ProtocolError:
        return _too_large(msg)


def _too_large(msg: SqlRequest) -> bytes:
    """The answer to a statement whose result cannot be sent: an SQL error in the tool."""
    return encode(SqlReply(msg.id, msg.req, error="result too large", error_class="OperationalError"))


Statement = tuple[list[str] | None, list[list[Any]], int, int | None]

_ROW_COST = 64
"""Bytes a fetched row is counted for, besides its values: about what its list takes here."""
_VALUE_COST = 16
"""Bytes each value is counted for, besides a string's or blob's length."""


class _ResultTooLarge(Exception):
    """A statement's rows, counted as they were fetched, passed `MAX_MESSAGE_BYTES`."""


def _run_statement(conn: sqlite3.Connection, sql: str, params: Any) -> Statement:
    """Run a statement; its column names, its rows as they go on the wire, rowcount, lastrowid.

    The rows are fetched one at a time and counted as they come: a result that could never be sent
    (over `MAX_MESSAGE_BYTES` on the wire) must not first be held whole here, since the tool picks
    the row count (a million rows of a megabyte were a gigabyte in this process). A row counts
    `_ROW_COST`, a value `_VALUE_COST` plus the length of a string or blob (a blob as base64), at
    least what they take here and on the wire; past the limit the fetch stops with
    `_ResultTooLarge`. One row is at most what SQLite's value-length limit allows (see
    `_answer_statement`).
    """
    cur = conn.execute(sql, params)
    try:
        desc = cur.description
        rows: list[list[Any]] = []
        size = 0
        for row in cur:
            size += _ROW_COST + _VALUE_COST * len(row)
            blob = False
            for value in row:
                kind = type(value)
                if kind is str:
                    size += len(value)
                elif kind is bytes:
                    size += len(value) * 4 // 3
                    blob = True
            if size > MAX_MESSAGE_BYTES:
                raise _ResultTooLarge
            rows.append([to_wire(v) for v in row] if blob else list(row))
        return (None if desc is None else [d[0] for d in desc]), rows, cur.rowcount, cur.lastrowid
    finally:
        cur.close()


def _first_row(conn: sqlite3.Connection, sql: str, params: Any) -> tuple[list[str], list[Any]] | None:
    cur = conn.execute(sql, params)
    try:
        row = cur.fetchone()
        return None if row is None else ([d[0] for d in cur.description], list(row))
    finally:
        cur.close()


def _answer_tracked(conn: sqlite3.Connection, sql: str, msg: SqlRequest, deadline: _Deadline) -> bytes:
    """`_answer_statement`, with the statement's text (`msg.sql`) as the second argument, where a
    scratch connection's `_execute` looks for it to learn what the statement writes."""
    return _answer_statement(conn, msg, deadline)


async def serve_sql(db: Any, msg: SqlRequest, deadline: _Deadline) -> bytes:
    """Run one of the worker's statements through the connection's own `_execute`; the encoded
    `SqlReply`.

    For connections that run their statements themselves, on the caller's thread (synthesis's
    inline and scratch connections; the scratch ones track what each statement text writes, and
    see this one as they see a `Db`'s). On the event loop's thread `asyncio.timeout` cannot fire
    while a statement runs: `_answer_statement`'s deadline is what stops an endless one there.
    """
    conn = connection_of(db)
    try:
        return await on_db_thread(conn, _answer_tracked, conn.raw, msg.sql, msg, deadline)
    except sqlite3.Error as exc:  # a cached statement outside the tool's writes, refused unrun
        reply = SqlReply(id=msg.id, req=msg.req, error=str(exc), error_class=type(exc).__name__)
    except ValueError as exc:  # the connection is closed
        reply = SqlReply(id=msg.id, req=msg.req, error=str(exc), error_class="ProgrammingError")
    except MemoryError:  # SQLite's heap limit (`sqlheap`): the call is refused
        raise _out_of_memory() from None
    return encode(reply)


def _spec(worker: ToolWorker, d: ToolDescription) -> ToolSpec:
    fields: dict[str, Any] = {p: (Any, ... if p in d.required else UNSET) for p in d.parameters}
    arguments_model = create_model(f"{d.name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    name = d.name
    read_only = not d.writes

    async def forward(db: Any, **kwargs: Any) -> str:
        return await worker.call(db, name, {k: v for k, v in kwargs.items() if v is not UNSET}, read_only)

    forward.__name__ = name
    return ToolSpec(
        name=name,
        description=d.description,
        fn=forward,
        input_schema=d.input_schema,
        arguments_model=arguments_model,
        parameters=tuple(d.parameters),
        required=frozenset(d.required),
        writes=tuple(d.writes),
        source_line=d.source_line,
        side=d.side,
    )


STDERR_TAIL_BYTES = 4096
"""How much of the end of a describing worker's stderr is kept, for the reason it failed."""
_CHUNK = 1 << 16


class _OutputFlood(Exception):
    """A describing worker wrote more than `MAX_MESSAGE_BYTES` on stdout or stderr; it was killed."""


def _first_line(command: list[str], data: bytes, timeout: float) -> tuple[bytes, bytes]:
    """Run `command` with `data` on its stdin; its first stdout line and the tail of its stderr.

    Both pipes are read as the worker writes them, with no more kept than one message on stdout and
    `STDERR_TAIL_BYTES` of stderr: a tools.py that printed 600 MB at import cost this process
    1.2 GB when its output was captured whole. The worker is killed as soon as either stream passes
    `MAX_MESSAGE_BYTES` (`_OutputFlood`), or once its first line is complete (it needs no more),
    or at `timeout` (`subprocess.TimeoutExpired`).
    """
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=confinement.child_environment(),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    written = err_total = 0
    line_done = False
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as selector:
            os.set_blocking(proc.stdin.fileno(), False)
            selector.register(proc.stdin, selectors.EVENT_WRITE)
            selector.register(proc.stdout, selectors.EVENT_READ)
            selector.register(proc.stderr, selectors.EVENT_READ)
            while selector.get_map() and not line_done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(command, timeout)
                for key, _ in selector.select(left):
                    pipe = key.fileobj
                    if pipe is proc.stdin:
                        try:
                            written += os.write(proc.stdin.fileno(), data[written : written + _CHUNK])
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:  # it exited without reading everything
                            written = len(data)
                        if written >= len(data):
                            selector.unregister(proc.stdin)
                            proc.stdin.close()
                        continue
                    assert pipe is proc.stdout or pipe is proc.stderr
                    chunk = os.read(pipe.fileno(), _CHUNK)
                    if not chunk:
                        selector.unregister(pipe)
                    elif pipe is proc.stdout:
                        out += chunk
                        line_done = b"\n" in chunk
                        if len(out) > MAX_MESSAGE_BYTES and not line_done:
                            raise _OutputFlood
                    else:
                        err_total += len(chunk)
                        err += chunk
                        del err[:-STDERR_TAIL_BYTES]
                        if err_total > MAX_MESSAGE_BYTES:
                            raise _OutputFlood
    finally:
        _kill(proc)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
    return bytes(out.split(b"\n", 1)[0]), bytes(err)


def _describe(command: list[str], init: Init, path: Path) -> Ready:
    try:
        first, stderr = _first_line(command, encode(init), START_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        why = f"importing took longer than {START_TIMEOUT_S:g}s"
        raise EnvLoadError([LoadProblem(path, None, why)]) from exc
    except _OutputFlood as exc:
        why = f"the confined worker wrote more than {MAX_MESSAGE_BYTES} bytes while loading; it was stopped"
        raise EnvLoadError([LoadProblem(path, None, why)]) from exc
    try:
        reply = decode(STARTED, first)
    except ProtocolError as exc:
        tail = (stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise EnvLoadError([LoadProblem(path, None, f"confined worker failed: {tail[:300]}")]) from exc
    if isinstance(reply, LoadFailed):
        raise EnvLoadError([LoadProblem(path, p.line, p.message) for p in reply.problems])
    if not isinstance(reply, Ready):
        raise EnvLoadError([LoadProblem(path, None, f"confined worker answered {reply.type!r}")])
    return reply


def load_confined_tools(
    path: Path, manifest: EnvManifest, limits: confinement.Limits | None = None
) -> dict[str, ToolSpec]:
    """The specs of a confined env's tools, learned from a sandboxed worker (never imported here)."""
    limits = limits or DEFAULT_LIMITS
    try:
        command = worker_command(f"env {manifest.name!r}", limits)
    except confinement.ConfinementUnavailable as exc:
        raise EnvLoadError([LoadProblem(path, None, str(exc))]) from exc
    init = Init(
        env=manifest.name,
        filename=str(path),
        source=path.read_text(encoding="utf-8"),
        argument_errors=manifest.argument_errors,
        limits=limits.to_json(),
    )
    ready = _describe(command, init, path)
    worker = ToolWorker(command, init, [t.name for t in ready.tools], limits)
    return {d.name: _spec(worker, d) for d in ready.tools}
