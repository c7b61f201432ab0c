"""Canonical state export: the one representation of an episode's database that scoring compares.

Rows are sorted by primary key, volatile columns are dropped, and the JSON is serialised with
sorted keys and fixed separators so the sha256 is stable across processes and machines.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

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
    conn: sqlite3.Connection,
    tables: list[TableInfo],
    volatile: dict[str, list[str]] | None = None,
    only: set[str] | None = None,
) -> State:
    """Every table (or those in `only`) as row dicts sorted by primary key, volatile columns dropped."""
    volatile = volatile or {}
    state: State = {}
    for t in tables:
        if only is not None and t.name not in only:
            continue
        cols, sql = table_query(t, volatile)
        state[t.name] = [dict(zip(cols, r, strict=True)) for r in conn.execute(sql).fetchall()]
    return state


class TableQuery(NamedTuple):
    """A table's exported columns and the SELECT that reads them in export order."""

    columns: list[str]
    sql: str


def table_query(t: TableInfo, volatile: dict[str, list[str]] | None = None) -> TableQuery:
    """The exported columns of one table and the SELECT that reads them in export order.

    The SELECT's rows, zipped with the columns, are `export_state`'s rows for the table.
    """
    dropped = set((volatile or {}).get(t.name, ()))
    cols = [c for c in t.columns if c not in dropped]
    order = ", ".join(quote_ident(c) for c in t.primary_key) if t.primary_key else "rowid"
    select = ", ".join(quote_ident(c) for c in cols)
    return TableQuery(cols, f"SELECT {select} FROM {quote_ident(t.name)} ORDER BY {order}")


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# Canonical JSON of frozen tables, keyed by the identity of their row list (the list is held, so
# its id cannot be reused). Episodes share the unchanged tables of the state they started from,
# so a final state's hash re-serialises only the tables the episode wrote.
_FROZEN_JSON: dict[int, tuple[list[dict[str, Any]], str]] = {}
# ... and the same text as UTF-8, made on its first hash: a hash feeds each table's bytes to the
# digest in turn, never joining the whole state into one string (megabytes copied per hash).
_FROZEN_BYTES: dict[int, tuple[list[dict[str, Any]], bytes]] = {}


def freeze(state: State) -> State:
    """Mark `state`'s tables as never to be mutated again, so their JSON can be computed once.

    Returns `state`. Call it only on states nobody changes in place (an env's seed state, a
    task's initial state); `export_state` results handed to callers are not frozen.
    """
    for rows in state.values():
        if id(rows) not in _FROZEN_JSON:
            _FROZEN_JSON[id(rows)] = (rows, _dumps(rows))
    return state


def table_json(rows: list[dict[str, Any]]) -> str:
    """Canonical JSON of one table's rows (cached for frozen tables)."""
    hit = _FROZEN_JSON.get(id(rows))
    if hit is not None and hit[0] is rows:
        return hit[1]
    return _dumps(rows)


def canonical_json(state: State) -> str:
    """The byte-stable serialisation that hashes are taken over.

    Identical to `json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`,
    assembled table by table so frozen tables are not serialised again.
    """
    if not all(type(t) is str for t in state):
        return _dumps(state)
    return "{" + ",".join(_dumps(t) + ":" + table_json(state[t]) for t in sorted(state)) + "}"


def _table_bytes(rows: list[dict[str, Any]]) -> bytes:
    hit = _FROZEN_BYTES.get(id(rows))
    if hit is not None and hit[0] is rows:
        return hit[1]
    frozen = _FROZEN_JSON.get(id(rows))
    if frozen is not None and frozen[0] is rows:
        _FROZEN_BYTES[id(rows)] = (rows, frozen[1].encode())
        return _FROZEN_BYTES[id(rows)][1]
    return _dumps(rows).encode()


def is_frozen(rows: Any) -> bool:
    """Whether `rows` is a table list that `freeze` marked (so it never changes again)."""
    hit = _FROZEN_JSON.get(id(rows))
    return hit is not None and hit[0] is rows


if TYPE_CHECKING:
    from hashlib import _Hash as Digest  # a sha256 object (hashlib's class is private)
else:
    Digest = Any
Feed = Callable[[Digest, int, str], None]
"""Feeds the i-th table (by sorted name) of a state to a digest, with its leading separator."""

# sha256 midstates after `{` and a state's leading frozen tables (in sorted name order), keyed by
# the digest's kind and the tables' names and identities; each entry holds the row lists, so their
# ids cannot be reused. Episodes share the unchanged tables of the state they started from, so a
# trial that writes no table, or only tables late in name order, hashes the rest from a midstate
# instead of re-reading megabytes of unchanged JSON (SHA-256 is sequential: a cached prefix is the
# only part that can be skipped). Cleared when full: a run has few distinct starting states.
_PREFIX_DIGESTS: dict[tuple[Any, ...], tuple[tuple[Any, ...], Digest]] = {}
_PREFIX_DIGESTS_LIMIT = 512


def prefix_digest(kind: str, state: State, tables: list[str], feed: Feed) -> tuple[Digest, int]:
    """A sha256 fed `{` and the first n tables of `tables` (the sorted names of `state`), and n.

    n is the number of leading tables that are frozen; their part of the digest is taken from a
    midstate remembered under `kind` (which names what `feed` writes per table) when these same
    tables were hashed before, else computed with `feed` and remembered.
    """
    n = 0
    while n < len(tables) and is_frozen(state[tables[n]]):
        n += 1
    if n == 0:
        return hashlib.sha256(b"{"), 0
    held = tuple(state[t] for t in tables[:n])
    key = (kind, *tables[:n], *map(id, held))
    hit = _PREFIX_DIGESTS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], held, strict=True)):
        return hit[1].copy(), n
    digest = hashlib.sha256(b"{")
    for i in range(n):
        feed(digest, i, tables[i])
    if len(_PREFIX_DIGESTS) >= _PREFIX_DIGESTS_LIMIT:
        _PREFIX_DIGESTS.clear()
    _PREFIX_DIGESTS[key] = (held, digest.copy())
    return digest, n


def state_hash(state: State) -> str:
    """sha256 of `canonical_json(state)`, fed table by table (the frozen ones' bytes cached, and a
    leading run of frozen tables resumed from a remembered midstate: `prefix_digest`)."""
    if not all(type(t) is str for t in state):
        return hashlib.sha256(canonical_json(state).encode()).hexdigest()

    def feed(digest: Digest, i: int, table: str) -> None:
        digest.update((("," if i else "") + _dumps(table) + ":").encode())
        digest.update(_table_bytes(state[table]))

    tables = sorted(state)
    digest, done = prefix_digest("state_hash", state, tables, feed)
    for i in range(done, len(tables)):
        feed(digest, i, tables[i])
    digest.update(b"}")
    return digest.hexdigest()


class ExportedState(NamedTuple):
    """An episode's exported state and its `state_hash`."""

    state: State
    state_hash: str
