"""The confined worker: imports one env's model-written tools.py inside the sandbox and serves calls.

Run as a script (`python -I confined_worker.py [--require-seccomp]`) under bubblewrap by
`confined_tools.ToolWorker`. It first builds a light `envforge.server` package (modules of the
core and the sandbox only: no MCP, no HTTP) so that starting it is cheap, reads the `Init` line (the
tools source travels over the pipe: the worker cannot even read the env folder), confines itself
(`confinement_inner`), and only then executes tools.py. It answers `Ready` with the tool specs,
then serves `Call`s concurrently: each call's coroutine is stepped by hand from the pipe's
reader callback (`_DrivenCall`), not by an asyncio task, since a call is mostly waits for its
statements and a task step per message is most of a message's cost. A call on a served episode
(`Call.episode`) runs on the worker's own copy of that episode (`sqlhost`: its SQL runs here,
under this process's limits, and a committed change goes back with the result); any other call
gets a `RemoteDb`, whose every statement is a `SqlRequest` the parent runs on its connection
(synthesis's scratch and inline databases). Protocol output goes to a private duplicate of
stdout; fd 1 is pointed at stderr so a tool's `print` cannot forge protocol lines.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sqlite3
import sys
import time
import traceback
import types
from collections.abc import Callable, Coroutine, Generator, Iterable
from pathlib import Path
from typing import Any

SERVER_DIR = Path(__file__).resolve().parents[1]


def _light_package() -> types.ModuleType:
    """`envforge.server` without its `__init__` (which imports MCP and HTTP: seconds of start-up).

    Its parent `envforge` is an empty stand-in: the top-level package's folder (the API, which
    imports every package) is not in the worker's view, and the worker needs nothing from it.
    """
    top = types.ModuleType("envforge")
    top.__path__ = []
    sys.modules["envforge"] = top
    pkg = types.ModuleType("envforge.server")
    pkg.__path__ = [str(SERVER_DIR)]
    pkg.__package__ = "envforge.server"
    sys.modules["envforge.server"] = pkg
    from envforge.server.core import db, errors, tooldef

    pkg.tool = tooldef.tool  # type: ignore[attr-defined]
    pkg.Side = tooldef.Side  # type: ignore[attr-defined]
    pkg.ToolError = errors.ToolError  # type: ignore[attr-defined]
    pkg.Db = db.Db  # type: ignore[attr-defined]
    return pkg


_light_package()

from envforge.server.core import arguments, references, results, sqlheap, tooldef  # noqa: E402
from envforge.server.core.errors import EnvLoadError, ToolError  # noqa: E402
from envforge.server.core.tooldef import ToolSpec  # noqa: E402
from envforge.server.sandbox import confinement_inner, sqlhost  # noqa: E402
from envforge.server.sandbox.confined_protocol import (  # noqa: E402
    INIT,
    MAX_LINE_BYTES,
    MAX_MESSAGE_BYTES,
    Call,
    Cancel,
    Init,
    LoadFailed,
    Problem,
    ProtocolError,
    Ready,
    Result,
    SqlOp,
    SqlReply,
    SqlRequest,
    ToolDescription,
    awaited_state,
    decode,
    decode_to_worker,
    encode,
    from_wire,
    row_from_wire,
    to_wire,
)

READ_CHUNK = 1 << 16


def _param(value: Any) -> Any:
    """What sqlite3 would store for a parameter (its default date adapters), as JSON."""
    if isinstance(value, dt.datetime):
        return value.isoformat(" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return to_wire(value)


def _params(params: Any) -> Any:
    if isinstance(params, dict):
        return {str(k): _param(v) for k, v in params.items()}
    return [_param(v) for v in params]


def _sql_error(reply: SqlReply) -> Exception:
    if reply.error_class == "ToolError":
        return ToolError(reply.error or "")
    cls = getattr(sqlite3, reply.error_class or "", None)
    if isinstance(cls, type) and issubclass(cls, sqlite3.Error):
        return cls(reply.error)
    return sqlite3.DatabaseError(reply.error)


class _Suspend:
    """What a hand-driven tool yields while its statement is away: the driver sends the reply in."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, int]) -> None:
        self.key = key

    def __await__(self) -> Generator[_Suspend, SqlReply, SqlReply]:
        reply = yield self
        return reply


