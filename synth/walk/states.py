"""The states synthesis starts walks and replays from, and what is derived from each, cached.

Every task starts from an initial state: the seed, or the seed plus a task's setup rows
(`setup.py`). Walks and checks need each such state in several forms (serialised bytes, the
canonical export, its cents hash, its rows as tuples for `Mirror`, candidate parameter values,
every entity id), and many tasks share one (the seed's above all): each form is made once per
state. The seed's are kept for the run; setup states, used by one task each, only while recent.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from envforge.server import Environment, State, freeze

from ..graph.domains import DomainValues
from ..task.hashing import StateHasher, loose_columns, same_row
from ..task.models import Row, StateDiff, Task
from ..task.statediff import apply_diff, cents_hash, entity_ids
from .memo import BoundedMemo
from .mirror import Mirror, TableReader, table_readers

# Task-specific initial states (seed plus setup rows) kept besides the seed's.
SETUP_STATES_KEPT = 8


def setup_key(setup: StateDiff) -> str:
    """The name of the initial state `setup` makes of the seed ("" for the seed itself)."""
    if not setup:
        return ""
    return json.dumps({t: d.model_dump(mode="json") for t, d in setup.items()}, sort_keys=True)


class InitialState(NamedTuple):
    """A state tasks start from, in the three forms walks and checks use."""

    database: bytes
    """The serialised SQLite database holding it (what episodes are opened on)."""
    state: State
    """Its canonical export."""
    cents: str
    """Its cents hash (`statediff.cents_hash`)."""


class StateCache:
    """Initial states and their derived forms, per setup key (see the module docstring)."""

    def __init__(self, env: Environment, pks: dict[str, tuple[str, ...]]) -> None:
        self.env = env
        self.pks = pks
        self._seed: InitialState | None = None
        self._setup_states: BoundedMemo[str, InitialState] = BoundedMemo(SETUP_STATES_KEPT)
        self._values: dict[str, DomainValues] = {}
        self._loose: dict[str, tuple[str, ...]] | None = None
        self._hasher: StateHasher | None = None
        self._readers: dict[str, TableReader] | None = None
        self._tuples: dict[str, tuple[State, dict[str, Any]]] = {}
        self._entity_ids: dict[str, tuple[State, tuple[str, ...]]] = {}

    def initial(self, setup_key: str, setup: StateDiff, *, database: bytes | None = None) -> InitialState:
        """The seed with `setup` applied, as an `InitialState` (cached). `database`, when the caller
        has one, holds that state (else it is built from the state).

        The seed state is frozen (nothing mutates it), and a setup state shares the seed's lists
        for the tables its setup leaves alone, so states derived from either hash those tables
        from cached JSON. Setup states are many and used briefly (one per task that has one):
        only the latest few are kept.
        """
        if not setup_key:
            if self._seed is None:
                seed = freeze(self.env.seed_state())
                self._seed = InitialState(self.env.seed_db, seed, cents_hash(seed))
            return self._seed
        hit = self._setup_states.get(setup_key)
        if hit is not None:
            return hit
        seed = freeze(self.env.seed_state())
        state = apply_diff(self.pks, seed, setup)
        for t, rows in state.items():  # the seed's lists and rows wherever they are unchanged
            state[t] = seed[t] if t not in setup else self._seed_rows(t, rows)
        database = database if database is not None else self.env.database_from_state(state)
        return self._setup_states.put(setup_key, InitialState(database, state, self.hasher.hashes(state)[1]))

    def _seed_rows(self, table: str, rows: list[Row]) -> list[Row]:
        """`rows` with each row that is the same as the seed's row with its key replaced by that row."""
        pk = self.pks[table]
        if not pk:
            return rows
        loose = self.loose.get(table, ())
        try:
            seed = {tuple(r[c] for c in pk): r for r in self.env.seed_state()[table]}
            found = [seed.get(tuple(r[c] for c in pk)) for r in rows]
        except (KeyError, TypeError):
            return rows
        return [s if s is not None and same_row(s, r, loose) else r for s, r in zip(found, rows, strict=True)]

    @property
    def loose(self) -> dict[str, tuple[str, ...]]:
        """Per table, the columns whose equal values may still serialise differently (`hashing.py`)."""
        if self._loose is None:
            self._loose = loose_columns(self.env)
        return self._loose

    @property
    def readers(self) -> dict[str, TableReader]:
        if self._readers is None:
            self._readers = table_readers(self.env, self.loose)
        return self._readers

    def mirror(self, setup_key: str, initial: State) -> Mirror:
        """A fresh `Mirror` of `initial` (the state named `setup_key`), for one walk."""
        readers = self.readers
        cache = self._tuples.get(setup_key)
        if cache is None or cache[0] is not initial:
            self._tuples = {k: v for k, v in self._tuples.items() if not k}  # the seed's, and this one's
            cache = self._tuples[setup_key] = (initial, {})
        tables = cache[1]

        def initial_rows(table: str) -> tuple[list[tuple[Any, ...]], dict[tuple[Any, ...], Row]]:
            hit = tables.get(table)
            if hit is None:
                rows = initial[table]
                seed = self.env.seed_state()
                if setup_key and rows is seed[table]:
                    hit = self._seed_tuples(table)
                else:
                    # A setup state holds the seed's own row objects where rows are unchanged.
                    by_id = self._seed_tuples(table)[2] if setup_key else {}
                    tuples = [by_id.get(id(r)) or readers[table].tuples([r])[0] for r in rows]
                    hit = (tuples, dict(zip(tuples, rows, strict=True)), {})
                tables[table] = hit
            return hit[0], hit[1]

        return Mirror(readers, initial, initial_rows)

    def _seed_tuples(
        self, table: str
    ) -> tuple[list[tuple[Any, ...]], dict[tuple[Any, ...], Row], dict[int, tuple[Any, ...]]]:
        """The seed's rows of `table` as tuples, by tuple, and each row's tuple by the row's id."""
        seed = self._tuples.setdefault("", (self.env.seed_state(), {}))[1]
        hit = seed.get(table)
        if hit is None or not hit[2]:
            rows = self.env.seed_state()[table]
            tuples = hit[0] if hit is not None else self.readers[table].tuples(rows)
            by_id = {id(r): t for r, t in zip(rows, tuples, strict=True)}
            hit = seed[table] = (tuples, dict(zip(tuples, rows, strict=True)), by_id)
        return hit

    @property
    def hasher(self) -> StateHasher:
        """State hashes that reuse the seed's row texts for unchanged rows (`hashing.py`)."""
        if self._hasher is None:
            self._hasher = StateHasher(freeze(self.env.seed_state()), self.pks, self.loose)
        return self._hasher

    def entity_ids(self, setup_key: str, state: State) -> tuple[str, ...]:
        """Every primary-key value of the initial state `state` (named `setup_key`): what a spraying
        adversary names besides numbers. Kept for the seed and the latest setup state."""
        hit = self._entity_ids.get(setup_key)
        if hit is None or hit[0] is not state:
            if setup_key:
                self._entity_ids = {k: v for k, v in self._entity_ids.items() if not k}
            hit = self._entity_ids[setup_key] = (state, tuple(entity_ids(state, self.pks)))
        return hit[1]

    def task_initial(self, task: Task) -> InitialState:
        """The initial state `task` starts from."""
        return self.initial(setup_key(task.setup), task.setup)

    def domain_values(self, setup_key: str, state: State) -> DomainValues:
        """Candidate parameter values drawn from an initial state, shared by every task built on it
        (the seed's for good, a setup state's while it is the latest)."""
        dv = self._values.get(setup_key)
        if dv is None or dv.state is not state:
            if setup_key:
                self._values = {k: v for k, v in self._values.items() if not k}
            dv = self._values[setup_key] = DomainValues(state)
        return dv
