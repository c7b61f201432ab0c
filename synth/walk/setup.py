"""Task-specific setup rows: a fresh entity added to the seed state for a task to act on.

A task's initial state is the seed state plus optional setup rows (`Task.setup`). Without them
every task is about seed rows, which an agent trained on many tasks could come to know by
heart. A setup adds one new entity, an order, a ticket, a reservation, as a copy of a seed row
with a new key (numbered after the table's highest), together with the rows that hang off it
through the foreign key that makes them its own (an order's items and payments: see `_owners`),
their references to copied rows pointing at the copies. Copying a real row keeps every column
consistent with the schema's CHECK and foreign-key constraints, and the rows are inserted into a
copy of the seed database with foreign keys enforced, so the schema itself vouches for them; a
copy that breaks a constraint (a UNIQUE column, say) is dropped and another row copied.

Which tables qualify is read off the schema and the tools: a one-column primary key with values
that can be numbered, that a read tool and a write tool take as a parameter (to look the entity
up and act on it), in a table that belongs to another (has a foreign key). Everything is drawn
from the `random.Random` passed in, so a task's seed decides its setup.
"""

from __future__ import annotations

import random
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

from envforge.server import Environment, ScratchPool, quote_ident, table_query

from ..graph.domains import foreign_keys
from ..task.models import ParamDomain, StateDiff
from ..task.statediff import index_diff, index_rows, primary_keys

Row = dict[str, Any]

# Recent rows a template is drawn from, copies tried per table, rows copied at most (an entity
# with its dependants), link depth.
RECENT = 6
TEMPLATES_PER_TABLE = 3
MAX_ROWS = 40
MAX_DEPTH = 3

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


@dataclass(frozen=True)
class Fresh:
    """The entity a setup added: its table, key column and new key value."""

    table: str
    column: str
    value: Any


@dataclass(frozen=True)
class Setup:
    diff: StateDiff
    database: bytes  # the seed database with the rows inserted
    fresh: Fresh


def next_key(values: list[Any], taken: set[Any]) -> Any:
    """A key after every existing one: the highest number plus one, in the values' own format
    ('O-5064' -> 'O-5065', zero-padding kept); None when the values are not numbered alike."""
    if values and all(type(v) is int for v in values):
        n = max(values) + 1
        while n in taken:
            n += 1
        return n
    matches = [_NUMBERED.match(v) if isinstance(v, str) else None for v in values]
    if not values or any(m is None for m in matches):
        return None
    prefixes = {m.group(1) for m in matches if m}
    if len(prefixes) != 1:
        return None
    (prefix,) = prefixes
    widths = {len(m.group(2)) for m in matches if m}
    width = widths.pop() if len(widths) == 1 else 0
    n = max(int(m.group(2)) for m in matches if m) + 1
    while (key := f"{prefix}{n:0{width}d}") in taken:
        n += 1
    return key


