"""The parent <-> confined worker protocol: one JSON object per line, checked on both ends.

JSON only, never pickle: the serving process must never deserialise anything executable that a
worker sent. Every line is bounded (`MAX_MESSAGE_BYTES`) and checked against the shapes below, so
a worker that misbehaves produces a protocol error, not a surprise. Calls carry an id so
concurrent episodes can share one worker; a tool's SQL travels back to the parent under its
call's id. SQLite values are JSON scalars, except blobs, which travel as `{"$bytes": "<base64>"}`.

A call on a served episode names the episode (`Call.episode`) and the version of its committed
state the serving process holds; the worker runs the tool on its own copy of that state
(`sqlhost`), and the state travels, as SQLite's serialised bytes, only when one side lacks the
other's: with the call when the worker does not hold that version (`Call.state`), and with the
result when the tool committed a change (`Result.state`). The bytes follow their message's line
raw, its `state` field giving their count (at most `MAX_STATE_BYTES`), so the line itself keeps
its bound and no state is encoded as text (base64 and its JSON string cost ~230 µs a write call
for a 24 KB database).

The start-up messages (`Init`, `Ready`, `LoadFailed`) are pydantic models: they travel once per
worker. The per-call messages (`Call`, `Cancel`, `SqlRequest`, `SqlReply`, `Result`) travel
several times per tool call, so they are slotted classes checked by hand (`decode_from_worker`,
`decode_to_worker`): exact field sets, exact types (`bool` is not an `int`), bounded SQL text, no
lone surrogates in text. Pydantic costs tens of microseconds a message; a call is four of them.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, TypeAdapter

from ..core.tooldef import Side

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_SQL_CHARS = 1_000_000
MAX_STATE_BYTES = 80 * 1024 * 1024
"""The largest episode database a line may carry: a posted state's cap (64 MiB,
`schema_host.STATE_DATABASE_MAX_BYTES`) and room to grow. The serving process checks each state a
worker sends against its episode's own page cap, far below this for most."""
MAX_LINE_BYTES = MAX_MESSAGE_BYTES + MAX_STATE_BYTES
"""The most a reader holds for one message: its line and the state that follows it."""
BYTES_KEY = "$bytes"


class ProtocolError(RuntimeError):
    """A line that is too long, not JSON, or not one of the messages below."""


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


# start-up messages (pydantic: once per worker)


class Init(_Msg):
    type: Literal["init"] = "init"
    env: str
    filename: str
    source: str
    argument_errors: Literal["envforge", "python"] = "envforge"
    limits: dict[str, float]


class ToolDescription(_Msg):
    name: str
    description: str
    input_schema: dict[str, Any]
    parameters: list[str]
    required: list[str]
    writes: list[str]
    source_line: int
    side: Side = "agent"


class Ready(_Msg):
    type: Literal["ready"] = "ready"
    tools: list[ToolDescription]


class Problem(_Msg):
    line: int | None
    message: str


class LoadFailed(_Msg):
    type: Literal["load_failed"] = "load_failed"
    problems: list[Problem]


INIT: TypeAdapter[Init] = TypeAdapter(Init)
STARTED: TypeAdapter[Ready | LoadFailed] = TypeAdapter(Ready | LoadFailed)


# per-call messages (checked by hand: several per call)

SqlOp = Literal["execute", "executemany", "execute_fetchall", "fetch_all", "fetch_one", "fetch_value"]
SQL_OPS: frozenset[str] = frozenset(get_args(SqlOp))
Outcome = Literal["ok", "refused", "invalid", "crashed", "stale"]
"""`stale`: the worker does not hold the episode's version the call named (it was evicted, or
the worker restarted); the serving process sends the call again with the state."""
OUTCOMES: frozenset[str] = frozenset(get_args(Outcome))


class Call:
    """Parent -> worker: run `tool` with `arguments` (JSON values) as call `id`.

    With `episode` (a served episode's key), on the worker's copy of that episode's `version`;
    `state` carries that version's bytes when the worker may not hold it, and
    `max_pages` the episode's page cap. Without it, every statement comes back as a `SqlRequest`.
    """

    __slots__ = ("arguments", "episode", "id", "max_pages", "state", "tool", "version")
    type = "call"

    def __init__(
        self,
        id: int,
        tool: str,
        arguments: dict[str, Any],
        episode: int | None = None,
        version: int = 0,
        state: bytes | None = None,
        max_pages: int = 0,
    ) -> None:
        self.id, self.tool, self.arguments = id, tool, arguments
        self.episode, self.version, self.state, self.max_pages = episode, version, state, max_pages

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "call", "id": self.id, "tool": self.tool, "arguments": self.arguments}
        if self.episode is not None:
            out["episode"], out["version"], out["max_pages"] = self.episode, self.version, self.max_pages
            if self.state is not None:
                out["state"] = len(self.state)
        return out