class Channel:
    """The worker's end of the pipes: sends lines, routes each SQL reply to the statement awaiting it.

    A call's coroutine is driven by hand (`_DrivenCall`), so a statement costs no asyncio task
    step: the coroutine yields a `_Suspend`, and the reply is sent straight into it from the
    pipe's reader callback. A statement awaited elsewhere (in a task the tool started itself)
    waits on an asyncio future instead.
    """

    def __init__(self, protocol_fd: int) -> None:
        self.fd = protocol_fd
        self.suspended: dict[tuple[int, int], _DrivenCall] = {}
        self.waiting: dict[tuple[int, int], asyncio.Future[SqlReply]] = {}
        self.driving: int | None = None  # the id of the call being stepped by hand right now
        self.next_req = 0

    def send(self, message: Any) -> None:
        data = memoryview(encode(message))
        while data:
            data = data[os.write(self.fd, data) :]

    async def sql(self, call_id: int, op: SqlOp, sql: str, params: Any) -> SqlReply:
        self.next_req += 1
        key = (call_id, self.next_req)
        if self.driving == call_id:
            self.send(SqlRequest(id=call_id, req=key[1], op=op, sql=sql, params=params))
            reply = await _Suspend(key)
        else:
            future: asyncio.Future[SqlReply] = asyncio.get_running_loop().create_future()
            self.waiting[key] = future
            try:
                self.send(SqlRequest(id=call_id, req=key[1], op=op, sql=sql, params=params))
                reply = await future
            finally:
                self.waiting.pop(key, None)
        if reply.error is not None:
            raise _sql_error(reply)
        return reply

    def deliver(self, reply: SqlReply) -> None:
        key = (reply.id, reply.req)
        call = self.suspended.pop(key, None)
        if call is not None:
            call.step(reply)
            return
        future = self.waiting.get(key)
        if future is not None and not future.done():
            future.set_result(reply)


class RemoteCursor(sqlhost.FetchedCursor):
    """The rows of one executed statement, already fetched by the parent."""

    def __init__(self, reply: SqlReply) -> None:
        cols = reply.columns
        blank = (None,) * 6
        self.description = None if cols is None else tuple((c, *blank) for c in cols)
        self.rowcount = reply.rowcount
        self.lastrowid = reply.lastrowid
        self._rows = [row_from_wire(r) for r in reply.rows]


class _PendingCursor:
    """`db.execute(...)`: awaitable for a cursor, or `async with` (as `Db.execute` allows)."""

    def __init__(self, db: RemoteDb, sql: str, params: Any) -> None:
        self._db, self._sql, self._params = db, sql, params

    async def _run(self) -> RemoteCursor:
        reply = await self._db._channel.sql(self._db._call, "execute", self._sql, _params(self._params))
        return RemoteCursor(reply)

    def __await__(self) -> Any:
        return self._run().__await__()

    async def __aenter__(self) -> RemoteCursor:
        return await self._run()

    async def __aexit__(self, *exc: object) -> None:
        return None


