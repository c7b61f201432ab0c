"""A walk's copy of its episode's state, kept current after each write by re-reading written tables.

Exporting a table builds a dict per row, and diffing two exports indexes and compares every row,
though a write changes a row or two. `Mirror` reads a written table as the plain tuples SQLite
returns (the same SELECT as `export_state`), finds the rows that changed with set operations on
those tuples (in C), and builds dicts and the diff for those rows only; unchanged rows keep their
dict objects. The rows and diffs are `export_state`'s and `diff_states`'s, value for value and
in the same order.

Tuples compare like the dicts `diff_states` compares (`==`, value by value). Where that is not
exact enough to reuse a row object, in columns where 1 and 1.0 can both be stored
(`hashing.loose_columns`), and in tables without a primary key, a table is exported and diffed
in full as before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from itertools import chain
from operator import itemgetter
from typing import Any, Literal

from envforge.server import Environment, Episode, State, TableInfo, on_db_thread, quote_ident, table_query

from ..task.hashing import same_rows
from ..task.models import StateDiff, TableDiff
from ..task.statediff import diff_states, index_diff, index_rows

Row = dict[str, Any]


class TableReader:
    """How to read one table's rows as tuples, and whether tuples can stand for its rows."""

    def __init__(self, info: TableInfo, volatile: dict[str, list[str]], loose: tuple[str, ...]) -> None:
        self.name = info.name
        self.pk = info.primary_key
        self.cols, self.sql = table_query(info, volatile)
        self.loose = loose
        self.fast = bool(self.pk) and not loose and all(c in self.cols for c in self.pk)
        self.key_of = itemgetter(*(self.cols.index(c) for c in self.pk)) if self.fast else None
        self.order = self.sql[self.sql.index(" ORDER BY ") :]
        where = " AND ".join(f"{quote_ident(c)} = ?" for c in self.pk)
        self.by_key = f"{self.sql[: self.sql.index(' ORDER BY ')]} WHERE {where}" if self.pk else ""
        self._projections: dict[tuple[int, ...], str] = {}
        # For row lists many walks start from (the seed's): whether a key holds NULL, and the
        # projections of some columns, computed once per list (held by identity, a few at a time).
        self._shared: dict[tuple[int, tuple[int, ...]], tuple[list[tuple[Any, ...]], Any]] = {}

    def projection(self, idx: tuple[int, ...]) -> str:
        """The SELECT of some columns only (by position), rows in export order."""
        sql = self._projections.get(idx)
        if sql is None:
            cols = ", ".join(quote_ident(self.cols[i]) for i in idx)
            sql = self._projections[idx] = f"SELECT {cols} FROM {quote_ident(self.name)}{self.order}"
        return sql

    def tuples(self, rows: list[Row]) -> list[tuple[Any, ...]]:
        cols = self.cols
        return [tuple(r.get(c) for c in cols) for r in rows]

    def shared(self, tuples: list[tuple[Any, ...]], idx: tuple[int, ...]) -> Any:
        """`null_key(tuples)` (for `idx` empty) or the projection of `tuples` on the columns at
        `idx`, remembered for this very list: the initial rows of every walk on the same state."""
        hit = self._shared.get((id(tuples), idx))
        if hit is None or hit[0] is not tuples:
            if len(self._shared) >= SHARED_KEPT:
                self._shared.clear()
            value = self.null_key(tuples) if not idx else project(tuples, idx)
            hit = self._shared[(id(tuples), idx)] = (tuples, value)
        return hit[1]

    def null_key(self, tuples: Iterable[tuple[Any, ...]]) -> bool:
        """Whether a row's primary key holds NULL (SQLite allows it, and so repeated keys)."""
        keys = map(self.key_of, tuples)  # type: ignore[arg-type]
        return None in (chain.from_iterable(keys) if len(self.pk) > 1 else keys)


# Row lists per table whose `TableReader.shared` answers are kept (the seed's, and setup states').
SHARED_KEPT = 32


