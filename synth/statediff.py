"""Row-level diffs between canonical states, and the cents-normalised form scoring compares.

A task stores its initial state as a diff against the seed and its golden state as a diff against
the initial state, so `tasks.jsonl` stays small however large the seed is.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from envforge.server import State, canonical_json
from envforge.server.state import TableInfo

from .models import Row, RowUpdate, StateDiff, TableDiff


def _key(row: Row, pk: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(json.dumps(row.get(c), sort_keys=True) for c in pk)


def primary_keys(tables: list[TableInfo]) -> dict[str, tuple[str, ...]]:
    return {t.name: t.primary_key for t in tables}


def diff_states(pks: dict[str, tuple[str, ...]], before: State, after: State) -> StateDiff:
    """Changed rows per table: inserted and deleted rows in full, updates as changed columns."""
    out: StateDiff = {}
    for table in sorted(set(before) | set(after)):
        pk = pks[table]
        old = {_key(r, pk): r for r in before.get(table, [])}
        new = {_key(r, pk): r for r in after.get(table, [])}
        d = TableDiff()
        for k in sorted(new.keys() - old.keys()):
            d.inserted.append(new[k])
        for k in sorted(old.keys() - new.keys()):
            d.deleted.append(old[k])
        for k in sorted(old.keys() & new.keys()):
            a, b = old[k], new[k]
            if a != b:
                cols = [c for c in b if a.get(c) != b.get(c)]
                d.updated.append(
                    RowUpdate(
                        key={c: b[c] for c in pk},
                        before={c: a.get(c) for c in cols},
                        after={c: b[c] for c in cols},
                    )
                )
        if d.inserted or d.deleted or d.updated:
            out[table] = d
    return out


def apply_diff(pks: dict[str, tuple[str, ...]], state: State, diff: StateDiff) -> State:
    """`state` with `diff` applied (a new object; rows re-sorted by primary key)."""
    out: State = {t: list(rows) for t, rows in state.items()}
    for table, d in diff.items():
        pk = pks[table]
        rows = {_key(r, pk): dict(r) for r in out.get(table, [])}
        for r in d.deleted:
            rows.pop(_key(r, pk), None)
        for u in d.updated:
            k = _key(u.key, pk)
            if k not in rows:
                raise ValueError(f"diff updates a missing {table} row {u.key}")
            rows[k].update(u.after)
        for r in d.inserted:
            rows[_key(r, pk)] = dict(r)
        out[table] = [rows[k] for k in sorted(rows, key=lambda k: _sort_key(rows[k], pk))]
    return out


def _sort_key(row: Row, pk: tuple[str, ...]) -> tuple[Any, ...]:
    # SQLite orders NULL < numbers < text; enough for the value kinds primary keys hold.
    return tuple(
        (0, 0) if row.get(c) is None else (1, row[c]) if isinstance(row[c], int | float) else (2, str(row[c]))
        for c in pk
    )


def changed_rows(diff: StateDiff) -> int:
    return sum(len(d.inserted) + len(d.deleted) + len(d.updated) for d in diff.values())


def to_cents(value: Any) -> Any:
    """Floats rounded to cents, recursively: money computed two ways must still compare equal."""
    if isinstance(value, float):
        return round(value + 0.0, 2)
    if isinstance(value, dict):
        return {k: to_cents(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cents(v) for v in value]
    return value


def cents_hash(state: State) -> str:
    return hashlib.sha256(canonical_json(to_cents(state)).encode()).hexdigest()


def states_match(a: State, b: State) -> bool:
    """Canonical states equal with floats compared to cents; exact comparison first (fast, in C)."""
    if a.keys() != b.keys():
        return False
    for table, rows in a.items():
        other = b[table]
        if rows != other and (len(rows) != len(other) or to_cents(rows) != to_cents(other)):
            return False
    return True