class Cancel:
    """Parent -> worker: the caller gave up on call `id`; no answer is expected."""

    __slots__ = ("id",)
    type = "cancel"

    def __init__(self, id: int) -> None:
        self.id = id

    def wire(self) -> dict[str, Any]:
        return {"type": "cancel", "id": self.id}


class SqlReply:
    """Parent -> worker: the answer to statement `req` of call `id` (rows already fetched)."""

    __slots__ = ("columns", "error", "error_class", "id", "lastrowid", "req", "rowcount", "rows")
    type = "sql_reply"

    def __init__(
        self,
        id: int,
        req: int,
        error: str | None = None,
        error_class: str | None = None,
        columns: list[str] | None = None,
        rows: list[list[Any]] | None = None,
        rowcount: int = -1,
        lastrowid: int | None = None,
    ) -> None:
        self.id, self.req, self.error, self.error_class = id, req, error, error_class
        self.columns, self.rows = columns, [] if rows is None else rows
        self.rowcount, self.lastrowid = rowcount, lastrowid

    def wire(self) -> dict[str, Any]:
        return {
            "type": "sql_reply",
            "id": self.id,
            "req": self.req,
            "error": self.error,
            "error_class": self.error_class,
            "columns": self.columns,
            "rows": self.rows,
            "rowcount": self.rowcount,
            "lastrowid": self.lastrowid,
        }


class SqlRequest:
    """Worker -> parent: run one statement for call `id` (its `req`-th) on the episode."""

    __slots__ = ("id", "op", "params", "req", "sql")
    type = "sql"

    def __init__(self, id: int, req: int, op: SqlOp, sql: str, params: Any = None) -> None:
        self.id, self.req, self.op, self.sql, self.params = id, req, op, sql, params

    def wire(self) -> dict[str, Any]:
        return {
            "type": "sql",
            "id": self.id,
            "req": self.req,
            "op": self.op,
            "sql": self.sql,
            "params": self.params,
        }


class Result:
    """Worker -> parent: call `id` ended: returned (`ok`), raised `ToolError` (`refused`), was
    given arguments its signature rejects (`invalid`), crashed, or named a version of its episode
    the worker does not hold (`stale`).

    A call on a hosted episode that committed a change returns the new database (`state`)
    and the tables it wrote (`written`)."""

    __slots__ = ("id", "outcome", "state", "text", "written")
    type = "result"

    def __init__(
        self,
        id: int,
        outcome: Outcome,
        text: str,
        state: bytes | None = None,
        written: list[str] | None = None,
    ) -> None:
        self.id, self.outcome, self.text, self.state, self.written = id, outcome, text, state, written

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "result", "id": self.id, "outcome": self.outcome, "text": self.text}
        if self.state is not None:
            out["state"], out["written"] = len(self.state), self.written or []
        return out


PerCall = Call | Cancel | SqlReply | SqlRequest | Result


def encode(message: _Msg | PerCall) -> bytes:
    """One protocol line (the newline included), refused when over `MAX_MESSAGE_BYTES`, and the
    state the message carries, if any, after it."""
    if isinstance(message, BaseModel):
        line = message.model_dump_json().encode() + b"\n"
    else:
        try:
            line = json.dumps(message.wire(), separators=(",", ":")).encode() + b"\n"
        except (TypeError, ValueError) as exc:  # a value JSON cannot carry
            raise ProtocolError(f"cannot encode {message.type!r}: {exc}") from exc
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(line)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
    state: bytes | None = getattr(message, "state", None)
    if state is not None:
        if not 0 < len(state) <= MAX_STATE_BYTES:
            raise ProtocolError(f"a state of {len(state)} bytes (at most {MAX_STATE_BYTES})")
        return line + state
    return line


