"""The parent <-> confined worker protocol: one JSON object per line, validated on both ends.

JSON only, never pickle: the serving process must never deserialise anything executable that a
worker sent. Every line is bounded (`MAX_MESSAGE_BYTES`) and validated against these models, so a
worker that misbehaves produces a protocol error, not a surprise. Calls carry an id so concurrent
episodes can share one worker; a tool's SQL travels back to the parent under its call's id.
SQLite values are JSON scalars, except blobs, which travel as `{"$bytes": "<base64>"}`.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
BYTES_KEY = "$bytes"


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


# parent -> worker


class Init(_Msg):
    type: Literal["init"] = "init"
    env: str
    filename: str
    source: str
    argument_errors: Literal["envforge", "python"] = "envforge"
    limits: dict[str, float]


class Call(_Msg):
    type: Literal["call"] = "call"
    id: int
    tool: str
    arguments: dict[str, Any]


class Cancel(_Msg):
    type: Literal["cancel"] = "cancel"
    id: int


class SqlReply(_Msg):
    type: Literal["sql_reply"] = "sql_reply"
    id: int
    req: int
    error: str | None = None
    error_class: str | None = None
    columns: list[str] | None = None
    rows: list[list[Any]] = Field(default_factory=list)
    rowcount: int = -1
    lastrowid: int | None = None


ToWorker = Annotated[Init | Call | Cancel | SqlReply, Field(discriminator="type")]

# worker -> parent

SqlOp = Literal["execute", "executemany", "execute_fetchall", "fetch_all", "fetch_one", "fetch_value"]


class ToolDescription(_Msg):
    name: str
    description: str
    input_schema: dict[str, Any]
    parameters: list[str]
    required: list[str]
    writes: list[str]
    source_line: int


class Ready(_Msg):
    type: Literal["ready"] = "ready"
    tools: list[ToolDescription]


class Problem(_Msg):
    line: int | None
    message: str


class LoadFailed(_Msg):
    type: Literal["load_failed"] = "load_failed"
    problems: list[Problem]


class SqlRequest(_Msg):
    type: Literal["sql"] = "sql"
    id: int
    req: int
    op: SqlOp
    sql: str = Field(max_length=1_000_000)
    params: Any = None


class Result(_Msg):
    type: Literal["result"] = "result"
    id: int
    outcome: Literal["ok", "refused", "crashed"]
    text: str


FromWorker = Annotated[Ready | LoadFailed | SqlRequest | Result, Field(discriminator="type")]
TO_WORKER: TypeAdapter[Init | Call | Cancel | SqlReply] = TypeAdapter(ToWorker)
FROM_WORKER: TypeAdapter[Ready | LoadFailed | SqlRequest | Result] = TypeAdapter(FromWorker)


class ProtocolError(RuntimeError):
    """A line that is too long, not JSON, or not one of the messages above."""


def encode(message: _Msg) -> bytes:
    line = message.model_dump_json().encode() + b"\n"
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(line)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
    return line


def decode(adapter: TypeAdapter[Any], line: bytes) -> Any:
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


def from_wire(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {BYTES_KEY} and isinstance(value[BYTES_KEY], str):
            return base64.b64decode(value[BYTES_KEY])
        return {k: from_wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    return value
