"""The one bounded memo synthesis keeps its caches in.

Synthesis memoises much per env and per run (tool results by episode state, parsed results and
what walks read off them, initial states, replay verdicts). Keys such as episode histories grow
with the run, so every memo that can grow is a `BoundedMemo`: a least-recently-used map with a
size cap, whose oldest entries go first when it is full. Memos only save work: an entry evicted
is recomputed on its next use, to the same value (tools are deterministic functions of state and
arguments), so the cap bounds memory without changing what synthesis writes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """A map of at most `limit` entries (never None values: None means a miss); reading an entry
    makes it the newest."""

    __slots__ = ("_data", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a memo holds at least one entry (limit {limit})")
        self.limit = limit
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value kept for `key` (now the newest entry), or None."""
        data = self._data
        value = data.get(key)
        if value is not None:
            data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        """Keep `value` for `key` as the newest entry, dropping the oldest beyond the cap."""
        data = self._data
        data[key] = value
        data.move_to_end(key)
        if len(data) > self.limit:
            data.popitem(last=False)
        return value

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The value kept for `key`, made (and kept) on a miss."""
        value = self.get(key)
        return value if value is not None else self.put(key, make())

    def pop(self, key: K) -> V | None:
        return self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()

    def keys(self) -> list[K]:
        """The keys, oldest first."""
        return list(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)