def _load(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(line)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested past the C stack's care
        raise ProtocolError(f"invalid message: not JSON ({type(exc).__name__})") from None
    if type(obj) is not dict:
        raise ProtocolError("invalid message: not a JSON object")
    return obj


def _fields(obj: dict[str, Any], required: frozenset[str], optional: frozenset[str] = frozenset()) -> None:
    keys = obj.keys()
    if not (required <= keys and keys <= required | optional):
        raise ProtocolError(f"invalid {obj['type']!r} message: fields {sorted(keys)}")


def _int(obj: dict[str, Any], key: str) -> int:
    value = obj[key]
    if type(value) is not int:
        raise ProtocolError(f"invalid {obj['type']!r} message: {key} is not an integer")
    return value


def _text(obj: dict[str, Any], key: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    value = obj[key]
    if type(value) is not str or len(value) > limit:
        raise ProtocolError(
            f"invalid {obj['type']!r} message: {key} is not a string of at most {limit} chars"
        )
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate escaped in the JSON
        raise ProtocolError(f"invalid {obj['type']!r} message: {key} is not valid Unicode") from None
    return value


_SQL_FIELDS = frozenset({"type", "id", "req", "op", "sql"})
_RESULT_FIELDS = frozenset({"type", "id", "outcome", "text"})
_RESULT_STATE = frozenset({"state", "written"})
_PARAMS = frozenset({"params"})


def state_length(obj: dict[str, Any]) -> int:
    """The byte count of the state that follows a message's line (its `state` field)."""
    value = obj["state"]
    if type(value) is not int or not 0 < value <= MAX_STATE_BYTES:
        raise ProtocolError(
            f"invalid {obj['type']!r} message: state is not a count of 1 to {MAX_STATE_BYTES} bytes"
        )
    return value


def awaited_state(message: Any) -> int:
    """How many bytes of state a decoded message still waits for (its reader then reads them raw
    and sets `state`), 0 for none."""
    return message.state if type(getattr(message, "state", None)) is int else 0


def decode_from_worker(line: bytes) -> SqlRequest | Result:
    """A per-call line from an (untrusted) worker, checked field by field; else `ProtocolError`."""
    obj = _load(line)
    kind = obj.get("type")
    if kind == "sql":
        _fields(obj, _SQL_FIELDS, _PARAMS)
        op = obj["op"]
        if op not in SQL_OPS:
            raise ProtocolError("invalid 'sql' message: unknown op")
        return SqlRequest(
            _int(obj, "id"), _int(obj, "req"), op, _text(obj, "sql", MAX_SQL_CHARS), obj.get("params")
        )
    if kind == "result":
        _fields(obj, _RESULT_FIELDS, _RESULT_STATE)
        outcome = obj["outcome"]
        if outcome not in OUTCOMES:
            raise ProtocolError("invalid 'result' message: unknown outcome")
        result = Result(_int(obj, "id"), outcome, _text(obj, "text", MAX_MESSAGE_BYTES))
        if "state" in obj:
            if outcome != "ok" or set(obj) != _RESULT_FIELDS | _RESULT_STATE:
                raise ProtocolError("invalid 'result' message: a state without its tables, or not ok")
            result.state = state_length(obj)  # type: ignore[assignment]  # the bytes follow the line
            written = obj["written"]
            if type(written) is not list or not all(type(t) is str and len(t) <= 256 for t in written):
                raise ProtocolError("invalid 'result' message: written is not a list of table names")
            result.written = written
        return result
    raise ProtocolError(f"unexpected message type {str(kind)[:40]!r}")


def decode_to_worker(line: bytes) -> Call | Cancel | SqlReply:
    """A per-call line from the parent (trusted, but checked all the same: a bug must not pass)."""
    obj = _load(line)
    kind = obj.get("type")
    try:
        if kind == "call" and type(obj["arguments"]) is dict:
            call = Call(_int(obj, "id"), _text(obj, "tool"), obj["arguments"])
            if "episode" in obj:
                call.episode, call.version = _int(obj, "episode"), _int(obj, "version")
                call.max_pages = _int(obj, "max_pages")
                if "state" in obj:
                    call.state = state_length(obj)  # type: ignore[assignment]  # the bytes follow
            return call
        if kind == "cancel":
            return Cancel(_int(obj, "id"))
        if kind == "sql_reply":
            del obj["type"]
            reply = SqlReply(**obj)
            if type(reply.rows) is not list or type(reply.id) is not int or type(reply.req) is not int:
                raise ProtocolError("invalid 'sql_reply' message")
            return reply
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"invalid {kind!r} message: {exc}") from None
    raise ProtocolError(f"unexpected message type {str(kind)[:40]!r}")


def decode(adapter: TypeAdapter[Any], line: bytes) -> Any:
    """A start-up message (`INIT`, `STARTED`), validated by its pydantic model."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(line)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
    try:
        return adapter.validate_json(line)
    except ValueError as exc:
        raise ProtocolError(f"invalid message: {str(exc).splitlines()[0]}") from exc


def to_wire(value: Any) -> Any:
    """An SQLite value (or parameter) as JSON: blobs tagged, containers walked."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {BYTES_KEY: base64.b64encode(bytes(value)).decode()}
    if isinstance(value, list | tuple):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_wire(v) for k, v in value.items()}
    return value


def rows_to_wire(rows: list[Any]) -> list[Any]:
    """Fetched rows as JSON lists; rows without a blob (the common case) are not walked value by value."""
    out = []
    for row in rows:
        if any(type(v) is bytes for v in row):
            out.append([to_wire(v) for v in row])
        else:
            out.append(list(row))
    return out


def from_wire(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {BYTES_KEY} and isinstance(value[BYTES_KEY], str):
            return base64.b64decode(value[BYTES_KEY])
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value


def row_from_wire(row: list[Any]) -> tuple[Any, ...]:
    """A row of scalars as a tuple; only a row holding a tagged blob is walked."""
    if any(type(v) is dict for v in row):
        return tuple(from_wire(v) for v in row)
    return tuple(row)