class RemoteDb:
    """`envforge.server.Db`'s methods, each statement run by the parent on the episode's connection."""

    __slots__ = ("_call", "_channel")

    def __init__(self, channel: Channel, call_id: int) -> None:
        self._channel = channel
        self._call = call_id

    def execute(self, sql: str, params: Any = ()) -> _PendingCursor:
        return _PendingCursor(self, sql, params)

    async def executemany(self, sql: str, rows: Iterable[Any]) -> None:
        await self._channel.sql(self._call, "executemany", sql, [_params(r) for r in rows])

    async def execute_fetchall(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        reply = await self._channel.sql(self._call, "execute_fetchall", sql, _params(params))
        return [row_from_wire(r) for r in reply.rows]

    async def fetch_all(self, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        reply = await self._channel.sql(self._call, "fetch_all", sql, _params(params))
        cols = reply.columns or []
        return [dict(zip(cols, row_from_wire(r), strict=True)) for r in reply.rows]

    async def fetch_one(self, sql: str, params: Any = ()) -> dict[str, Any] | None:
        reply = await self._channel.sql(self._call, "fetch_one", sql, _params(params))
        if not reply.rows:
            return None
        return dict(zip(reply.columns or [], row_from_wire(reply.rows[0]), strict=True))

    async def fetch_value(self, sql: str, params: Any = ()) -> Any:
        reply = await self._channel.sql(self._call, "fetch_value", sql, _params(params))
        return from_wire(reply.rows[0][0]) if reply.rows else None

    async def require_one(self, sql: str, params: Any, missing: str) -> dict[str, Any]:
        row = await self.fetch_one(sql, params)
        if row is None:
            raise ToolError(missing)
        return row


class _Manifest:
    def __init__(self, argument_errors: str) -> None:
        self.argument_errors = argument_errors
        self.python_owner = None
        self.python_owners: dict[str, str] = {}


class _EnvShim:
    """What `arguments.check_arguments` reads of an env: its argument-error style."""

    def __init__(self, argument_errors: str) -> None:
        self.manifest = _Manifest(argument_errors)


class _Hosting:
    """What a call on a hosted episode needs: the episodes held here and the call's deadline."""

    def __init__(self, host: sqlhost.Host, call_timeout_s: float) -> None:
        self.host, self.call_timeout_s = host, call_timeout_s


async def _run_call(
    channel: Channel, tools: dict[str, ToolSpec], env: _EnvShim, msg: Call, hosting: _Hosting
) -> None:
    spec = tools.get(msg.tool)
    hosted: sqlhost.Hosted | None = None
    state: sqlhost.CallState | None = None
    changes = 0
    try:
        if spec is None:
            channel.send(Result(id=msg.id, outcome="invalid", text=f"Tool '{msg.tool}' not found."))
            return
        kwargs, problem = arguments.check_arguments(env, spec, msg.arguments)
        if problem is not None:  # the agent's mistake, as in-process: not a refusal of the env
            channel.send(Result(id=msg.id, outcome="invalid", text=problem))
            return
        assert kwargs is not None
        db: Any
        if msg.episode is None:
            db = RemoteDb(channel, msg.id)
        else:
            hosted = hosting.host.open(msg.episode, msg.version, msg.state, msg.max_pages)
            if hosted is None:
                channel.send(Result(id=msg.id, outcome="stale", text=""))
                return
            # the parent kills this worker at the call's limit; this deadline is the worker's own
            deadline = time.monotonic() + hosting.call_timeout_s + 1.0
            db, state, changes = sqlhost.begin(hosted, spec.write_set, deadline)
        value = await spec.fn(db, **kwargs)
        try:
            text = results.render_result(value)
        except Exception as exc:
            raise ToolError(f"tool '{msg.tool}' returned a value that cannot be shown: {exc}") from exc
        if hosted is None:
            channel.send(Result(id=msg.id, outcome="ok", text=text))
        else:
            assert state is not None
            _answer_hosted(channel, hosting, msg, spec, hosted, state, changes, text)
            hosted = None
    except ToolError as exc:
        _refuse(channel, hosting, msg.id, state, "refused", str(exc))
    except (sqlite3.IntegrityError, OverflowError) as exc:  # the data refused the agent's values
        rejected = arguments.values_rejected(exc, msg.arguments if isinstance(msg.arguments, dict) else {})
        if rejected is None:
            if not references.breaks_a_foreign_key(exc):  # that one the parent judges (and logs)
                traceback.print_exc(file=sys.stderr)
            _refuse(channel, hosting, msg.id, state, "crashed", str(exc) or type(exc).__name__)
        else:
            _refuse(channel, hosting, msg.id, state, "invalid", rejected)
    except asyncio.CancelledError:
        raise  # the parent gave up on this call; it expects no answer
    except BaseException as exc:  # MemoryError, RecursionError, SystemExit: env bugs
        traceback.print_exc(file=sys.stderr)
        _refuse(channel, hosting, msg.id, state, "crashed", str(exc) or type(exc).__name__)
    finally:
        if hosted is not None:  # refused, crashed or cancelled: nothing of the call is kept
            try:
                sqlhost.finish(hosted, commit=False)
            except BaseException:  # a copy that cannot be rolled back is let go; the parent resends
                hosting.host.forget(msg.episode or 0)


def _refuse(
    channel: Channel,
    hosting: _Hosting,
    call_id: int,
    state: sqlhost.CallState | None,
    outcome: Any,
    text: str,
) -> None:
    """Answer a call that failed; a statement that met the heap limit or the deadline decides how,
    whatever the tool made of its error."""
    if state is not None and state.out_of_memory:
        outcome, text = "refused", sqlhost.out_of_memory_text(hosting.host.work_bytes)
    elif state is not None and state.stopped:
        outcome, text = "crashed", "its statements ran past the call's time limit"
    channel.send(Result(id=call_id, outcome=outcome, text=text))


def _answer_hosted(
    channel: Channel,
    hosting: _Hosting,
    msg: Call,
    spec: ToolSpec,
    hosted: sqlhost.Hosted,
    state: sqlhost.CallState,
    changes: int,
    text: str,
) -> None:
    """A hosted call returned: keep what it changed (committed, sent whole) or explain why not."""
    changed = hosted.conn.total_changes != changes
    if state.out_of_memory or state.stopped or (changed and spec.read_only):
        sqlhost.finish(hosted, commit=False)
        if changed and spec.read_only and not (state.out_of_memory or state.stopped):
            channel.send(Result(id=msg.id, outcome="crashed", text="a read tool changed the database"))
        else:
            _refuse(channel, hosting, msg.id, state, "crashed", "")
        return
    if not changed:
        sqlhost.finish(hosted, commit=False)  # an open transaction that wrote nothing
        channel.send(Result(id=msg.id, outcome="ok", text=text))
        return
    failure = sqlhost.finish(hosted, commit=True)
    if failure is not None:  # a deferred constraint the tool's writes broke surfaces at COMMIT
        why = f"its writes broke a constraint at commit: {failure}"
        channel.send(Result(id=msg.id, outcome="crashed", text=why))
        return
    hosted.version = msg.version + 1
    data = hosted.conn.serialize()
    written = sorted(hosted.guard.written)
    channel.send(Result(id=msg.id, outcome="ok", text=text, state=data, written=written))


class _DrivenCall:
    """One call's coroutine, stepped by hand instead of by an asyncio task.

    A tool awaits its `RemoteDb` almost always; stepping its coroutine straight from the pipe's
    reader callback saves the task machinery (a loop iteration and a future per statement).
    Whatever else it awaits is honoured as an asyncio task would: an asyncio future resumes it
    from that future's done-callback, a bare `yield` (`asyncio.sleep(0)`) on the next loop pass.
    """

    __slots__ = ("_future", "_handle", "channel", "coro", "id", "idle", "running")

    def __init__(
        self,
        channel: Channel,
        call_id: int,
        coro: Coroutine[Any, Any, None],
        running: dict[int, _DrivenCall],
        idle: Callable[[], None],
    ) -> None:
        self.channel, self.id, self.coro, self.running, self.idle = channel, call_id, coro, running, idle
        self._future: asyncio.Future[Any] | None = None
        self._handle: asyncio.Handle | None = None

    def step(self, value: Any = None, exc: BaseException | None = None) -> None:
        self._future = self._handle = None
        channel = self.channel
        channel.driving = self.id
        try:
            yielded = self.coro.send(value) if exc is None else self.coro.throw(exc)
        except BaseException:  # _run_call answered (or was cancelled): the call is over
            self.running.pop(self.id, None)
            if not self.running:
                self.idle()
            return
        finally:
            channel.driving = None
        if type(yielded) is _Suspend:
            channel.suspended[yielded.key] = self
        elif asyncio.isfuture(yielded) and getattr(yielded, "_asyncio_future_blocking", False):
            yielded._asyncio_future_blocking = False
            self._future = yielded
            yielded.add_done_callback(self._wake)
        elif yielded is None:
            self._handle = asyncio.get_running_loop().call_soon(self.step)
        else:
            error = RuntimeError(f"a confined tool awaited something other than its database: {yielded!r}")
            self._handle = asyncio.get_running_loop().call_soon(self.step, None, error)

    def _wake(self, _future: asyncio.Future[Any]) -> None:
        self.step()

    def cancel(self) -> None:
        """As `Task.cancel`: what it waits on is dropped and `CancelledError` is raised inside it."""
        for key in [k for k, call in self.channel.suspended.items() if call is self]:
            del self.channel.suspended[key]
        if self._future is not None:
            self._future.remove_done_callback(self._wake)
            self._future.cancel()
        if self._handle is not None:
            self._handle.cancel()
        self.step(None, asyncio.CancelledError())


class _Serving:
    """Reads the parent's lines from stdin in the loop's reader callback and acts on each at once."""

    def __init__(
        self, tools: dict[str, ToolSpec], init: Init, channel: Channel, done: asyncio.Future[None]
    ) -> None:
        self.tools, self.channel, self.done = tools, channel, done
        self.env = _EnvShim(init.argument_errors)
        self.cpu_budget = int(init.limits["cpu_seconds_per_call"])
        work_bytes = int(init.limits.get("sql_work_mb", sqlhost.DEFAULT_WORK_MIB)) * 2**20
        try:
            sqlheap.install(work_bytes)
        except sqlheap.HeapLimitUnavailable:  # the address-space limit still ends a runaway here
            pass
        self.hosting = _Hosting(sqlhost.Host(work_bytes), float(init.limits["call_timeout_s"]))
        self.running: dict[int, _DrivenCall] = {}
        self.buffer = bytearray()
        self.scanned = 0  # how much of `buffer` holds no newline
        self.awaiting: Call | None = None  # a call whose state's bytes are still to come
        self.finishing = False

    def readable(self) -> None:
        data = os.read(0, READ_CHUNK)
        if not data:
            self.finish()
            return
        buffer = self.buffer
        buffer += data
        start = 0
        while True:
            if self.awaiting is not None:  # the state's raw bytes, after the call's line
                call, need = self.awaiting, awaited_state(self.awaiting)
                if len(buffer) - start < need:
                    break
                call.state, start = bytes(buffer[start : start + need]), start + need
                self.scanned, self.awaiting = start, None
                self.handle(call)
                continue
            # from where the last read left off: a state spans hundreds of reads
            end = buffer.find(b"\n", self.scanned)
            if end < 0:
                break
            try:
                msg = decode_to_worker(bytes(buffer[start : end + 1]))
            except ProtocolError as exc:  # the parent is trusted: a bug, and nothing to go on with
                raise SystemExit(f"confined worker: {exc}") from None
            start = self.scanned = end + 1
            if awaited_state(msg):
                assert type(msg) is Call
                self.awaiting = msg
            else:
                self.handle(msg)
        del buffer[:start]
        if self.awaiting is None:
            self.scanned = len(buffer)
        if len(buffer) > MAX_LINE_BYTES:
            raise SystemExit("confined worker: a message from the parent exceeds the size limit")

    def handle(self, msg: Call | Cancel | SqlReply) -> None:
        if type(msg) is SqlReply:
            self.channel.deliver(msg)
        elif type(msg) is Call:
            confinement_inner.arm_cpu_budget(self.cpu_budget)
            coro = _run_call(self.channel, self.tools, self.env, msg, self.hosting)
            call = _DrivenCall(self.channel, msg.id, coro, self.running, self.idle)
            self.running[msg.id] = call
            call.step()
        elif type(msg) is Cancel and (cancelled := self.running.get(msg.id)) is not None:
            cancelled.cancel()

    def idle(self) -> None:
        """No call is running: nothing a call left behind runs until the next call, or ever.

        A call's CPU budget and time limit hold only while it runs; a timer it set
        (`loop.call_later`), a task it started or a callback it queued would go on between calls,
        unmetered. Every pending callback of the loop is cancelled (the worker's own reader is a
        selector registration, not a callback), so those never run. A worker too close to its
        hard CPU limit to give the next call its whole budget retires now, while no call can fail
        with it; the parent starts a new one on the next call.
        """
        loop = asyncio.get_running_loop()
        assert isinstance(loop, asyncio.BaseEventLoop)
        pending: list[asyncio.Handle] = [*loop._ready, *loop._scheduled]  # type: ignore[attr-defined]
        for handle in pending:
            handle.cancel()
        if not self.finishing and confinement_inner.cpu_seconds_left() < self.cpu_budget + 1:
            self.finish()

    def finish(self) -> None:
        self.finishing = True
        asyncio.get_running_loop().remove_reader(0)
        for call in list(self.running.values()):
            call.cancel()
        if not self.done.done():
            self.done.set_result(None)


async def serve(tools: dict[str, ToolSpec], init: Init, protocol_fd: int) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    serving = _Serving(tools, init, Channel(protocol_fd), done)
    loop.add_reader(0, serving.readable)
    await done


def _describe(tools: dict[str, ToolSpec]) -> Ready:
    return Ready(
        tools=[
            ToolDescription(
                name=s.name,
                description=s.description,
                input_schema=s.input_schema,
                parameters=list(s.parameters),
                required=sorted(s.required),
                writes=list(s.writes),
                source_line=s.source_line,
                side=s.side,
            )
            for s in tools.values()
        ]
    )


def main() -> None:
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # anything the env prints goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    init = decode(INIT, sys.stdin.buffer.readline(MAX_MESSAGE_BYTES + 1))
    if not isinstance(init, Init):
        raise SystemExit("confined worker: the first message must be 'init'")
    confinement_inner.confine_self(init.limits, require_seccomp="--require-seccomp" in sys.argv)
    path = Path(init.filename)
    try:
        module = tooldef.load_tool_module(path, init.env, source=init.source)
        tools = tooldef.tools_of_module(module, path)
        reply: Ready | LoadFailed = _describe(tools)
    except EnvLoadError as exc:
        reply = LoadFailed(problems=[Problem(line=p.line, message=p.message) for p in exc.problems])
    except BaseException as exc:  # SystemExit, MemoryError at import time
        reply = LoadFailed(problems=[Problem(line=None, message=f"importing failed: {type(exc).__name__}")])
    data = memoryview(encode(reply))
    while data:
        data = data[os.write(protocol_fd, data) :]
    if isinstance(reply, Ready):
        asyncio.run(serve(tools, init, protocol_fd))


if __name__ == "__main__":
    main()
