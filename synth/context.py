"""What synthesis, verification and scoring share about one env: graph, domains, states, replay.

Episodes are always created from serialised bytes (the seed database, or a task's initial state
built once), on pooled connections outside the fleet's store (`inline.py`), and calls go
straight to `runtime.execute`, with no MCP framing: this is the hot path of synthesis and
self-verification.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envforge.server import (
    Environment,
    Episode,
    Fleet,
    ScratchPool,
    State,
    ToolResult,
    execute,
    export_state,
    freeze,
    on_db_thread,
    run_inline,
    state_hash,
)

from .adversaries import entity_ids
from .domains import DomainValues, derive_domains, fillable, key_columns
from .footprint import parse_result
from .hashing import StateHasher, loose_columns, same_row
from .memo import BoundedMemo
from .mirror import Mirror, TableReader, table_readers
from .models import Call, GraphEdge, ParamDomain, Row, RowCheck, StateDiff, Task, ToolGraph, ToolNode
from .outcomes import Outcomes
from .results import ResultReadings
from .setup import SetupPlanner
from .statediff import apply_diff, cents_hash, cents_row, json_key, primary_keys, states_match

__all__ = ["SynthContext", "call_key", "run_inline", "setup_key"]

# Memoised tool results (and parsed results, and `try_instead` verdicts) kept per context.
MEMO_LIMIT = 50_000
# Task-specific initial states (seed plus setup rows) kept besides the seed's.
SETUP_STATES_KEPT = 8


def setup_key(setup: StateDiff) -> str:
    """The name of the initial state `setup` makes of the seed ("" for the seed itself)."""
    if not setup:
        return ""
    return json.dumps({t: d.model_dump(mode="json") for t, d in setup.items()}, sort_keys=True)


def call_key(call: Call) -> str | None:
    """The identity of a call for memoisation (None when its arguments are not plain JSON)."""
    try:
        return call.name + "\0" + json_key(call.arguments)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class PlannedEdge:
    """A graph edge as walks use it: the target parameter's domain, `kind` (what decides which
    values the domain accepts), whether the target writes, and the edge as `Outcomes` tallies it."""

    edge: GraphEdge
    domain: ParamDomain
    kind: tuple[Any, ...]
    writes: bool
    feeds: tuple[str, str, str, str]


@dataclass
class SynthContext:
    env: Environment
    graph: ToolGraph
    fleet: Fleet
    domains: dict[str, dict[str, ParamDomain]] = field(default_factory=dict)
    pks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    key_names: set[str] = field(default_factory=set)
    _initial: dict[str, tuple[bytes, State, str]] = field(default_factory=dict)
    _tools: dict[str, ToolNode] = field(default_factory=dict)
    _out_edges: dict[str, list[GraphEdge]] = field(default_factory=dict)
    _values: dict[str, DomainValues] = field(default_factory=dict)
    _write_tables: dict[tuple[str, ...], list[str]] = field(default_factory=dict)
    _memo: BoundedMemo[tuple[Any, ...], ToolResult] = field(default_factory=lambda: BoundedMemo(MEMO_LIMIT))
    # `try_instead` verdicts
    _tried: BoundedMemo[tuple[Any, ...], bool] = field(default_factory=lambda: BoundedMemo(MEMO_LIMIT))
    _parsed: BoundedMemo[int, tuple[ToolResult, Any]] = field(default_factory=lambda: BoundedMemo(MEMO_LIMIT))
    _usable: dict[str, bool] = field(default_factory=dict)
    _edge_plans: dict[str, list[PlannedEdge]] = field(default_factory=dict)
    _keyed_by: dict[str, list[str]] = field(default_factory=dict)
    _names_entity: dict[int, tuple[ParamDomain, bool]] = field(default_factory=dict)
    _parameters: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    _name_keys: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    _golden_db: tuple[State, bytes] | None = None
    _scratch: ScratchPool | None = None
    _loose: dict[str, tuple[str, ...]] | None = None
    _hasher: StateHasher | None = None
    _readers: dict[str, TableReader] | None = None
    _golden_mirror: Mirror | None = None
    _setups: SetupPlanner | None = None
    _tuples: dict[str, tuple[State, dict[str, Any]]] = field(default_factory=dict)
    _entity_ids: dict[str, tuple[State, list[str]]] = field(default_factory=dict)
    # What walks read off each parsed result (`results.py`): memoised reads share their objects.
    readings: ResultReadings = field(default_factory=ResultReadings)
    # Which calls have worked so far in this run, for walks to weigh their choices by.
    outcomes: Outcomes = field(default_factory=Outcomes)

    @classmethod
    def create(cls, env: Environment, graph: ToolGraph, fleet: Fleet) -> SynthContext:
        return cls(
            env=env,
            graph=graph,
            fleet=fleet,
            domains=derive_domains(env),
            pks=primary_keys(env.tables),
            key_names=key_columns(env),
        )

    # ------------------------------------------------------------------ graph lookups (cached)
    def tool(self, name: str) -> ToolNode:
        """`graph.tool(name)` without its linear scan: the builder asks thousands of times per task."""
        node = self._tools.get(name)
        if node is None:
            node = self._tools[name] = self.graph.tool(name)
        return node

    def out_edges(self, source: str) -> list[GraphEdge]:
        """`graph.out_edges(source)` (same edges, same order), computed once per tool."""
        edges = self._out_edges.get(source)
        if edges is None:
            edges = self._out_edges[source] = self.graph.out_edges(source)
        return edges

    def usable(self, tool: str) -> bool:
        """Whether synthesis can fill every required parameter of `tool` (`domains.fillable`)."""
        usable = self._usable.get(tool)
        if usable is None:
            spec = self.env.tools[tool]
            usable = self._usable[tool] = all(fillable(self.domains[tool][p]) for p in spec.required)
        return usable

    def edge_plan(self, source: str) -> list[PlannedEdge]:
        """`source`'s out-edges into usable tools, each with what walks need to know of it."""
        plan = self._edge_plans.get(source)
        if plan is None:
            plan = self._edge_plans[source] = []
            for e in self.out_edges(source):
                if self.usable(e.target):
                    domain = self.domains[e.target][e.param]
                    plan.append(
                        PlannedEdge(
                            edge=e,
                            domain=domain,
                            kind=(domain.type, tuple(domain.enum)),
                            writes=not self.tool(e.target).read_only,
                            feeds=(source, e.key, e.target, e.param),
                        )
                    )
        return plan

    def name_keys(self, source: str, target: str, param: str) -> list[str]:
        """Keys of `source`'s results that name `target`'s `param` (name-evidence edges, in order)."""
        keys = self._name_keys.get((source, target, param))
        if keys is None:
            keys = self._name_keys[(source, target, param)] = [
                e.key
                for e in self.out_edges(source)
                if e.target == target and e.param == param and e.evidence == "name"
            ]
        return keys

    def parameters(self, tool: str) -> tuple[list[str], list[str]]:
        """A tool's parameters, and its required ones, in signature order."""
        hit = self._parameters.get(tool)
        if hit is None:
            spec = self.env.tools[tool]
            hit = self._parameters[tool] = (
                list(spec.parameters),
                [p for p in spec.parameters if p in spec.required],
            )
        return hit

    def names_entity(self, domain: ParamDomain) -> bool:
        """Whether the parameter takes an entity's key (a primary- or foreign-key column's values)."""
        hit = self._names_entity.get(id(domain))
        if hit is None or hit[0] is not domain:
            keys = self.key_names
            hit = self._names_entity[id(domain)] = (
                domain,
                any(ref.split(".", 1)[1] in keys for ref in domain.columns),
            )
        return hit[1]

    def keyed_by(self, column: str) -> list[str]:
        """The tables whose primary key is `column` alone, in schema order."""
        tables = self._keyed_by.get(column)
        if tables is None:
            tables = self._keyed_by[column] = [t.name for t in self.env.tables if t.primary_key == (column,)]
        return tables

    def domain_values(self, setup_key: str, state: State) -> DomainValues:
        """Candidate parameter values drawn from an initial state, shared by every task built on it
        (the seed's for good, a setup state's while it is the latest)."""
        dv = self._values.get(setup_key)
        if dv is None or dv.state is not state:
            if setup_key:
                self._values = {k: v for k, v in self._values.items() if not k}
            dv = self._values[setup_key] = DomainValues(state)
        return dv

    # ------------------------------------------------------------------ states
    def initial(
        self, setup_key: str, setup: Any, *, database: bytes | None = None
    ) -> tuple[bytes, State, str]:
        """(database bytes, canonical state, cents hash) of the seed with `setup` applied (cached).
        `database`, when the caller has one, holds that state (else it is built from the state).

        The seed state is frozen (nothing mutates it), and a setup state shares the seed's lists
        for the tables its setup leaves alone, so states derived from either hash those tables
        from cached JSON. Setup states are many and used briefly (one per task that has one):
        only the latest few are kept.
        """
        hit = self._initial.get(setup_key)
        if hit is not None:
            return hit
        seed = freeze(self.env.seed_state())
        if not setup:
            hit = (self.env.seed_db, seed, cents_hash(seed))
        else:
            state = apply_diff(self.pks, seed, setup)
            for t, rows in state.items():  # the seed's lists and rows wherever they are unchanged
                state[t] = seed[t] if t not in setup else self._seed_rows(t, rows)
            database = database if database is not None else self.env.database_from_state(state)
            hit = (database, state, self.hasher.hashes(state)[1])
            setups = [k for k in self._initial if k]
            for k in setups[: max(0, len(setups) - SETUP_STATES_KEPT + 1)]:
                del self._initial[k]
        self._initial[setup_key] = hit
        return hit

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

    def entity_ids(self, setup_key: str, state: State) -> list[str]:
        """Every primary-key value of the initial state `state` (named `setup_key`): what a spraying
        adversary names besides numbers. Kept for the seed and the latest setup state."""
        hit = self._entity_ids.get(setup_key)
        if hit is None or hit[0] is not state:
            if setup_key:
                self._entity_ids = {k: v for k, v in self._entity_ids.items() if not k}
            hit = self._entity_ids[setup_key] = (state, entity_ids(state, self.pks))
        return hit[1]

    def task_initial(self, task: Task) -> tuple[bytes, State, str]:
        return self.initial(setup_key(task.setup), task.setup)

    @property
    def setups(self) -> SetupPlanner:
        """Fresh-entity setups for this env (`setup.py`), planned once."""
        if self._setups is None:
            if self._scratch is None:
                self._scratch = ScratchPool(self.env)
            self._setups = SetupPlanner(self.env, self.domains, self._scratch)
        return self._setups

    def write_tables(self, tools: list[str]) -> list[str]:
        """Tables any of `tools` may change: declared `writes` plus those measured by the authorizer."""
        key = tuple(tools)
        cached = self._write_tables.get(key)
        if cached is not None:
            return list(cached)
        out: set[str] = set()
        for name in tools:
            if name in self.env.tools:
                out |= set(self.env.tools[name].writes) | set(self.tool(name).writes)
        self._write_tables[key] = sorted(out)
        return sorted(out)

    async def export_tables(self, episode: str | Episode, tables: list[str] | None) -> State:
        """The canonical export of some tables only (all when None): cheap state for write diffs."""
        if isinstance(episode, str):
            episode = self.fleet.store.get(episode)
        if tables is None:
            return await episode.export()
        infos = [t for t in self.env.tables if t.name in tables]
        async with episode.lock:
            return await on_db_thread(
                episode.conn, export_state, episode.conn._conn, infos, self.env.manifest.volatile_columns
            )

    def note_golden_db(self, golden: State, database: bytes, mirror: Mirror | None = None) -> None:
        """Remember the serialised database whose export is `golden` (only the latest task's), and
        the `Mirror` that holds `golden` (its rows as tuples)."""
        self._golden_db = (golden, database)
        self._golden_mirror = mirror

    def golden_db(self, golden: State | None) -> bytes | None:
        """The database noted for exactly this `golden` object, if any."""
        if golden is None or self._golden_db is None or self._golden_db[0] is not golden:
            return None
        return self._golden_db[1]

    # ------------------------------------------------------------------ scratch episodes
    async def open_episode(self, database: bytes) -> Episode:
        """A private episode on `database` for a walk or a replay, on a reused connection (`inline.py`)."""
        if self._scratch is None:
            self._scratch = ScratchPool(self.env)
        return self._scratch.open(database)

    async def close_episode(self, episode: Episode) -> None:
        assert self._scratch is not None
        self._scratch.close(episode)

    def close(self) -> None:
        """Close the pooled connections (the fleet's episodes are the fleet's to close)."""
        if self._scratch is not None:
            self._scratch.close_all()

    # ------------------------------------------------------------------ calls
    async def call(
        self, episode: Episode, history: tuple[Any, ...], call: Call, key: str | None = None
    ) -> ToolResult:
        """`Fleet.call`, answered from memory when executing it could not change the episode.

        `history` names the episode's state: its initial state and the successful writes made
        since (tools are deterministic functions of state and arguments: the 'deterministic'
        self-check holds every shipped task to that). A read call, or a call that failed (the
        runtime rolls failed calls back), leaves the state as it was, so the same call on the same
        history gives the same result without running; walks retry the same refused writes and
        lookups many times. A call that changed state is always executed for real.
        """
        ck = key if key is not None else call_key(call)
        if ck is not None:
            hit = self._memo.get((history, ck))
            if hit is not None:
                return hit
        res = await execute(episode, call.name, call.arguments)
        if ck is not None and (res.is_error or self.env.tools[call.name].read_only):
            self._remember((history, ck), res)
        return res

    def _remember(self, key: tuple[Any, ...], res: ToolResult) -> None:
        self._memo.put(key, res)

    def parsed(self, res: ToolResult) -> Any:
        """`parse_result(res.text)`, parsed once per remembered result (walks only read the data)."""
        hit = self._parsed.get(id(res))
        if hit is not None and hit[0] is res:
            return hit[1]
        data = parse_result(res.text)
        self._parsed.put(id(res), (res, data))
        return data

    def reads_only(self, call: Call) -> bool:
        """Whether `call` is to a read-only tool of the env: replays that compare states skip it."""
        spec = self.env.tools.get(call.name)
        return spec is not None and spec.read_only

    async def replay(
        self, database: bytes, calls: list[Call], *, tables: list[str] | None = None, hashed: bool = True
    ) -> tuple[State, str]:
        """Run `calls` (reads skipped, as in `replay_snapshots`) in a fresh episode on `database`; the
        exported end state (of `tables`) and its hash."""
        episode = await self.open_episode(database)
        try:
            for call in calls:
                if self.reads_only(call):
                    continue
                await execute(episode, call.name, call.arguments)
            state = await self.export_tables(episode, tables)
        finally:
            await self.close_episode(episode)
        return state, state_hash(state) if hashed else ""

    async def replay_differs(
        self,
        database: bytes,
        calls: list[Call],
        golden: State,
        tables: list[str],
        *,
        rows: Sequence[RowCheck] = (),
    ) -> bool:
        """Whether replaying `calls` on `database` ends with one of `tables` unlike `golden`'s (to cents).

        `rows`, golden rows by key (a dropped write's checkpoint: the rows it changed), are looked
        up first: one that the replay does not hold as `golden` does (to cents) settles it in a
        few reads. Otherwise tables are read and compared one at a time, in the order given, and
        the first difference ends the check: when a replay is expected to differ (a dropped
        write), the tables that write touches are usually the only ones read. Where the golden
        state's `Mirror` has a table as tuples, the table is read as tuples too and only rows that
        differ exactly become dicts, to be compared to cents as `states_match` compares them.
        """
        episode = await self.open_episode(database)
        try:
            for call in calls:
                await execute(episode, call.name, call.arguments)
            raw = episode.conn._conn
            for check in rows:
                reader = self.readers[check.table]
                if not reader.by_key or set(check.key) != set(reader.pk):
                    continue
                found = raw.execute(reader.by_key, [check.key[c] for c in reader.pk]).fetchone()
                if (found is None) != (check.row is None):
                    return True
                if found is not None and check.row is not None:
                    row = dict(zip(reader.cols, found, strict=True))
                    if row != check.row and cents_row(row) != cents_row(check.row):
                        return True
            for t in tables:
                want = None
                if self._golden_mirror is not None and self.golden_db(golden) is not None:
                    want = self._golden_mirror.tuples_of(t)
                if want is None:
                    part = await self.export_tables(episode, [t])
                    if not states_match(part, {t: golden[t]}):
                        return True
                elif _tuples_differ(
                    self.readers[t], await _read_tuples(episode, self.readers[t]), want, golden[t]
                ):
                    return True
        finally:
            await self.close_episode(episode)
        return False

    def tried(self, history: tuple[Any, ...], key: str) -> bool | None:
        """`try_instead`'s verdict for a call on the episode state `history` names, if known: a call
        that failed there (`call`'s memo) fails again."""
        verdict = self._tried.get((history, key))
        if verdict is None and (hit := self._memo.get((history, key))) is not None and hit.is_error:
            verdict = False
        return verdict

    async def try_instead(
        self,
        database: bytes,
        call: Call,
        *,
        refused: bool = False,
        history: tuple[Any, ...] | None = None,
        key: str | None = None,
        before: Callable[[str], list[tuple[Any, ...]] | None] | None = None,
    ) -> bool:
        """Whether `call`, run on `database`, is refused (when `refused`) or succeeds and changes it.

        The tables its statements wrote are compared with those of `database`: as `before(table)`
        gives them, read as `Mirror` tuples, where the caller holds them (a walk's mirror of the
        episode `database` is a snapshot of), else from a second copy of `database`. Given the
        `history` that names `database`'s state (see `call`) and the call's `key`, the verdict is
        kept for `tried`, and a failure also goes to `call`'s memo.
        """
        episode = await self.open_episode(database)
        try:
            episode.conn.take_written()  # type: ignore[attr-defined]
            res = await execute(episode, call.name, call.arguments)
            written = episode.conn.take_written()  # type: ignore[attr-defined]
            if res.is_error and history is not None and key is not None:
                self._remember((history, key), res)
            if refused or res.is_error:
                verdict = refused and res.kind == "refused"  # an env error is no refusal
            elif "*" in written:
                verdict = await self.export_tables(episode, None) != (await self.replay(database, []))[0]
            else:
                verdict = False
                other = None
                try:
                    # The first table that differs settles it: the smaller ones are read first.
                    seed = self.env.seed_state()
                    for t in sorted(written, key=lambda t: (len(seed.get(t, ())), t)):
                        reader = self.readers[t]
                        was = before(t) if before is not None else None
                        if was is None:
                            other = other or await self.open_episode(database)
                            was = await _read_tuples(other, reader)
                        if await _read_tuples(episode, reader) != was:
                            verdict = True
                            break
                finally:
                    if other is not None:
                        await self.close_episode(other)
        finally:
            await self.close_episode(episode)
        if history is not None and key is not None:
            self._tried.put((history, key), verdict)
        return verdict

    async def replay_snapshots(
        self,
        database: bytes,
        calls: list[Call],
        at: list[int],
        *,
        unless_equal: bytes | None = None,
        kinds: dict[int, str] | None = None,
    ) -> tuple[State | None, dict[int, bytes]]:
        """`replay` (full export, unhashed), also serialising the database just before each call in `at`.

        Read calls are skipped: they cannot change the state (the runtime refuses, and rolls back,
        a read tool that tries), and only the state is compared.

        A snapshot taken before call i is exactly the state a fresh replay of `calls[:i]` reaches,
        so replays that differ from this one only from call i on can start there. When the end
        database is byte for byte `unless_equal`, its export would be that database's export:
        None is returned instead of exporting again. Given `kinds`, the result kind of each write
        call (`ToolResult.kind`) is put there by position.
        """
        wanted = set(at)
        snapshots: dict[int, bytes] = {}
        episode = await self.open_episode(database)
        try:
            for i, call in enumerate(calls):
                if i in wanted:
                    snapshots[i] = await episode.snapshot()
                if self.reads_only(call):
                    continue
                result = await execute(episode, call.name, call.arguments)
                if kinds is not None:
                    kinds[i] = result.kind
            if unless_equal is not None and await episode.snapshot() == unless_equal:
                state = None
            else:
                state = await episode.export()
        finally:
            await self.close_episode(episode)
        return state, snapshots


async def _read_tuples(episode: Episode, reader: TableReader) -> list[tuple[Any, ...]]:
    async with episode.lock:
        return await on_db_thread(episode.conn, lambda: episode.conn._conn.execute(reader.sql).fetchall())


def _tuples_differ(
    reader: TableReader, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], rows: list[Row]
) -> bool:
    """`not states_match` for one table: `got` (read as tuples) against `want`, the tuples of `rows`."""
    if got == want:
        return False
    if len(got) != len(want):
        return True
    cols = reader.cols
    return any(
        a != b and cents_row(dict(zip(cols, a, strict=True))) != cents_row(row)
        for a, b, row in zip(got, want, rows, strict=True)
    )
