"""Parameter domains: which schema columns a tool parameter's values come from.

A parameter named like a column takes that column's values, and a foreign key extends the domain
to the referenced column (so `customer_id` also accepts `customers.id`). List parameters named
in the plural (`account_ids`) take lists of the singular's values. Enums come from the JSON
schema. Everything here is read off the schema and the tool signatures; nothing is guessed from
descriptions.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from envforge.server import Environment, State, open_database, quote_ident

from ..task.models import ParamDomain

T = TypeVar("T")

FREE_TEXT = (
    "customer request",
    "no longer needed",
    "ordered by mistake",
    "found a better option",
    "duplicate",
)
FREE_NUMBERS = (5.0, 10.0, 20.0, 25.5)


def foreign_keys(env: Environment) -> dict[str, list[str]]:
    """'table.column' -> referenced 'table.column' list, read from the seed database's schema."""
    conn = open_database(env.seed_db)
    try:
        out: dict[str, list[str]] = {}
        pks = {t.name: t.primary_key for t in env.tables}
        for t in env.tables:
            for row in conn.execute(f"PRAGMA foreign_key_list({quote_ident(t.name)})"):
                parent, frm, to = row[2], row[3], row[4]
                to = to or (pks.get(parent) or ("rowid",))[0]
                out.setdefault(f"{t.name}.{frm}", []).append(f"{parent}.{to}")
        return out
    finally:
        conn.close()


def key_columns(env: Environment) -> set[str]:
    """Column names that identify entities: primary keys and foreign-key columns."""
    names = {c for t in env.tables for c in t.primary_key}
    names |= {k.split(".", 1)[1] for k in foreign_keys(env)}
    return names


def _schema_type(prop: dict[str, Any]) -> tuple[str, bool, list[Any]]:
    """(json type, is_list, enum values) of one JSON-schema property, looking through Optional."""
    options = prop.get("anyOf") or [prop]
    enum: list[Any] = []
    kind = "string"
    is_list = False
    for opt in options:
        if opt.get("type") == "null":
            continue
        if "enum" in opt:
            enum.extend(opt["enum"])
        if "const" in opt:
            enum.append(opt["const"])
        if opt.get("type") == "array":
            is_list = True
            items = opt.get("items", {})
            kind = "object" if "$ref" in items or "anyOf" in items else items.get("type", "string")
            enum.extend(items.get("enum", []))
        elif "$ref" in opt:
            kind = "object"
        elif "type" in opt:
            kind = opt["type"]
    return kind, is_list, enum


def derive_domains(env: Environment) -> dict[str, dict[str, ParamDomain]]:
    """tool -> parameter -> domain, for every tool parameter."""
    fks = foreign_keys(env)
    by_name: dict[str, list[str]] = {}
    for t in env.tables:
        for c in t.columns:
            by_name.setdefault(c, []).append(f"{t.name}.{c}")
    out: dict[str, dict[str, ParamDomain]] = {}
    for name in sorted(env.tools):
        spec = env.tools[name]
        props = spec.input_schema.get("properties", {})
        params: dict[str, ParamDomain] = {}
        for p in spec.parameters:
            kind, is_list, enum = _schema_type(props.get(p, {}))
            base = p[:-1] if is_list and p.endswith("s") else p
            cols = list(by_name.get(base, []))
            for c in list(cols):
                cols.extend(fks.get(c, []))
            params[p] = ParamDomain(param=p, columns=sorted(set(cols)), enum=enum, type=kind, is_list=is_list)
        out[name] = params
    return out


def _sortable(v: Any) -> tuple[str, str]:
    return (type(v).__name__, json.dumps(v, sort_keys=True))


