"""What walks read off a tool result, worked out once per parsed result and shared across walks.

A read on an initial state (the seed's, or a setup's) is answered from the context's memo: every
walk that makes it gets the very same parsed result object (`SynthContext.parsed`). Which values
each key of it holds, and which of those each graph edge from its tool can carry, are functions
of that object alone, so they are kept per object (held, so that its id is not reused) instead
of being recomputed by each walk that lands on it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from ..graph.domains import accepts
from ..graph.footprint import scalar_pairs
from ..task.statediff import json_key
from .memo import BoundedMemo
from .outcomes import value_key

if TYPE_CHECKING:
    from ..graph.graphindex import PlannedEdge

# Results whose readings are kept (bounds memory: the results of writes are new objects every
# time, and seldom read again).
KEPT = 20_000

# One way to extend a walk from a result: the planned edge, the values it can carry (in
# `key_values` order), and the `Outcomes.values` key of its value when it has only one.
Extension = tuple["PlannedEdge", list[Any], Hashable | None]


def _scalar_text(v: Any) -> str:
    """`json_key(v)` for a scalar, with strings (most values) encoded directly."""
    return encode_basestring_ascii(v) if type(v) is str else json_key(v)


def key_values(data: Any) -> dict[str, list[Any]]:
    """Per key, the distinct scalar values under it anywhere in `data`, in JSON-text order (the
    last seen of equal texts); a key with one value keeps it as is."""
    texts: dict[str, dict[str, Any]] = {}
    for k, v in scalar_pairs(data):
        vals = texts.get(k)
        if vals is None:
            vals = texts[k] = {}
        vals[_scalar_text(v)] = v
    return {
        k: list(vals.values()) if len(vals) == 1 else [vals[t] for t in sorted(vals)]
        for k, vals in texts.items()
    }


class ResultReadings:
    """`key_values` and `extensions` per result object, computed on first use."""

    def __init__(self) -> None:
        # by the result's id, with the result itself held (so that its id is not reused)
        self._values: BoundedMemo[int, tuple[Any, dict[str, list[Any]]]] = BoundedMemo(KEPT)
        self._extensions: BoundedMemo[tuple[int, str], tuple[Any, list[Extension]]] = BoundedMemo(KEPT)
        self._allowed: BoundedMemo[tuple[int, str, Hashable], tuple[Any, list[Extension]]] = BoundedMemo(KEPT)

    def values(self, data: Any) -> dict[str, list[Any]]:
        hit = self._values.get(id(data))
        if hit is None or hit[0] is not data:
            hit = self._values.put(id(data), (data, key_values(data)))
        return hit[1]

    def extensions(self, tool: str, data: Any, plan: list[PlannedEdge]) -> list[Extension]:
        """Per planned edge out of `tool` (in plan order), the values of `data` under the edge's
        key that the target parameter accepts; edges with none are left out."""
        hit = self._extensions.get((id(data), tool))
        if hit is None or hit[0] is not data:
            by_key = self.values(data)
            fitting: dict[tuple[Any, ...], list[Any]] = {}
            out: list[Extension] = []
            for planned in plan:
                key = planned.edge.key
                vals = fitting.get((key, planned.kind))
                if vals is None:
                    domain = planned.domain
                    vals = [v for v in by_key.get(key, ()) if accepts(domain, v)]
                    fitting[(key, planned.kind)] = vals
                if vals:
                    e = planned.edge
                    single = None
                    if len(vals) == 1:
                        single = value_key(e.target, not planned.writes, e.param, vals[0])
                    out.append((planned, vals, single))
            hit = self._extensions.put((id(data), tool), (data, out))
        return hit[1]

    def allowed_extensions(
        self,
        tool: str,
        data: Any,
        plan: list[PlannedEdge],
        who: Hashable,
        allows: Callable[[str, str, Any], bool],
    ) -> list[Extension]:
        """`extensions` with each edge's values narrowed to those `allows(target, param, value)`
        keeps (edges left with none are left out; an edge that lost values has no single value
        key). `who` names what `allows` depends on (a principal on an initial state): the answer
        is kept per result object and `who`, since every walk of a principal that reads the same
        memoised result (its start call, most often) would filter the same values again."""
        hit = self._allowed.get((id(data), tool, who))
        if hit is None or hit[0] is not data:
            out: list[Extension] = []
            for planned, vals, single in self.extensions(tool, data, plan):
                e = planned.edge
                kept = [v for v in vals if allows(e.target, e.param, v)]
                if not kept:
                    continue
                if len(kept) < len(vals):
                    vals, single = kept, None
                out.append((planned, vals, single))
            hit = self._allowed.put((id(data), tool, who), (data, out))
        return hit[1]
