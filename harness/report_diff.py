"""Expected vs actual end state, from two stored diffs and nothing else.

A task stores its golden end state as a diff against its initial state (`golden_diff`) and a trial
record stores its end state the same way (`final_diff`). Both are diffs from the *same* initial
state, so where they differ is where the end states differ, row by row and column by column,
without the seed, the env or its tools: an updated column's initial value is in the other side's
`before`, a deleted row is stored whole. The report can so show what went wrong for every failed
trial of a large run without loading an env (for a confined env that is a sandboxed worker).

Rows are matched on their primary key. The keys are read off the diffs themselves (an update
carries its row's key columns) and the task's checkpoints; a table whose rows were only ever
inserted or deleted, in every diff seen, matches its rows whole (a changed row then reads as one
missing and one unexpected row, which is still true).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from envforge.synth import StateDiff, TableDiff, Task

Line = tuple[str, str, str, str, str]
"""(table, row key, column, expected, actual): one cell or whole row that differs."""

Cell = tuple[str, str, str]
"""(column, expected, actual) of one row."""

MISSING = "missing"
"""What a row absent from an end state reads as (`actual` when the golden run has it, `expected`
when only the trial does)."""


def text(value: Any) -> str:
    """A cell value as JSON text, so that the string "1" and the number 1 read differently."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def keys_of(tasks: Iterable[Task], diffs: Iterable[StateDiff] = ()) -> dict[str, tuple[str, ...]]:
    """The primary-key columns of every table some update or checkpoint names a row of."""
    pks: dict[str, tuple[str, ...]] = {}
    all_diffs = list(diffs)
    for task in tasks:
        for check in task.checkpoints:
            for row in check.rows:
                pks.setdefault(row.table, tuple(row.key))
        all_diffs += [task.golden_diff, task.setup]
    for diff in all_diffs:
        for table, d in diff.items():
            if d.updated:
                pks.setdefault(table, tuple(d.updated[0].key))
    return pks


Effect = tuple[str, dict[str, Any], dict[str, Any]]
"""What a diff did to one row: ("ins", row, {}), ("del", row, {}) or ("upd", before, after)."""


def _row_key(row: dict[str, Any], pk: tuple[str, ...] | None) -> str:
    return text([row.get(c) for c in pk]) if pk else text(row)


def _effects(d: TableDiff | None, pk: tuple[str, ...] | None) -> dict[str, tuple[Effect, dict[str, Any]]]:
    """Each changed row's effect and its key columns, by the key's text."""
    out: dict[str, tuple[Effect, dict[str, Any]]] = {}
    if d is None:
        return out
    for row in d.inserted:
        out[_row_key(row, pk)] = (("ins", row, {}), _key_cols(row, pk))
    for row in d.deleted:
        out[_row_key(row, pk)] = (("del", row, {}), _key_cols(row, pk))
    for u in d.updated:
        out[_row_key(u.key, pk)] = (("upd", u.before, u.after), u.key)
    return out


def _key_cols(row: dict[str, Any], pk: tuple[str, ...] | None) -> dict[str, Any]:
    return {c: row.get(c) for c in pk} if pk else {}


def _whole(row: dict[str, Any], pk: tuple[str, ...] | None) -> str:
    """A whole row's non-key columns, one `column=value` a line."""
    return "\n".join(f"{c}={text(v)}" for c, v in row.items() if not pk or c not in pk)


def _cells(expected: dict[str, Any], actual: dict[str, Any], cols: Iterable[str]) -> list[Cell]:
    return [(c, text(expected.get(c)), text(actual.get(c))) for c in cols if expected.get(c) != actual.get(c)]


def _compare(
    golden: Effect | None, final: Effect | None, pk: tuple[str, ...] | None
) -> list[tuple[str, str, str]]:
    """(column, expected, actual) where one row's two effects leave it different; "(row)" for a
    row one end state lacks."""
    if golden == final:
        return []
    if golden is None:
        assert final is not None
        kind, a, b = final
        if kind == "ins":
            return [("(row)", MISSING, _whole(a, pk))]
        if kind == "del":
            return [("(row)", _whole(a, pk), MISSING)]
        return _cells(a, b, b)  # an update the golden run did not make: initial vs the trial's
    if final is None:
        kind, a, b = golden
        if kind == "ins":
            return [("(row)", _whole(a, pk), MISSING)]
        if kind == "del":
            return [("(row)", MISSING, _whole(a, pk))]
        return _cells(b, a, b)  # an update the trial did not make: the golden value vs initial
    (gk, ga, gb), (fk, fa, fb) = golden, final
    if gk == fk == "ins":
        return _cells(ga, fa, dict.fromkeys([*ga, *fa]))
    if gk == fk == "upd":
        cols = dict.fromkeys([*gb, *fb])
        expected = {c: gb[c] if c in gb else fa.get(c) for c in cols}  # fa: the initial value
        actual = {c: fb[c] if c in fb else ga.get(c) for c in cols}
        return _cells(expected, actual, cols)
    if gk == "del" and fk == "upd":
        return [("(row)", MISSING, _whole({**ga, **fb}, pk))]
    if gk == "upd" and fk == "del":
        return [("(row)", _whole({**fa, **gb}, pk), MISSING)]
    return [("(row)", _whole({**ga, **gb}, pk), _whole({**fa, **fb}, pk))]


def end_state_lines(golden: StateDiff, final: StateDiff, pks: dict[str, tuple[str, ...]]) -> list[Line]:
    """Every cell where the trial's end state differs from the golden one, table by table, rows in
    key order; whole rows for rows only one of them has."""
    lines: list[Line] = []
    for table in sorted(set(golden) | set(final)):
        pk = pks.get(table)
        g, f = _effects(golden.get(table), pk), _effects(final.get(table), pk)
        for key in sorted(set(g) | set(f)):
            key_cols = (g.get(key) or f[key])[1]
            key_text = ", ".join(f"{c}={text(v)}" for c, v in key_cols.items()) or "(whole row)"
            for col, expected, actual in _compare(
                g[key][0] if key in g else None, f[key][0] if key in f else None, pk
            ):
                lines.append((table, key_text, col, expected, actual))
    return lines
