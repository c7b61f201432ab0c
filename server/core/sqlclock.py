"""SQLite's clock, fixed: `'now'` is the same instant on every env connection, at any hour.

An env's end state is its verdict: a task's golden state is stored when the task is made and
compared, byte for byte, when an agent is scored, days later. SQL that reads the wall clock breaks
that without any tool doing wrong by its own lights: `created_at TIMESTAMP DEFAULT
CURRENT_TIMESTAMP`, which Qwen2.5-Coder-1.5B wrote on every table of every schema it was asked for,
stamped each row a tool inserted with the second it ran, so every one of 50 tasks synthesized for
its Slack env failed `check`'s golden replay minutes later. Python's clock is closed to tools
already (the static gate refuses `datetime.now`); `install` closes SQLite's on each connection the
project opens for an env, trusted or confined: `CURRENT_TIMESTAMP`, `CURRENT_DATE`, `CURRENT_TIME`
(a column's default included) and the time value `'now'` of `date`, `time`, `datetime`,
`julianday`, `unixepoch` and `strftime` all read `SQL_NOW`. Any other call gets SQLite's own
answer, computed by SQLite on a private connection.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable

SQL_NOW = "2025-06-01 12:00:00"
"""The instant every env's SQL reads as now (UTC, SQLite's format): after the dates the synthesis
seed skeleton writes (from 2025-01-06, a day per row), so a row made during an episode is newer
than the seed's."""

_DATE_FUNCTIONS = ("date", "time", "datetime", "julianday", "unixepoch", "strftime", "timediff")

_SQLITE = sqlite3.connect(":memory:", check_same_thread=False)
_SQLITE_LOCK = threading.Lock()

Value = str | bytes | int | float | None


def _present(name: str) -> bool:
    """Whether this SQLite has `name` (`unixepoch` is 3.38's, `timediff` 3.43's): one it lacks
    stays absent, as it is for every other connection."""
    try:
        _SQLITE.execute(f"SELECT {name}('2000-01-01', '2000-01-01')")
    except sqlite3.OperationalError:
        return False
    return True


_PRESENT = tuple(name for name in _DATE_FUNCTIONS if _present(name))


def _fixed(name: str) -> Callable[..., Value]:
    """`name` as SQLite computes it, with each time value `'now'` (any case) read as `SQL_NOW`, and
    no time value at all (`date()`, `strftime('%Y')`) as `'now'`."""
    first_value = 1 if name == "strftime" else 0
    sql_cache: dict[int, str] = {}

    def call(*args: Value) -> Value:
        values = list(args)
        if len(values) <= first_value:
            values.append(SQL_NOW)
        values = [SQL_NOW if isinstance(v, str) and v.lower() == "now" else v for v in values]
        sql = sql_cache.get(len(values))
        if sql is None:
            sql = sql_cache[len(values)] = f"SELECT {name}({', '.join('?' * len(values))})"
        with _SQLITE_LOCK:
            return _SQLITE.execute(sql, values).fetchone()[0]  # type: ignore[no-any-return]

    return call


def install(conn: sqlite3.Connection) -> None:
    """Make `conn`'s SQL read `SQL_NOW` wherever SQLite would read the wall clock."""
    date, time = SQL_NOW.split(" ")
    for name, value in (("current_timestamp", SQL_NOW), ("current_date", date), ("current_time", time)):
        conn.create_function(name, 0, lambda value=value: value, deterministic=True)
    for name in _PRESENT:
        conn.create_function(name, -1, _fixed(name), deterministic=True)