def type_fits(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    return True


def accepts(domain: ParamDomain, value: Any) -> bool:
    """Whether `value` (one item, for a list parameter) passes the tool's argument validation as far
    as the schema tells: a listed value where the schema lists them, else the right JSON type.

    A value carried over from an earlier result (a reservation's `status`, an item's id for a list
    of ids) must be checked: the runtime would refuse it before the tool even ran.
    """
    if domain.enum:
        return any(value == e and type(value) is type(e) for e in domain.enum)
    return type_fits(domain.type, value)


class DomainValues:
    """Concrete candidate values for parameters, drawn from one state (seed or task initial)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._cache: dict[str, list[Any]] = {}
        self._values: dict[tuple[Any, ...], list[Any]] = {}
        self._hits: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        self._fitting: dict[tuple[int, str], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self._key_items: dict[int, tuple[dict[str, Any], list[tuple[str, Any]]]] = {}
        self._found: dict[tuple[Any, ...], tuple[ParamDomain, list[tuple[str, list[dict[str, Any]]]]]] = {}
        # (table, column) -> value -> the rows holding it, in table order
        self._by_value: dict[tuple[str, str], dict[Any, list[dict[str, Any]]]] = {}

    def key_items(self, row: dict[str, Any], key_names: set[str]) -> list[tuple[str, Any]]:
        """The (column, value) pairs of `row` whose column is an entity key, in column order."""
        hit = self._key_items.get(id(row))
        if hit is None or hit[0] is not row:
            hit = self._key_items[id(row)] = (row, [(k, v) for k, v in row.items() if k in key_names])
        return hit[1]

    def rows_with(self, table: str, column: str, value: Any) -> list[dict[str, Any]]:
        """The rows of `table` whose `column` equals `value` (`==`), in table order (indexed once)."""
        index = self._by_value.get((table, column))
        if index is None:
            index = self._by_value[(table, column)] = {}
            try:
                for r in self.state.get(table, []):
                    index.setdefault(r.get(column), []).append(r)
            except TypeError:  # an unhashable value in the column: no index
                index = self._by_value[(table, column)] = {_UNINDEXED: []}
        if _UNINDEXED in index:
            return [r for r in self.state.get(table, []) if r.get(column) == value]
        try:
            return index.get(value, [])
        except TypeError:  # an unhashable value equals no hashable one
            return [r for r in self.state.get(table, []) if r.get(column) == value]

    def column(self, ref: str) -> list[Any]:
        if ref not in self._cache:
            table, col = ref.split(".", 1)
            vals = {
                json.dumps(r[col], sort_keys=True)
                for r in self.state.get(table, [])
                if r.get(col) is not None
            }
            self._cache[ref] = sorted((json.loads(v) for v in vals), key=_sortable)
        return self._cache[ref]

    def values(self, domain: ParamDomain) -> list[Any]:
        if domain.enum:
            return list(domain.enum)
        key = (tuple(domain.columns), domain.type)
        if key not in self._values:
            self._values[key] = self._compute(domain)
        return self._values[key]

    def _compute(self, domain: ParamDomain) -> list[Any]:
        seen: dict[str, Any] = {}
        for ref in domain.columns:
            for v in self.column(ref):
                if type_fits(domain.type, v):
                    seen.setdefault(json.dumps(v, sort_keys=True), v)
        return sorted(seen.values(), key=_sortable)

    def rows_for(
        self, domain: ParamDomain, bindings: dict[str, Any]
    ) -> list[tuple[str, list[dict[str, Any]]]]:
        """Per domain column, the rows agreeing with every already-bound key column in that table.

        Walks ask again with the same bindings many times: answers are kept per domain and
        bindings (when the bound values are hashable).
        """
        try:
            key: tuple[Any, ...] | None = (id(domain), *bindings.items())
            hit = self._found.get(key)  # type: ignore[arg-type]
        except TypeError:
            key, hit = None, None
        if hit is not None and hit[0] is domain:
            return hit[1]
        found = self._rows_for(domain, bindings)
        if key is not None:
            if len(self._found) >= 50_000:
                self._found.clear()
            self._found[key] = (domain, found)
        return found

    def _rows_for(
        self, domain: ParamDomain, bindings: dict[str, Any]
    ) -> list[tuple[str, list[dict[str, Any]]]]:
        out: list[tuple[str, list[dict[str, Any]], int]] = []
        for ref in domain.columns:
            table, col = ref.split(".", 1)
            rows = self.state.get(table, [])
            if not rows:
                continue
            bound = [b for b in bindings if b != col and b in rows[0]]
            hits = self._matching(ref, col, rows, bound, bindings)
            if hits:
                out.append((ref, hits, len(bound)))
        best = max((n for _, _, n in out), default=0)
        return [(ref, hits) for ref, hits, n in out if n == best]

    def _matching(
        self, ref: str, col: str, rows: list[dict[str, Any]], bound: list[str], bindings: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Rows with `col` set that agree with the bound columns; cached, as walks ask the same again."""
        try:
            key: tuple[Any, ...] | None = (ref, *((b, bindings[b]) for b in bound))
            hash(key)
        except TypeError:
            key = None
        if key is not None and (hits := self._hits.get(key)) is not None:
            return hits
        candidates = self.rows_with(ref.split(".", 1)[0], bound[0], bindings[bound[0]]) if bound else rows
        hits = [
            r for r in candidates if r.get(col) is not None and all(r.get(b) == bindings[b] for b in bound)
        ]
        if key is not None:
            self._hits[key] = hits
        return hits

    def pick_bound(
        self,
        rng: random.Random,
        domain: ParamDomain,
        bindings: dict[str, Any],
        key_names: set[str],
        weigh: Weigh | None = None,
    ) -> Any:
        """A value consistent with `bindings` (entity keys chosen so far); binds the chosen row's keys.

        Choosing `order_id` binds that order's `customer_id`, so a later `customer_id` (or a
        `payment_method_id` owned by that customer) is drawn from the same entity: tools that check
        ownership then succeed instead of refusing random combinations. `weigh(param, value)`, when
        given, makes values likelier in proportion to it (see `weighted_choice`).
        """
        if domain.enum or domain.type not in ("string", "integer", "number"):
            return self.pick(rng, domain, weigh)
        found = self.rows_for(domain, bindings)
        if not found:
            return self.pick(rng, domain)
        ref, rows = found[rng.randrange(len(found))]
        col = ref.split(".", 1)[1]
        fkey = (id(rows), domain.type)
        hit = self._fitting.get(fkey)
        if hit is not None and hit[0] is rows:
            fitting = hit[1]
        else:
            fitting = [r for r in rows if type_fits(domain.type, r[col])]
            if len(self._fitting) >= 10_000:
                self._fitting.clear()
            self._fitting[fkey] = (rows, fitting)
        if not fitting:
            return self.pick(rng, domain)
        if domain.is_list:
            chosen = rng.sample(fitting, k=min(len(fitting), rng.randint(1, 2)))
        elif weigh is not None:
            param = domain.param
            chosen = [weighted_choice(rng, fitting, lambda r: weigh(param, r[col]))]
        else:
            chosen = [rng.choice(fitting)]
        base = domain.param[:-1] if domain.is_list and domain.param.endswith("s") else domain.param
        bindings[base] = chosen[0][col]
        for k, v in self.key_items(chosen[0], key_names):
            if k not in bindings:
                bindings[k] = v
        values = [r[col] for r in chosen]
        return values if domain.is_list else values[0]

    def pick(self, rng: random.Random, domain: ParamDomain, weigh: Weigh | None = None) -> Any:
        """A value for the parameter: from its domain where it has one, else a plain one of its type."""
        vals = self.values(domain)
        if vals:
            if domain.is_list:
                return rng.sample(vals, k=min(len(vals), rng.randint(1, 2)))
            if weigh is not None:
                param = domain.param
                return weighted_choice(rng, vals, lambda v: weigh(param, v))
            return rng.choice(vals)
        value = free_value(rng, domain.type)
        return [value] if domain.is_list else value


_UNINDEXED = object()

# How a walk rates a candidate value of a parameter, in (0, 1]: `outcomes.Outcomes` keeps the tally.
Weigh = Callable[[str, Any], float]

# Beyond this many items `weighted_choice` samples by rejection instead of weighing every item.
WEIGH_ALL_UP_TO = 32


def weighted_choice(rng: random.Random, items: Sequence[T], weight: Callable[[T], float]) -> T:
    """An item drawn with probability proportional to `weight(item)` (each in (0, 1]).

    Up to `WEIGH_ALL_UP_TO` items every item is weighed (a failed try costs far more than a
    weight). Among more, by rejection: draw uniformly and keep the item with probability
    `weight(item)`, for at most 64 draws, so that a pick among many rows weighs a few.
    """
    if len(items) <= WEIGH_ALL_UP_TO:
        return rng.choices(items, weights=[weight(item) for item in items])[0]
    item = rng.choice(items)
    for _ in range(63):
        if rng.random() < weight(item):
            return item
        item = rng.choice(items)
    return item


def fillable(domain: ParamDomain) -> bool:
    """Whether synthesis can produce a value (structured objects it cannot invent)."""
    return domain.type != "object" or bool(domain.enum)


def free_value(rng: random.Random, kind: str) -> Any:
    if kind == "integer":
        return rng.randint(1, 3)
    if kind == "number":
        return rng.choice(FREE_NUMBERS)
    if kind == "boolean":
        return rng.random() < 0.5
    return rng.choice(FREE_TEXT)
