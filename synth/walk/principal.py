"""Whose task it is: the env's owner entity, and which rows each of its rows owns.

A task is one person's story: a customer with their orders, a member with their loans. The owner
entity is inferred from the schema and the tool graph, never listed per env: the table whose rows
have a name and that the most other tables reference by a foreign key (ties go to the table fewer
write tools change: a product's stock or a class's seat count moves with everyone's actions, a
person's own row seldom). A row of another table is owned through the first of its foreign-key
columns, in schema order, that leads to the owner table (an order item through its order, a
ticket through its requester, not its assignee); a row whose chain ends in NULL or never reaches
the owner table is public (products, flights, an unassigned ticket).

Walks draw their user-given values from `Ownership.view`, the initial state as the principal
sees it (its own row, the rows it owns, the public ones), and keep only calls that name no row of
another principal (`Ownership.allows`). A tool may still resolve an argument that names no row
(a message's timestamp) to a stranger's row, so a write is judged by what it changed too
(`Ownership.strangers_written`), and a walk whose write left its story is discarded.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from envforge.server import Environment, State

from ..graph.domains import DomainValues, foreign_keys, weighted_choice
from ..task.models import ParamDomain, Principal, StateDiff, ToolGraph
from .memo import BoundedMemo

# Initial states whose owner maps and views are kept (the seed's, and a few setups').
STATES_KEPT = 8

_MISSING = object()


def name_column(columns: Iterable[str]) -> str | None:
    """The column that names a row: `name`, else the first `*_name` (None when there is none)."""
    cols = list(columns)
    if "name" in cols:
        return "name"
    return next((c for c in cols if c.endswith("_name")), None)


def owner_table(env: Environment, graph: ToolGraph) -> str | None:
    """The env's owner entity (see the module docstring), or None when no table qualifies."""
    fks = foreign_keys(env)
    referenced: dict[str, set[str]] = {}
    for child, parents in fks.items():
        for parent in parents:
            p_table, c_table = parent.split(".", 1)[0], child.split(".", 1)[0]
            if p_table != c_table:
                referenced.setdefault(p_table, set()).add(c_table)
    writers: dict[str, int] = {}
    for tool in graph.tools:
        if not tool.read_only:
            for table in tool.writes:
                writers[table] = writers.get(table, 0) + 1
    candidates = [
        (-len(referenced[t.name]), writers.get(t.name, 0), t.name)
        for t in env.tables
        if t.name in referenced and len(t.primary_key) == 1 and name_column(t.columns)
    ]
    return min(candidates)[2] if candidates else None


@dataclass(frozen=True)
class _Link:
    column: str  # the owning foreign-key column
    parent: str  # the table it references
    parent_column: str


