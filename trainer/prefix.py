"""Shared prompt prefixes: the episodes of a batch open with the same system prompt (and a group's
with the same task), most of each sequence, so the sampler and the learner both run a common prefix
once and share its cache. Both decide what counts as common here."""

from __future__ import annotations

from collections.abc import Sequence

MIN_SHARED_PREFIX = 16
"""A common prefix shorter than this runs with each row: sharing it saves less than a forward costs."""


def common_prefix(rows: Sequence[Sequence[int]], most: int | None = None) -> int:
    """How many leading tokens every row has in common (at most `most`)."""
    first = rows[0]
    n = min(len(r) for r in rows)
    if most is not None:
        n = min(n, most)
    for i in range(n):
        if any(r[i] != first[i] for r in rows):
            return i
    return n