def project(tuples: list[tuple[Any, ...]], idx: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """Each tuple's values at positions `idx`, as tuples."""
    return list(zip(*(map(itemgetter(i), tuples) for i in idx), strict=True))


def table_readers(env: Environment, loose: dict[str, tuple[str, ...]]) -> dict[str, TableReader]:
    return {t.name: TableReader(t, env.manifest.volatile_columns, loose.get(t.name, ())) for t in env.tables}


class Mirror:
    """The current state of one episode, as `export_state` would give it, maintained by `refresh`.

    `initial_rows(table)` gives the initial state's rows of a table as tuples, each mapped to its
    row (cached by the caller: the seed's serve every walk; this copies before changing it).
    """

    def __init__(
        self,
        readers: dict[str, TableReader],
        initial: State,
        initial_rows: Callable[[str], tuple[list[tuple[Any, ...]], dict[tuple[Any, ...], Row]]],
    ) -> None:
        self.readers = readers
        self.initial = initial
        self._state: State = dict(initial)
        self._initial_rows = initial_rows
        # Per table read so far: its rows as tuples, and each tuple's row (a dict).
        self._tuples: dict[str, list[tuple[Any, ...]]] = {}
        self._rows: dict[str, dict[tuple[Any, ...], Row]] = {}
        self._pending: set[str] = set()  # tables whose row list is yet to be rebuilt from `_rows`
        # Per table: the tuples last read by some columns only, those columns, and that projection.
        self._projected: dict[str, tuple[list[tuple[Any, ...]], tuple[int, ...], list[Any]]] = {}
        self._slow: set[str] = set()  # tables that have (had) a NULL key: exported in full

    @property
    def state(self) -> State:
        for table in self._pending:
            self._state[table] = list(map(self._rows[table].__getitem__, self._tuples[table]))
        self._pending.clear()
        return self._state

    def tuples_of(self, table: str) -> list[tuple[Any, ...]] | None:
        """The table's current rows as tuples (aligned with `state[table]`), where held."""
        held = self._tuples.get(table)
        if held is not None:
            return held
        if self._state[table] is self.initial[table]:
            return self._initial_rows(table)[0]
        return None

    async def refresh(
        self, episode: Episode, tables: list[str], updated: dict[str, set[str]] | None = None
    ) -> StateDiff:
        """Re-read `tables` from `episode`: their diff from the rows held so far, which they replace.

        `updated`, when known, names per table the columns the statements since the table was
        last read could have changed ('' for inserted or deleted rows). A table only updated, in
        columns outside its key, keeps its rows and their order: those columns alone are read
        and compared, and only the rows that differ are read in full.
        """
        out: StateDiff = {}
        async with episode.lock:
            conn = episode.conn
            for t in sorted(tables):
                cols = updated.get(t) if updated is not None else None
                if cols is not None and (done := self._take_columns(conn.raw, t, cols)) is not False:
                    d = done
                else:
                    d = self._take(t, await on_db_thread(conn, _fetch, conn.raw, self.readers[t].sql))
                if d is not None:
                    out[t] = d
        return out

    def _take_columns(self, raw: Any, table: str, updated: set[str]) -> TableDiff | Literal[False] | None:
        """`_take` for a table whose rows could only change in `updated` columns (False: not so)."""
        reader = self.readers[table]
        if "" in updated or not reader.fast or table in self._slow or set(reader.pk) & updated:
            return False
        initial = table not in self._tuples
        if initial:
            old_t, rows = self._initial_rows(table)
            if reader.shared(old_t, ()):
                return False
            self._tuples[table], self._rows[table] = old_t, dict(rows)
        old_t = self._tuples[table]
        idx = tuple(i for i, c in enumerate(reader.cols) if c in updated)
        if not idx:
            return None  # only columns the export leaves out (volatile ones)
        new_p = raw.execute(reader.projection(idx)).fetchall()
        # The rows as read last time, projected: kept from that read, or from the initial rows.
        last = self._projected.get(table)
        if last is not None and last[0] is old_t and last[1] == idx:
            old_p = last[2]
        else:
            old_p = reader.shared(old_t, idx) if initial else project(old_t, idx)
        if len(new_p) != len(old_p):
            return False
        if new_p == old_p:
            self._projected[table] = (old_t, idx, new_p)
            return None
        by_tuple = self._rows[table]
        new_t = list(old_t)
        gone, added = [], []
        key_at = itemgetter(*(reader.cols.index(c) for c in reader.pk))
        for i, (a, b) in enumerate(zip(old_p, new_p, strict=True)):
            if a == b:
                continue
            key = key_at(old_t[i])
            fresh = raw.execute(reader.by_key, key if len(reader.pk) > 1 else (key,)).fetchone()
            if fresh is None:
                return False
            gone.append(by_tuple.pop(old_t[i]))
            row = dict(zip(reader.cols, fresh, strict=True))
            by_tuple[fresh] = row
            added.append(row)
            new_t[i] = fresh
        self._tuples[table] = new_t
        self._projected[table] = (new_t, idx, new_p)
        self._pending.add(table)
        return index_diff(reader.pk, index_rows(gone, reader.pk), index_rows(added, reader.pk))

    def _take(self, table: str, new_t: list[tuple[Any, ...]]) -> TableDiff | None:
        reader = self.readers[table]
        if reader.fast and table not in self._slow:
            old_t = self._tuples.get(table)
            if old_t is None:
                old_t, rows = self._initial_rows(table)
                if reader.shared(old_t, ()):
                    self._slow.add(table)
                else:
                    self._tuples[table], self._rows[table] = old_t, dict(rows)
            if table not in self._slow:
                if new_t == old_t:
                    return None
                done = changes(reader, self._rows[table], new_t)
                if done is not None:
                    gone, fresh, added = done
                    by_tuple = self._rows[table]
                    for t in gone:
                        del by_tuple[t]
                    by_tuple.update(zip(fresh, added, strict=True))
                    self._tuples[table] = new_t
                    self._pending.add(table)
                    return index_diff(
                        reader.pk, index_rows(gone.values(), reader.pk), index_rows(added, reader.pk)
                    )
                self._slow.add(table)
        old_rows = self.state[table]
        new_rows = [dict(zip(reader.cols, r, strict=True)) for r in new_t]
        diff = diff_states({table: reader.pk}, {table: old_rows}, {table: new_rows}).get(table)
        if not same_rows(new_rows, old_rows, reader.loose):
            self._state[table] = new_rows
        self._rows.pop(table, None)
        self._tuples.pop(table, None)
        return diff

    def diff_from_initial(self) -> StateDiff:
        """`diff_states(initial, state)`, from the tuples of the tables that were re-read."""
        state = self.state
        out: StateDiff = {}
        for table in sorted(state):
            first, rows = self.initial[table], state[table]
            if rows is first:
                continue
            reader = self.readers[table]
            if table in self._tuples:
                init_rows = self._initial_rows(table)[1]
                done = changes(reader, init_rows, self._tuples[table])
                assert done is not None  # the table has no NULL key (it would be slow)
                gone, fresh, _ = done
                now = self._rows[table]
                d = index_diff(
                    reader.pk,
                    index_rows(gone.values(), reader.pk),
                    index_rows([now[t] for t in fresh], reader.pk),
                )
            else:
                d = diff_states({table: reader.pk}, {table: first}, {table: rows}).get(table)
            if d is not None:
                out[table] = d
        return out


def _fetch(conn: sqlite3.Connection, sql: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql).fetchall()


def changes(
    reader: TableReader, by_tuple: dict[tuple[Any, ...], Row], new_t: list[tuple[Any, ...]]
) -> tuple[dict[tuple[Any, ...], Row], list[tuple[Any, ...]], list[Row]] | None:
    """What turns the rows of `by_tuple` into `new_t`: (gone tuples with their rows, fresh tuples,
    fresh rows), or None when a fresh row's key holds NULL.

    Where a primary key holds no NULL it is unique, so a row whose tuple is in both is unchanged
    and every other row is inserted, deleted or updated: the gone and fresh rows, indexed by key,
    are all `index_diff` needs (`by_tuple` must have no NULL key: the caller's to know).
    """
    changed = set(new_t).symmetric_difference(by_tuple)  # the dict's stored hashes: no rehashing
    gone = {t: by_tuple[t] for t in changed if t in by_tuple}
    fresh = [t for t in changed if t not in by_tuple]
    if reader.null_key(fresh):
        return None
    cols = reader.cols
    return gone, fresh, [dict(zip(cols, t, strict=True)) for t in fresh]
