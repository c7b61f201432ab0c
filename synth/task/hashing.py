"""State hashes of states that differ from a known initial state in a few rows.

A task's golden state shares most rows with its initial state: the tables no call wrote are the
initial state's own (frozen) lists, and a written table usually changes a row or two of many.
`StateHasher` serialises the initial state's rows once and reuses those texts for every row of a
later state that is exactly the same, so a golden state costs the JSON of its changed rows only.
The hashes are `statediff.state_hashes`'s, byte for byte: a table's canonical JSON is its rows'
canonical JSON joined by commas inside brackets.

"Exactly the same" is stricter than `==`: `1 == 1.0`, but they serialise differently. SQLite
returns one Python type per stored value kind, and a column with a numeric or text affinity
stores equal values as the same kind, so `==` is exact except in columns without an affinity
(declared with no type, or BLOB), where an integer and a real can be equal; those columns'
types are compared as well (`loose_columns`).
"""

from __future__ import annotations

import hashlib
from operator import itemgetter
from typing import Any

from envforge.server import Environment, State, open_database, quote_ident, table_json

from .statediff import _cents_json, _table_json, cents_row, state_hashes

Row = dict[str, Any]


def loose_columns(env: Environment) -> dict[str, tuple[str, ...]]:
    """Per table, the columns with BLOB affinity (values stored as given: 1 and 1.0 both occur)."""
    conn = open_database(env.seed_db)
    try:
        out: dict[str, tuple[str, ...]] = {}
        for t in env.tables:
            info = conn.execute(f"PRAGMA table_info({quote_ident(t.name)})").fetchall()
            cols = tuple(row[1] for row in info if _stored_as_given(row[2] or ""))
            if cols:
                out[t.name] = cols
        return out
    finally:
        conn.close()


def _stored_as_given(declared: str) -> bool:
    """Whether a column of this declared type has no affinity (SQLite's rules, in their order)."""
    d = declared.upper()
    if "INT" in d or any(k in d for k in ("CHAR", "CLOB", "TEXT")):
        return False
    return "BLOB" in d or not d.strip() or d.strip() == "ANY"  # ANY: a STRICT table's untyped column


def same_row(a: Row, b: Row, loose: tuple[str, ...]) -> bool:
    """`a == b` with the types of `loose` columns compared too (so both serialise alike)."""
    if a is b:
        return True
    if a != b:
        return False
    return all(type(a.get(c)) is type(b.get(c)) for c in loose)


def same_rows(a: list[Row], b: list[Row], loose: tuple[str, ...]) -> bool:
    """Row lists that serialise identically (see `same_row`)."""
    if a is b:
        return True
    if a != b:
        return False
    return not loose or all(same_row(x, y, loose) for x, y in zip(a, b, strict=True))


