"""Row-level diffs between canonical states, and the cents-normalised form scoring compares.

A task stores its initial state as a diff against the seed and its golden state as a diff against
the initial state, so `tasks.jsonl` stays small however large the seed is.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Collection, Iterator, Mapping
from json.encoder import c_make_encoder, encode_basestring, encode_basestring_ascii  # type: ignore[attr-defined]
from operator import itemgetter
from typing import Any

from envforge.server import State, TableInfo, canonical_json, prefix_digest, state_hash, table_json

from .models import Row, RowUpdate, StateDiff, TableDiff


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


# `json.dumps` builds an encoder per call; these are built once, with `json.dumps`'s C encoder and
# the settings of the calls they replace, so their text is `json.dumps`'s (no circular-reference
# check: the values are parsed JSON and exported rows).
if c_make_encoder is not None:
    _SORTED = c_make_encoder(None, _not_json, encode_basestring_ascii, None, ": ", ", ", True, False, True)
    _CANONICAL = c_make_encoder(None, _not_json, encode_basestring, None, ":", ",", True, False, False)
else:  # no C accelerator: the plain calls
    _SORTED = lambda v, _: json.dumps(v, sort_keys=True)  # noqa: E731
    _CANONICAL = lambda v, _: json.dumps(  # noqa: E731
        v, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def json_key(value: Any) -> str:
    """`json.dumps(value, sort_keys=True)`: a value's identity as text (keys, memo keys)."""
    return "".join(_SORTED(value, 0))