class Ownership:
    """One env's owner entity and the ownership of every row, per initial state."""

    def __init__(self, env: Environment, graph: ToolGraph, pks: dict[str, tuple[str, ...]]) -> None:
        self.env = env
        self.pks = pks
        self.table = owner_table(env, graph)
        self.fks = foreign_keys(env)
        self.links: dict[str, _Link] = {}
        columns = {t.name: t.columns for t in env.tables}
        if self.table is not None:
            self.key = pks[self.table][0]
            self.name_col = name_column(columns[self.table])
            leads = {self.table}
            grew = True
            while grew:
                grew = False
                for t in env.tables:
                    if t.name not in leads and any(
                        p.split(".", 1)[0] in leads
                        for c in t.columns
                        for p in self.fks.get(f"{t.name}.{c}", [])
                    ):
                        leads.add(t.name)
                        grew = True
            for t in env.tables:
                if t.name == self.table or t.name not in leads:
                    continue
                for c in t.columns:
                    parent = next(
                        (p for p in self.fks.get(f"{t.name}.{c}", []) if p.split(".", 1)[0] in leads), None
                    )
                    if parent is not None:
                        p_table, p_col = parent.split(".", 1)
                        self.links[t.name] = _Link(c, p_table, p_col)
                        break
        self._owners: BoundedMemo[str, tuple[State, dict[str, dict[Any, Any]]]] = BoundedMemo(STATES_KEPT)
        self._views: BoundedMemo[tuple[str, Any], tuple[State, State]] = BoundedMemo(STATES_KEPT * 8)
        self._values: BoundedMemo[tuple[str, Any], tuple[State, DomainValues]] = BoundedMemo(STATES_KEPT * 8)
        # Per principal key, (walks, walks that wrote): a principal whose every reservation is
        # flown, or who is suspended, seldom gives a task, and later picks learn it.
        self.tally: dict[Any, list[int]] = {}
        self._refs: dict[int, tuple[ParamDomain, list[tuple[str, str]]]] = {}

    # ------------------------------------------------------------------ owners
    def owners(self, state_key: str, state: State) -> dict[str, dict[Any, Any]]:
        """Per owned table (and the owner table itself), its rows' owner keys by their one-column
        primary key (None: public)."""
        hit = self._owners.get(state_key)
        if hit is not None and hit[0] is state:
            return hit[1]
        out: dict[str, dict[Any, Any]] = {}
        index: dict[tuple[str, str], dict[Any, dict[str, Any]]] = {}

        def rows_by(table: str, column: str) -> dict[Any, dict[str, Any]]:
            got = index.get((table, column))
            if got is None:
                got = index[(table, column)] = {}
                for r in state.get(table, []):
                    got.setdefault(r.get(column), r)
            return got

        def owner_of(table: str, row: dict[str, Any], depth: int = 0) -> Any:
            if table == self.table:
                return row.get(self.key)
            link = self.links.get(table)
            value = row.get(link.column) if link else None
            if link is None or value is None or depth > len(self.links):
                return None
            if link.parent == self.table and link.parent_column == self.key:
                return value
            parent = rows_by(link.parent, link.parent_column).get(value)
            return None if parent is None else owner_of(link.parent, parent, depth + 1)

        assert self.table is not None
        out[self.table] = {r.get(self.key): r.get(self.key) for r in state.get(self.table, [])}
        for table in self.links:
            pk = self.pks.get(table, ())
            if len(pk) == 1:
                out[table] = {r.get(pk[0]): owner_of(table, r) for r in state.get(table, [])}
        self._owners.put(state_key, (state, out))
        return out

    def owner_of_row(self, state_key: str, state: State, table: str, key: Any) -> Any:
        """The owner key of `table`'s row `key` (its own key for an owner-table row; None: public)."""
        return self.owners(state_key, state).get(table, {}).get(key)

    # ------------------------------------------------------------------ principals
    def record(self, principal: Principal | None, wrote: bool) -> None:
        """Count a walk of `principal` (whether it wrote), for later picks to weigh."""
        if principal is not None and self.table is not None:
            seen = self.tally.setdefault(principal.key[self.key], [0, 0])
            seen[0] += 1
            seen[1] += wrote

    def _weight(self, row: dict[str, Any]) -> float:
        seen = self.tally.get(row.get(self.key))
        return 1.0 if seen is None else (seen[1] + 1) / (seen[0] + 1)

    def pick(
        self, rng: random.Random, state_key: str, state: State, *, steer: bool = True
    ) -> Principal | None:
        """A principal that owns something to act on (any row of the owner table if none does);
        steered, those whose walks have written likelier."""
        if self.table is None:
            return None
        owners = self.owners(state_key, state)
        owned = {o for table, of in owners.items() if table != self.table for o in of.values()}
        rows = state.get(self.table, [])
        pool = [r for r in rows if r.get(self.key) in owned] or rows
        if not pool:
            return None
        return self.principal(weighted_choice(rng, pool, self._weight) if steer else rng.choice(pool))

    def principal_of(self, state_key: str, state: State, table: str, key: Any) -> Principal | None:
        """The principal owning `table`'s row `key` (a setup's fresh entity), if any."""
        if self.table is None:
            return None
        owner = self.owner_of_row(state_key, state, table, key)
        row = next((r for r in state.get(self.table, []) if r.get(self.key) == owner), None)
        return None if row is None else self.principal(row)

    def principal(self, row: dict[str, Any]) -> Principal:
        assert self.table is not None
        name = row.get(self.name_col) if self.name_col else None
        return Principal(
            table=self.table, key={self.key: row.get(self.key)}, name=None if name is None else str(name)
        )

    # ------------------------------------------------------------------ the principal's view
    def view(self, state_key: str, state: State, principal: Principal) -> State:
        """`state` as `principal` sees it: its own row, the rows it owns, and the public rows."""
        me = principal.key[self.key]
        cache_key = (state_key, me)
        hit = self._views.get(cache_key)
        if hit is not None and hit[0] is state:
            return hit[1]
        owners = self.owners(state_key, state)
        view: State = {}
        for table, rows in state.items():
            if table == self.table:
                view[table] = [r for r in rows if r.get(self.key) == me]
            elif table in self.links and table in owners:
                pk = self.pks[table][0]
                of = owners[table]
                view[table] = [r for r in rows if of.get(r.get(pk)) in (None, me)]
            else:
                view[table] = rows
        self._views.put(cache_key, (state, view))
        return view

    def strangers_written(
        self, state_key: str, state: State, principal: Principal | None, diff: StateDiff
    ) -> list[str]:
        """The rows of another principal that a write's `diff` inserted, changed or deleted, as
        "table key" (empty when it kept to `principal`'s rows and public ones).

        `allows` sees only a call's arguments, and a tool may resolve one that names no row (a
        message's timestamp) to a row of someone else: Qwen2.5-Coder-1.5B's Slack reply looked the
        thread up by its timestamp in every channel, and 35 of 60 tasks of one channel wrote a
        reply under another's message. A row is judged by what it belongs to before the write
        (changed or deleted rows) or by the row its owning column points to (inserted rows, and a
        change to that column); rows the walk inserted itself are its principal's."""
        if principal is None or self.table is None:
            return []
        me = principal.key[self.key]
        owners = self.owners(state_key, state)

        def owner_by_link(table: str, row: dict[str, Any]) -> Any:
            link = self.links.get(table)
            value = row.get(link.column) if link else None
            if link is None or value is None:
                return None
            if link.parent == self.table and link.parent_column == self.key:
                return value
            if self.pks.get(link.parent) != (link.parent_column,):
                return None
            return owners.get(link.parent, {}).get(value)

        found = []
        for table, change in diff.items():
            if table != self.table and table not in self.links:
                continue
            pk = self.pks.get(table, ())
            judged: list[tuple[Any, Any]] = []
            for row in change.inserted:
                judged.append((row.get(pk[0]) if len(pk) == 1 else None, owner_by_link(table, row)))
            for row in change.deleted:
                key = row.get(pk[0]) if len(pk) == 1 else None
                judged.append((key, owners.get(table, {}).get(key)))
            for update in change.updated:
                key = update.key.get(pk[0]) if len(pk) == 1 else None
                judged.append((key, owners.get(table, {}).get(key)))
                link = self.links.get(table)
                if link is not None and link.column in update.after:
                    judged.append((key, owner_by_link(table, update.after)))
            found += [f"{table} {key}" for key, owner in judged if owner is not None and owner != me]
        return found

    def values(self, state_key: str, state: State, principal: Principal | None) -> DomainValues:
        """Candidate parameter values from `principal`'s view of `state`, shared by its tasks."""
        if principal is None or self.table is None:
            return DomainValues(state)
        cache_key = (state_key, principal.key[self.key])
        hit = self._values.get(cache_key)
        if hit is not None and hit[0] is state:
            return hit[1]
        return self._values.put(cache_key, (state, DomainValues(self.view(state_key, state, principal))))[1]

    def _entity_refs(self, domain: ParamDomain) -> list[tuple[str, str]]:
        """(table, key column) of the owner or owned tables whose rows the parameter names."""
        hit = self._refs.get(id(domain))
        if hit is not None and hit[0] is domain:
            return hit[1]
        refs: list[tuple[str, str]] = []
        for ref in domain.columns:
            for target in self.fks.get(ref, [ref]):
                table, col = target.split(".", 1)
                if (table == self.table or table in self.links) and self.pks.get(table) == (col,):
                    if (table, col) not in refs:
                        refs.append((table, col))
        self._refs[id(domain)] = (domain, refs)
        return refs

    def names_owned(self, domain: ParamDomain) -> bool:
        """Whether a parameter of `domain` can name the owner entity's row or a row it owns."""
        return bool(self._entity_refs(domain))

    def allows(
        self, state_key: str, state: State, principal: Principal | None, domain: ParamDomain, value: Any
    ) -> bool:
        """Whether `value` for a parameter of `domain` names no row of another principal (a row
        the initial state lacks was made by the walk itself, for its principal)."""
        return self.checker(state_key, state, principal)(domain, value)

    def checker(
        self, state_key: str, state: State, principal: Principal | None
    ) -> Callable[[ParamDomain, Any], bool]:
        """`allows` for one principal on one initial state, as a function of (domain, value).

        A walk asks tens of thousands of times in a run, always about its own principal and
        initial state: the owner map and the principal's key are looked up once here, not on
        every question."""
        if principal is None or self.table is None:
            return _always
        me = principal.key[self.key]
        owners = self.owners(state_key, state)
        refs_of = self._entity_refs
        no_owners: dict[Any, Any] = {}

        def allows(domain: ParamDomain, value: Any) -> bool:
            refs = refs_of(domain)
            if not refs:
                return True
            for item in value if isinstance(value, list) else [value]:
                for table, _ in refs:
                    try:
                        owner = owners.get(table, no_owners).get(item, _MISSING)
                    except TypeError:  # an unhashable value names no row
                        owner = _MISSING
                    if owner is not _MISSING and owner is not None and owner != me:
                        return False
            return True

        return allows


def _always(domain: ParamDomain, value: Any) -> bool:
    """`Ownership.checker` where there is no principal to keep to: every value is allowed."""
    return True
