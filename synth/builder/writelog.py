"""What a walk's writes did so far, so that a later write never undoes an earlier one.

A walk that books and then cancels, or sets a status and then sets it back, tells a story whose
end state is its start: such a task rewards doing nothing. The log keeps the keys of the rows the
walk's writes inserted and each changed column's value before the walk, and says whether a new
write's diff undoes either, or whether a call names a row the walk itself inserted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..task.models import Call, StateDiff
from ..task.statediff import json_key

_UNSET = object()


@dataclass
class WriteLog:
    """One walk's log of what its writes did."""

    # the keys of the rows the walk's writes inserted, per table and all together
    inserted: dict[str, set[Any]] = field(default_factory=dict)
    inserted_keys: set[Any] = field(default_factory=set)
    # each changed column's value before the walk changed it, by (table, row key, column)
    before_walk: dict[tuple[str, str, str], Any] = field(default_factory=dict)

    def note(self, diff: StateDiff, pks: Mapping[str, tuple[str, ...]]) -> None:
        """Record a write's diff (`pks`: each table's key columns)."""
        for table, d in diff.items():
            pk = pks[table]
            if len(pk) == 1:
                keys = {r.get(pk[0]) for r in d.inserted}
                self.inserted.setdefault(table, set()).update(keys)
                self.inserted_keys |= keys
            for u in d.updated:
                key = json_key(u.key)
                for col, value in u.before.items():
                    self.before_walk.setdefault((table, key, col), value)

    def undoes(self, diff: StateDiff, pks: Mapping[str, tuple[str, ...]]) -> bool:
        """Whether a write's diff undoes what an earlier write of the walk did: it deletes or changes
        a row the walk inserted, or sets a column back to its value before the walk changed it."""
        for table, d in diff.items():
            pk = pks[table]
            made = self.inserted.get(table)
            if made and len(pk) == 1:
                if any(r.get(pk[0]) in made for r in d.deleted):
                    return True
                if any(u.key.get(pk[0]) in made for u in d.updated):
                    return True
            if self.before_walk:
                for u in d.updated:
                    key = json_key(u.key)
                    for col, value in u.after.items():
                        old = self.before_walk.get((table, key, col), _UNSET)
                        if old is not _UNSET and old == value:
                            return True
        return False

    def names_own_insert(self, call: Call) -> bool:
        """Whether any argument of `call` is the key of a row the walk inserted."""
        if not self.inserted_keys:
            return False
        for v in call.arguments.values():
            for item in v if isinstance(v, list) else [v]:
                try:
                    if item in self.inserted_keys:
                        return True
                except TypeError:
                    continue
        return False