def _key(row: Row, pk: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(json_key(row.get(c)) for c in pk)


def primary_keys(tables: list[TableInfo]) -> dict[str, tuple[str, ...]]:
    return {t.name: t.primary_key for t in tables}


def entity_ids(state: State, keys: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Every primary-key value of `state` (`keys`: each table's key columns), in table order: the
    entity ids a state holds (a `spray` adversary states them all)."""
    out: list[str] = []
    for table, rows in state.items():
        for column in keys.get(table, ()):
            out.extend(str(r[column]) for r in rows if r.get(column) is not None)
    return out


def _json_key(key: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(json_key(v) for v in key)


def index_rows(rows: Collection[Row], pk: tuple[str, ...]) -> dict[tuple[Any, ...], Row]:
    """Rows by the tuple of their primary-key values (later rows win, as in a dict comprehension)."""
    try:
        if len(pk) == 1:
            (c,) = pk
            return {(r[c],): r for r in rows}
        get = itemgetter(*pk)
        return {get(r): r for r in rows}
    except KeyError:  # a row lacking a key column: it keys as None, as `row.get` gives
        return {tuple(r.get(c) for c in pk): r for r in rows}


def diff_states(pks: dict[str, tuple[str, ...]], before: State, after: State) -> StateDiff:
    """Changed rows per table: inserted and deleted rows in full, updates as changed columns.

    Rows are matched on their primary-key values, and a table whose row lists are equal (checked
    in C) is skipped without indexing. Within a table, inserted, deleted and updated rows are
    ordered by their keys' JSON text, so the diff (and `tasks.jsonl`) reads the same as ever.
    """
    out: StateDiff = {}
    for table in sorted(set(before) | set(after)):
        old_rows = before.get(table, [])
        new_rows = after.get(table, [])
        if old_rows == new_rows:
            continue
        pk = pks[table]
        try:
            old = index_rows(old_rows, pk)
            new = index_rows(new_rows, pk)
        except TypeError:  # an unhashable key value: match on the keys' JSON text instead
            old = {_key(r, pk): r for r in old_rows}
            new = {_key(r, pk): r for r in new_rows}
        d = index_diff(pk, old, new)
        if d is not None:
            out[table] = d
    return out


def index_diff(pk: tuple[str, ...], old: dict[Any, Row], new: dict[Any, Row]) -> TableDiff | None:
    """One table's diff from its rows indexed by key, before and after (None: no change).

    The indexes may leave out rows that are the same before and after (the diff does not list
    them anyway), which is how `mirror.py` diffs only the rows it saw change.
    """
    d = TableDiff()
    for k in sorted(new.keys() - old.keys(), key=_json_key):
        d.inserted.append(new[k])
    for k in sorted(old.keys() - new.keys(), key=_json_key):
        d.deleted.append(old[k])
    changed = [k for k, a in old.items() if k in new and a != new[k]]
    for k in sorted(changed, key=_json_key):
        a, b = old[k], new[k]
        cols = [c for c in b if a.get(c) != b.get(c)]
        d.updated.append(
            RowUpdate(
                key={c: b[c] for c in pk},
                before={c: a.get(c) for c in cols},
                after={c: b[c] for c in cols},
            )
        )
    return d if d.inserted or d.deleted or d.updated else None


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


def to_cents(value: Any) -> Any:
    """Floats rounded to cents, recursively: money computed two ways must still compare equal."""
    if isinstance(value, float):
        return round(value + 0.0, 2)
    if isinstance(value, dict):
        return {k: to_cents(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cents(v) for v in value]
    return value


_PLAIN = frozenset({str, int, type(None), bool, bytes})


def cents_row(row: Any) -> Any:
    """`to_cents(row)` with one dict comprehension for the flat rows exports hold."""
    if type(row) is not dict:
        return to_cents(row)
    return {
        k: v if type(v) in _PLAIN else round(v + 0.0, 2) if type(v) is float else to_cents(v)
        for k, v in row.items()
    }


def cents_rows(rows: Any) -> Any:
    """`to_cents(rows)` for one table's list of rows."""
    if type(rows) is not list:
        return to_cents(rows)
    return [cents_row(r) for r in rows]


def _table_json(rows: Any) -> str:
    """`json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)`."""
    return "".join(_CANONICAL(rows, 0))


# Raw JSON of a table -> JSON of its cents form. Equal JSON text means equal values (floats
# round-trip through repr), so the cents form can be reused for any table serialising the same:
# the tables a task does not touch are converted once per run instead of once per state.
# Bounded by the characters held (keys and values), not entries: some seed tables are large.
_CENTS_JSON: dict[str, str] = {}
_CENTS_JSON_CHARS = [0]
_CENTS_JSON_LIMIT = 16_000_000


def _cents_json(raw: str, rows: Any) -> str:
    cents = _CENTS_JSON.get(raw)
    if cents is None:
        cents = _table_json(cents_rows(rows))
        size = len(raw) + len(cents)
        if _CENTS_JSON_CHARS[0] + size > _CENTS_JSON_LIMIT:
            _CENTS_JSON.clear()
            _CENTS_JSON_CHARS[0] = 0
        if size <= _CENTS_JSON_LIMIT:
            _CENTS_JSON[raw] = cents
            _CENTS_JSON_CHARS[0] += size
    return cents


def state_hashes(state: State) -> tuple[str, str]:
    """(`state_hash(state)`, `cents_hash(state)`) from one serialisation of each table.

    The canonical JSON of a dict with sorted keys is its sorted `"key":value` members joined by
    commas, so both digests are assembled table by table from the same per-table JSON.
    """
    if type(state) is not dict or not all(type(t) is str for t in state):
        return state_hash(state), hashlib.sha256(canonical_json(to_cents(state)).encode()).hexdigest()
    plain, cents = [], []
    for table in sorted(state):
        name = _table_json(table) + ":"
        rows = state[table]
        raw = table_json(rows) if type(rows) is list else _table_json(rows)  # frozen tables: cached
        plain.append(name + raw)
        cents.append(name + _cents_json(raw, state[table]))
    return (
        hashlib.sha256(("{" + ",".join(plain) + "}").encode()).hexdigest(),
        hashlib.sha256(("{" + ",".join(cents) + "}").encode()).hexdigest(),
    )


def cents_hash(state: State) -> str:
    """sha256 of `canonical_json(to_cents(state))` (see `state_hashes`), without the exact digest:
    scoring a trial needs only this one, and each digest reads the whole state."""
    if type(state) is not dict or not all(type(t) is str for t in state):
        return state_hashes(state)[1]

    def feed(digest: Any, i: int, table: str) -> None:
        rows = state[table]
        raw = table_json(rows) if type(rows) is list else _table_json(rows)  # frozen tables: cached
        head = ("," if i else "") + _table_json(table) + ":"
        digest.update((head + _cents_json(raw, rows)).encode())

    tables = sorted(state)
    # the leading frozen tables (unwritten by the episode) resume from a remembered midstate
    digest, done = prefix_digest("cents_hash", state, tables, feed)
    for i in range(done, len(tables)):
        feed(digest, i, tables[i])
    digest.update(b"}")
    return digest.hexdigest()


def states_match(a: State, b: State) -> bool:
    """Canonical states equal with floats compared to cents; exact comparison first (fast, in C)."""
    if a.keys() != b.keys():
        return False
    for table, rows in a.items():
        other = b[table]
        if rows == other:
            continue
        if len(rows) != len(other):
            return False
        if type(rows) is not list or type(other) is not list:
            if to_cents(rows) != to_cents(other):
                return False
        elif not all(x == y or cents_row(x) == cents_row(y) for x, y in zip(rows, other, strict=True)):
            return False  # row by row: only rows that differ exactly are rounded
    return True


#: How many renamings of created ids `matches_up_to_created_ids` tries at most (rows of one shape
#: can be named in any order: 5 alike are 120 ways).
MAX_RENAMINGS = 120


def matches_up_to_created_ids(
    final: State,
    golden_diff: StateDiff,
    keys: Mapping[str, tuple[str, ...]],
    matches: Callable[[State], bool],
) -> bool:
    """Whether `final` matches (by `matches`) once the ids of rows it created are renamed to the
    golden run's.

    Tools name a new row after the ones before it (`MAX(id) + 1`), so the same rows created in
    another order (two independent bookings, a list argument's items) carry each other's ids, and
    every reference to them follows. Such a state is the golden one up to the names of what the
    episode created. The created rows (string keys of one column, from `golden_diff`) are paired
    with the golden ones field for field: a row alone in its shape pairs at once, and each pairing
    tells how references to it read, which can single out more rows (an order by its items). Rows
    still alike are tried in each order, at most MAX_RENAMINGS renamings in all, and every
    renaming is applied to the whole state and compared whole. Rows the golden run did not create,
    and integer keys (a renamed 3 could be a count), are never renamed.
    """
    created: list[tuple[str, list[Row], list[Row]]] = []  # (key column, golden rows, final rows)
    for table, diff in golden_diff.items():
        pk = keys.get(table, ())
        if not diff.inserted or len(pk) != 1 or table not in final:
            continue
        (column,) = pk
        ids = {r.get(column) for r in diff.inserted}
        if not all(isinstance(i, str) for i in ids):
            continue
        created.append((column, diff.inserted, [r for r in final[table] if r.get(column) in ids]))
    new_ids = {r[c] for c, golden_rows, _ in created for r in golden_rows}
    if not new_ids:
        return False
    renames: dict[str, str] = {}  # a final created id -> the golden id it stands for

    def shape(row: Row, column: str, names: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """The row's fields but its key; a reference to a created row reads as the golden id it is
        known to stand for (`names`), or as unknown."""
        return tuple(
            sorted(
                (k, names.get(v, "?") if v in new_ids else json_key(to_cents(v)))
                for k, v in row.items()
                if k != column
            )
        )

    rows_by_id = {  # each created id's row, on each side
        side: {r[c]: r for c, golden_rows, final_rows in created for r in (final_rows, golden_rows)[side]}
        for side in (0, 1)
    }

    def pair(old: str, new: str) -> bool:
        """Pair a final id with a golden one, and the created rows their rows refer to alike;
        False where that contradicts a pairing made before (then no renaming can match)."""
        if renames.get(old, new) != new or (old not in renames and new in renames.values()):
            return False
        if old in renames:
            return True
        renames[old] = new
        mine, theirs = rows_by_id[0].get(old, {}), rows_by_id[1].get(new, {})
        return all(
            pair(v, theirs[k])
            for k, v in mine.items()
            if v != old and v in new_ids and theirs.get(k) in new_ids
        )

    alike: list[tuple[list[str], list[str]]] = []  # (final ids, golden ids) still to be paired
    progress = True
    while progress:
        progress, alike = False, []
        names = dict(renames)  # what this round reads references by, on both sides alike
        known = {g: g for g in names.values()}
        for column, golden_rows, final_rows in created:
            groups: dict[tuple[tuple[str, str], ...], tuple[list[str], list[str]]] = {}
            for row in golden_rows:
                if row[column] not in known:
                    groups.setdefault(shape(row, column, known), ([], []))[1].append(row[column])
            for row in final_rows:
                if row[column] not in names:
                    groups.setdefault(shape(row, column, names), ([], []))[0].append(row[column])
            for final_ids, golden_ids in groups.values():
                if len(final_ids) != len(golden_ids):
                    return False
                if len(final_ids) == 1:
                    if not pair(final_ids[0], golden_ids[0]):
                        return False
                    progress = True
                else:
                    alike.append((final_ids, golden_ids))
    tried = 0
    for rest in _pairings(alike):
        renaming = {old: new for old, new in {**renames, **rest}.items() if old != new}
        if not renaming:
            continue
        if tried == MAX_RENAMINGS:
            return False
        tried += 1
        if matches(_renamed(final, renaming, keys)):
            return True
    return False


def _pairings(groups: list[tuple[list[str], list[str]]]) -> Iterator[dict[str, str]]:
    """Every way to pair each group's final ids with its golden ids, one at a time (lazily: alike
    rows by the dozen would be more orders than memory holds)."""
    if not groups:
        yield {}
        return
    (final_ids, golden_ids), rest = groups[0], groups[1:]
    for order in itertools.permutations(final_ids):
        for more in _pairings(rest):
            yield {**dict(zip(order, golden_ids, strict=True)), **more}


def _renamed(state: State, renames: Mapping[str, str], keys: Mapping[str, tuple[str, ...]]) -> State:
    """`state` with every cell holding a renamed id renamed, and each table with a renamed cell
    re-sorted by its key (an export lists rows by key; a key may hold a reference). Tables with
    nothing renamed are kept as they are."""
    out: State = {}
    for table, rows in state.items():
        changed = False
        new_rows = []
        for row in rows:
            if any(type(v) is str and v in renames for v in row.values()):
                row = {k: renames.get(v, v) if type(v) is str else v for k, v in row.items()}
                changed = True
            new_rows.append(row)
        if not changed:
            out[table] = rows
            continue
        if keys.get(table):
            new_rows.sort(key=lambda r: _sort_key(r, keys[table]))
        out[table] = new_rows
    return out
