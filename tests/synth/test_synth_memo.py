"""The bounded memo synthesis caches in: a size cap, least recently used entries dropped first."""

from __future__ import annotations

import pytest

from envforge.synth.walk.memo import BoundedMemo


def test_memo_keeps_at_most_its_limit_dropping_the_least_recently_used() -> None:
    memo: BoundedMemo[str, int] = BoundedMemo(3)
    for i, key in enumerate("abc"):
        memo.put(key, i)
    assert memo.get("a") == 0  # read: now the newest
    memo.put("d", 3)
    assert len(memo) == 3 and "b" not in memo and memo.keys() == ["c", "a", "d"]
    assert memo.get("b") is None
    made: list[str] = []
    assert memo.get_or_make("e", lambda: made.append("e") or 4) == 4
    assert memo.get_or_make("e", lambda: made.append("again") or 5) == 4
    assert made == ["e"] and memo.keys() == ["a", "d", "e"]
    assert memo.get_or_make("f", lambda: 0) == 0 and memo.get("f") == 0  # falsy values are kept


def test_memo_needs_room_for_one() -> None:
    with pytest.raises(ValueError):
        BoundedMemo(0)
