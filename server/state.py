"""Canonical state export: the one representation of an episode's database that scoring compares.

Rows are sorted by primary key, volatile columns are dropped, and the JSON is serialised with
sorted keys and fixed separators so the sha256 is stable across processes and machines.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from typing import Any

State = dict[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class TableInfo:
    name: str
    columns: tuple[str, ...]
    primary_key: tuple[str, ...]


def quote_ident(name: str) -> str:
    """Quote an SQL identifier (table and column names come from the schema, never from agents)."""
    return '"' + name.replace('"', '""') + '"'


def read_tables(conn: sqlite3.Connection) -> list[TableInfo]:
    """List user tables with their columns and primary keys, in name order."""
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    ]
    tables = []
    for name in names:
        info = conn.execute(f"PRAGMA table_info({quote_ident(name)})").fetchall()
        columns = tuple(r[1] for r in info)
        pk = tuple(r[1] for r in sorted((r for r in info if r[5] > 0), key=lambda r: r[5]))
        tables.append(TableInfo(name, columns, pk))
    return tables


def export_state(
    conn: sqlite3.Connection, tables: list[TableInfo], volatile: dict[str, list[str]] | None = None
) -> State:
    """Every table as a list of row dicts, sorted by primary key, volatile columns dropped."""
    volatile = volatile or {}
    state: State = {}
    for t in tables:
        dropped = set(volatile.get(t.name, ()))
        cols = [c for c in t.columns if c not in dropped]
        order = ", ".join(quote_ident(c) for c in t.primary_key) if t.primary_key else "rowid"
        select = ", ".join(quote_ident(c) for c in cols)
        rows = conn.execute(f"SELECT {select} FROM {quote_ident(t.name)} ORDER BY {order}").fetchall()
        state[t.name] = [dict(zip(cols, r, strict=True)) for r in rows]
    return state


def canonical_json(state: State) -> str:
    """The byte-stable serialisation that hashes are taken over."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def state_hash(state: State) -> str:
    return hashlib.sha256(canonical_json(state).encode()).hexdigest()
