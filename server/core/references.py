"""Which value of a call names no row: a foreign key the call's arguments broke.

SQLite's foreign-key error names nothing ("FOREIGN KEY constraint failed"), so a tool that lets the
schema refuse a reference (an INSERT of a message into a channel, with no lookup of the channel
first) would read as a crash of the env, and an agent passing an unknown id would move its own
failing trial out of pass^k (an `env` fault). The reference is the agent's when one of its
arguments, passed by the name of a foreign-key column, holds a value the referenced column does
not; a reference the tool derived itself stays the env's bug.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from .state import quote_ident

FOREIGN_KEY_FAILED = "FOREIGN KEY constraint failed"


def breaks_a_foreign_key(exc: BaseException) -> bool:
    """Whether `exc` is SQLite's foreign-key failure, raised here or relayed by a confined worker."""
    return FOREIGN_KEY_FAILED in str(exc)


def dangling_reference(raw: sqlite3.Connection, arguments: Mapping[str, Any]) -> str | None:
    """The agent's reference that names no row (`channel_id='C-99'`), said as its refusal, or None.

    Runs on the connection's own thread, inside the failed call's transaction: a parent row the
    call itself inserted before failing counts as there."""
    tables = [row[0] for row in raw.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")]
    for table in tables:
        for fk in raw.execute(f"PRAGMA foreign_key_list({quote_ident(table)})").fetchall():
            parent, column, parent_column = fk[2], fk[3], fk[4] or _primary_key(raw, fk[2])
            value = arguments.get(column)
            if isinstance(value, bool) or not isinstance(value, str | int | float) or parent_column is None:
                continue
            found = raw.execute(
                f"SELECT 1 FROM {quote_ident(parent)} WHERE {quote_ident(parent_column)} = ? LIMIT 1",
                (value,),
            ).fetchone()
            if found is None:
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
                return f"{column}={shown} names no {parent} row; nothing of this call was kept"
    return None


def _primary_key(raw: sqlite3.Connection, table: str) -> str | None:
    """The one primary-key column a foreign key without a column list references."""
    keys = [row[1] for row in raw.execute(f"PRAGMA table_info({quote_ident(table)})") if row[5]]
    return keys[0] if len(keys) == 1 else None
