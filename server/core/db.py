"""The database handle a tool receives: run statements and read rows, nothing else.

A tool is code that the runtime calls inside a transaction it owns. The handle therefore offers
no commit, rollback, close, authorizer, backup or raw connection: the runtime alone ends the
transaction, so every call is atomic whatever ends it. SQLite's authorizer (see
`episodes.WriteTracker`) enforces the same rules on the SQL itself — a tool cannot commit,
attach a file or write a table it did not declare, whatever text it sends.

Hand-written (trusted) envs get a `Db` over the episode's connection in-process; confined envs
get a handle with the same methods in their sandboxed worker: over the worker's own copy of a
served episode (`sqlhost.LocalDb`), or a proxy whose statements travel to the serving process
(synthesis). Tools should type their first parameter as `Db`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, cast

from .connection import Connection
from .errors import ToolError

Params = Sequence[Any] | Mapping[str, Any]
Row = dict[str, Any]


class Cursor(Protocol):
    """What `await db.execute(...)` gives back (also usable as `async with db.execute(...) as cur`)."""

    @property
    def description(self) -> tuple[tuple[Any, ...], ...] | None: ...
    @property
    def rowcount(self) -> int: ...
    @property
    def lastrowid(self) -> int | None: ...
    async def fetchone(self) -> tuple[Any, ...] | None: ...
    async def fetchall(self) -> Iterable[tuple[Any, ...]]: ...


def _dicts(conn: sqlite3.Connection, sql: str, params: Params) -> list[Row]:
    cur = conn.execute(sql, params)
    try:
        names = [d[0] for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    finally:
        cur.close()


def _first(conn: sqlite3.Connection, sql: str, params: Params) -> Row | None:
    cur = conn.execute(sql, params)
    try:
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cur.description], row, strict=True))
    finally:
        cur.close()


def _value(conn: sqlite3.Connection, sql: str, params: Params) -> Any:
    cur = conn.execute(sql, params)
    try:
        row = cur.fetchone()
        return None if row is None else row[0]
    finally:
        cur.close()


class Db:
    """An episode's database as a tool sees it. Each fetch helper is one trip to the SQLite thread."""

    __slots__ = ("_link",)

    def __init__(self, conn: Connection) -> None:
        self._link = conn  # an episode's connection (pooled, or the synthesiser's inline variant)

    def execute(self, sql: str, params: Params = ()) -> Any:
        """Run one statement; await it for a cursor, or use it as `async with db.execute(...) as cur`."""
        return self._link.execute(sql, params)

    async def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement once per parameter set."""
        await self._link.executemany(sql, rows)

    async def execute_fetchall(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows as tuples."""
        rows = await self._link.execute_fetchall(sql, params)
        return cast("list[tuple[Any, ...]]", list(rows))  # no row factory is set: plain tuples

    async def fetch_all(self, sql: str, params: Params = ()) -> list[Row]:
        """Run one query and return every row as a dict keyed by column name."""
        conn = self._link
        return await conn.run(_dicts, conn.raw, sql, params)

    async def fetch_one(self, sql: str, params: Params = ()) -> Row | None:
        """The first row of a query as a dict, or None when it has none."""
        conn = self._link
        return await conn.run(_first, conn.raw, sql, params)

    async def fetch_value(self, sql: str, params: Params = ()) -> Any:
        """The first column of the first row, or None when the query returns no row."""
        conn = self._link
        return await conn.run(_value, conn.raw, sql, params)

    async def require_one(self, sql: str, params: Params, missing: str) -> Row:
        """The first row as a dict; when there is none, refuse the call with `ToolError(missing)`."""
        row = await self.fetch_one(sql, params)
        if row is None:
            raise ToolError(missing)
        return row


def connection_of(db: Db) -> Connection:
    """The connection behind a tool's `Db`, for the runtime's own use (tools cannot import this)."""
    return db._link
