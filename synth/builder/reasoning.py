"""Reasoning steps over tool results: the computations an agent must do between calls.

Each function takes a parsed result and returns the concrete outcome, or None when the step
would be ambiguous (ties, no match), so a task never depends on an arbitrary choice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

Items = list[dict[str, Any]]


def collections(data: Any) -> list[tuple[list[str], Items]]:
    """Lists of at least two objects inside a result, each with its key path from the top."""
    out: list[tuple[list[str], Items]] = []

    def walk(v: Any, path: list[str]) -> None:
        if isinstance(v, list):
            if len(v) >= 2 and all(isinstance(x, dict) for x in v):
                out.append((path, v))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, [*path, k])

    walk(data, [])
    return out


def at_path(data: Any, path: list[str]) -> Any:
    for k in path:
        data = data[k]
    return data


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def numeric_fields(items: Items) -> list[str]:
    keys = [k for k in items[0] if all(is_number(it.get(k)) for it in items)]
    return sorted(keys)


def text_fields(items: Items) -> list[str]:
    return sorted(k for k in items[0] if all(isinstance(it.get(k), str) for it in items))


def extreme(items: Items, field: str, select: str, op: str) -> Any:
    """`select` of the item with the largest (argmax) or smallest (argmin) `field`; None on a tie."""
    values = [it[field] for it in items]
    best = max(values) if op == "argmax" else min(values)
    winners = [it for it in items if it[field] == best]
    if len(winners) != 1 or select not in winners[0]:
        return None
    return winners[0][select]


def unique_matches(items: Items, field: str) -> list[Any]:
    """Values of `field` held by exactly one item (so filtering on them selects one item)."""
    counts = Counter(it[field] for it in items)
    return sorted(v for v, n in counts.items() if n == 1)


def filter_select(items: Items, field: str, equals: Any, select: str) -> Any:
    hits = [it for it in items if it.get(field) == equals]
    if len(hits) != 1 or select not in hits[0]:
        return None
    return hits[0][select]


def count_where(items: Items, field: str, equals: Any) -> int:
    return sum(1 for it in items if it.get(field) == equals)


def total(items: Items, field: str) -> float | int:
    s = sum(it[field] for it in items)
    return round(s, 2) if isinstance(s, float) else s


def format_number(v: float | int) -> str:
    """How a computed figure is written in required outputs: integers plain, money to cents."""
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)