class SetupPlanner:
    """What setups of one env need from its schema and seed, worked out once."""

    def __init__(
        self, env: Environment, domains: dict[str, dict[str, ParamDomain]], pool: ScratchPool
    ) -> None:
        self.env = env
        self.pool = pool
        self.seed = env.seed_state()
        self.pks = primary_keys(env.tables)
        fks = foreign_keys(env)
        # 'table.column' of a one-column primary key -> the (table, column) pairs referencing it
        self.children: dict[str, list[tuple[str, str]]] = {}
        for child, parents in sorted(fks.items()):
            table, column = child.split(".", 1)
            for parent in parents:
                p_table, p_column = parent.split(".", 1)
                if self.pks.get(p_table) == (p_column,):
                    self.children.setdefault(parent, []).append((table, column))
        # A table's owner reference is the first of its columns (in schema order) that is a
        # foreign key: an order item belongs to its order, a payment to the order it pays (not
        # to the card it is paid with).
        owners = {}
        for t in env.tables:
            first = next((c for c in t.columns if f"{t.name}.{c}" in fks), None)
            if first is not None:
                owners[t.name] = first
        self.owned = {
            ref: [(t, c) for t, c in refs if owners.get(t) == c] for ref, refs in self.children.items()
        }
        self.taken = {t: frozenset(self._key(t, r) for r in rows) for t, rows in self.seed.items()}
        # the first new key per one-column-key table (None: its keys are not numbered alike)
        self.first_new = {
            t.name: next_key([r.get(t.primary_key[0]) for r in self.seed[t.name]], set())
            for t in env.tables
            if len(t.primary_key) == 1
        }
        self.tables = self._entity_tables(domains, set(owners))
        # (table, template's position in the seed) -> its setup, or None where it broke a
        # constraint: a run draws from a few recent rows per table, so most draws repeat one.
        self._made: dict[tuple[str, int], Setup | None] = {}

    def _key(self, table: str, row: Row) -> tuple[Any, ...]:
        return tuple(row.get(c) for c in self.pks[table])

    def _entity_tables(self, domains: dict[str, dict[str, ParamDomain]], owned: set[str]) -> list[str]:
        out = []
        for t in self.env.tables:
            if len(t.primary_key) != 1 or not self.seed.get(t.name) or t.name not in owned:
                continue
            (pk,) = t.primary_key
            ref = f"{t.name}.{pk}"
            takers = {
                self.env.tools[tool].read_only
                for tool in sorted(domains)
                for p in self.env.tools[tool].required
                if ref in domains[tool][p].columns
            }
            # A tool to look the entity up (a walk starts there) and one to act on it.
            if takers == {True, False} and self.first_new[t.name] is not None:
                out.append(t.name)
        return out

    def fresh_entity(self, rng: random.Random) -> Setup | None:
        """A setup adding a copy of a recent row of an entity table (None when none fits the schema).

        Templates are drawn from a table's last rows (by key): entities are numbered as they are
        created, and the newest are the likeliest to be in a state a task can still act on (a
        pending order, an open ticket, a confirmed reservation), as a fresh entity would be.
        """
        for table in rng.sample(self.tables, len(self.tables)):
            rows = self.seed[table]
            recent = range(max(0, len(rows) - RECENT), len(rows))
            for at in rng.sample(recent, min(TEMPLATES_PER_TABLE, len(recent))):
                key = (table, at)
                if key not in self._made:
                    self._made[key] = self._copy(table, rows[at])
                setup = self._made[key]
                if setup is not None:
                    return setup
        return None

    def _copy(self, table: str, template: Row) -> Setup | None:
        """The setup adding a copy of `template` (None when the copy breaks a constraint)."""
        clone = self._clone(table, template)
        if clone is None:
            return None
        done = _insert(self.env, self.pks, self.pool, clone[0])
        if done is None:
            return None
        diff, database = done
        return Setup(diff=diff, database=database, fresh=Fresh(table, self.pks[table][0], clone[1]))

    def _clone(self, table: str, template: Row) -> tuple[list[tuple[str, Row]], Any] | None:
        """The template row and the rows it owns (transitively), copied under new keys, every
        reference to a copied row pointing at its copy: ([(table, row)], the template's new key)."""
        seed, pks = self.seed, self.pks
        picked: list[tuple[str, Row]] = [(table, template)]
        frontier = [(table, template)]
        seen = {(table, id(template))}
        for _ in range(MAX_DEPTH):
            below = []
            for t, row in frontier:
                if len(pks[t]) != 1:
                    continue
                (pk,) = pks[t]
                for c_table, c_col in self.owned.get(f"{t}.{pk}", []):
                    for r in seed.get(c_table, []):
                        if r.get(c_col) == row[pk] and (c_table, id(r)) not in seen:
                            seen.add((c_table, id(r)))
                            below.append((c_table, r))
            picked.extend(below)
            frontier = below
            if len(picked) > MAX_ROWS:
                return None
        # New keys for copied rows with a one-column key; composite keys change through their
        # foreign-key columns below (and must then be new).
        renamed: dict[tuple[str, Any], Any] = {}  # ('table.column', old value) -> new value
        last: dict[str, Any] = {}
        for t, row in picked:
            if len(pks[t]) == 1:
                (pk,) = pks[t]
                new = self.first_new[t] if t not in last else next_key([last[t]], set())
                while new is not None and (new,) in self.taken[t]:
                    new = next_key([new], set())
                if new is None:
                    return None
                last[t] = renamed[(f"{t}.{pk}", row[pk])] = new
        out = []
        composite: dict[str, set[tuple[Any, ...]]] = {}
        for t, row in picked:
            copy = dict(row)
            for col, value in row.items():
                for (ref, old), new in renamed.items():
                    if old == value and (ref == f"{t}.{col}" or (t, col) in self.children.get(ref, [])):
                        copy[col] = new
            if len(pks[t]) != 1:
                key = self._key(t, copy)
                if key in self.taken[t] or key in composite.setdefault(t, set()):
                    return None
                composite[t].add(key)
            out.append((t, copy))
        (pk,) = pks[table]
        return out, renamed[(f"{table}.{pk}", template[pk])]


def _insert(
    env: Environment, pks: dict[str, tuple[str, ...]], pool: ScratchPool, rows: list[tuple[str, Row]]
) -> tuple[StateDiff, bytes] | None:
    """Insert `rows` (parents first) into a copy of the seed database, foreign keys enforced.

    The setup lists the rows as SQLite then holds them (read back, as an export reads them);
    None when a constraint rejects a row, or inserting changed anything besides (a trigger).
    """
    episode = pool.open(env.seed_db)
    conn = episode.conn.raw
    try:
        before = conn.total_changes
        with episode.guard.trusted():
            try:
                for table, row in rows:
                    names = ", ".join(quote_ident(c) for c in row)
                    marks = ", ".join("?" for _ in row)
                    conn.execute(
                        f"INSERT INTO {quote_ident(table)} ({names}) VALUES ({marks})", list(row.values())
                    )
                conn.commit()
            except sqlite3.Error:
                conn.rollback()
                return None
        if conn.total_changes - before != len(rows) or conn.execute("PRAGMA foreign_key_check").fetchall():
            return None  # a trigger changed more than the rows: not a plain insert
        infos = {t.name: t for t in env.tables}
        inserted: dict[str, list[Row]] = {}
        for table, row in rows:
            cols, _ = table_query(infos[table], env.manifest.volatile_columns)
            where = " AND ".join(f"{quote_ident(c)} = ?" for c in pks[table])
            sql = f"SELECT {', '.join(quote_ident(c) for c in cols)} FROM {quote_ident(table)} WHERE {where}"
            stored = conn.execute(sql, [row[c] for c in pks[table]]).fetchone()
            inserted.setdefault(table, []).append(dict(zip(cols, stored, strict=True)))
        diff = {t: index_diff(pks[t], {}, index_rows(r, pks[t])) for t, r in sorted(inserted.items())}
        return {t: d for t, d in diff.items() if d is not None}, conn.serialize()
    finally:
        pool.close(episode)