class StateHasher:
    """`state_hashes` for states derived from one frozen `base` state (see the module docstring).

    A row that is one of the base's own row objects (a `Mirror` keeps unchanged rows' objects) is
    found by identity; another row equal to the base's row with its key (a copy) by key.
    """

    def __init__(
        self, base: State, pks: dict[str, tuple[str, ...]], loose: dict[str, tuple[str, ...]]
    ) -> None:
        self.base = base
        self.pks = pks
        self.loose = loose
        # table -> id of a base row -> (its JSON, its cents JSON), built on first use; the base
        # holds its rows, so their ids are not reused
        self._by_id: dict[str, dict[int, tuple[str, str]]] = {}
        # table -> primary-key values -> (base row, its texts); None when keys are missing or repeat
        self._by_key: dict[str, dict[tuple[Any, ...], tuple[Row, tuple[str, str]]] | None] = {}
        self._tables = sorted(base) if all(type(t) is str for t in base) else []
        self._prefixes: list[tuple[Any, Any]] = []

    def _ids(self, table: str) -> dict[int, tuple[str, str]]:
        ids = self._by_id.get(table)
        if ids is None:
            rows = self.base.get(table)
            rows = rows if type(rows) is list else []
            ids = self._by_id[table] = {id(r): (_table_json(r), _table_json(cents_row(r))) for r in rows}
        return ids

    def _keys(self, table: str) -> dict[tuple[Any, ...], tuple[Row, tuple[str, str]]] | None:
        if table in self._by_key:
            return self._by_key[table]
        pk = self.pks.get(table, ())
        ids = self._ids(table)
        index: dict[tuple[Any, ...], tuple[Row, tuple[str, str]]] | None = None
        if pk:
            try:
                rows = self.base[table]
                index = {tuple(r[c] for c in pk): (r, ids[id(r)]) for r in rows}
                if len(index) != len(rows):
                    index = None  # repeated keys: no reuse by key
            except (KeyError, TypeError):
                index = None
        self._by_key[table] = index
        return index

    def _row_texts(self, table: str, row: Row) -> tuple[str, str]:
        index = self._keys(table)
        if index is not None:
            try:
                hit = index.get(tuple(row[c] for c in self.pks[table]))
            except (KeyError, TypeError):
                hit = None
            if hit is not None and same_row(hit[0], row, self.loose.get(table, ())):
                return hit[1]
        return _table_json(row), _table_json(cents_row(row))

    def _texts(self, table: str, rows: list[Row]) -> tuple[str, str]:
        """(JSON, cents JSON) of a table's rows, from the base's row texts where rows are the same."""
        texts = list(map(self._ids(table).get, map(id, rows)))
        i = -1
        while None in texts:
            i = texts.index(None, i + 1)
            texts[i] = self._row_texts(table, rows[i])
        return (
            "[" + ",".join(map(itemgetter(0), texts)) + "]",  # type: ignore[arg-type]
            "[" + ",".join(map(itemgetter(1), texts)) + "]",  # type: ignore[arg-type]
        )

    def hashes(self, state: State) -> tuple[str, str]:
        """(`state_hash(state)`, `cents_hash(state)`), as `statediff.state_hashes` computes them.

        The digests are over `{"table":rows,...}` with tables in name order; the part of it made
        of the base's own tables up to the first table that is not is hashed once (`_prefix`).
        """
        if type(state) is not dict or not all(type(t) is str for t in state):
            return state_hashes(state)
        tables = sorted(state)
        k = 0
        if tables == self._tables:
            while k < len(tables) and state[tables[k]] is self.base[tables[k]]:
                k += 1
        plain, cents = self._prefix(k)
        for i in range(k, len(tables)):
            table = tables[i]
            name = ("," if i else "") + _table_json(table) + ":"
            rows = state[table]
            if type(rows) is list and rows is not self.base.get(table):
                texts = self._texts(table, rows)
            else:
                raw = table_json(rows) if type(rows) is list else _table_json(rows)
                texts = (raw, _cents_json(raw, rows))
            plain.update((name + texts[0]).encode())
            cents.update((name + texts[1]).encode())
        plain.update(b"}")
        cents.update(b"}")
        return plain.hexdigest(), cents.hexdigest()

    def _prefix(self, k: int) -> tuple[Any, Any]:
        """Copies of the two digests fed `{` and the base's first `k` tables (with separators)."""
        if not self._prefixes:
            self._prefixes.append((hashlib.sha256(b"{"), hashlib.sha256(b"{")))
        while len(self._prefixes) <= k:
            i = len(self._prefixes) - 1
            table = self._tables[i]
            rows = self.base[table]
            raw = table_json(rows) if type(rows) is list else _table_json(rows)
            name = ("," if i else "") + _table_json(table) + ":"
            plain, cents = (h.copy() for h in self._prefixes[i])
            plain.update((name + raw).encode())
            cents.update((name + _cents_json(raw, rows)).encode())
            self._prefixes.append((plain, cents))
        plain, cents = self._prefixes[k]
        return plain.copy(), cents.copy()
