"""What synthesis, verification and scoring share about one env: graph, domains, states, replay.

Episodes are always created from serialised bytes (the seed database, or a task's initial state
built once), and calls go straight to `Fleet.call`, with no MCP framing: this is the hot path of
synthesis and self-verification.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiosqlite

from envforge.server import Environment, Fleet, State, ToolResult, state_hash
from envforge.server.state import export_state

from .domains import DomainValues, derive_domains, key_columns
from .models import Call, GraphEdge, ParamDomain, Task, ToolGraph, ToolNode
from .statediff import apply_diff, cents_hash, primary_keys

# Memoised tool results kept per context before the memo is dropped and refilled (bounds memory).
MEMO_LIMIT = 50_000


class InlineConnection(aiosqlite.Connection):
    """An `aiosqlite.Connection` that runs its SQLite work directly on the calling thread.

    Synthesis is one sequential coroutine per env, so handing every statement to a worker thread
    buys no parallelism and costs two thread switches per statement (about half the time of a
    tool call). Tools still see the `aiosqlite.Connection` API and run the same SQL in the same
    order, so their results are the same.
    """

    def __init__(self, connector: Callable[[], sqlite3.Connection]) -> None:
        # aiosqlite's __init__ creates a thread object we never start; set its fields directly.
        self._running = True
        self._connection: sqlite3.Connection | None = None
        self._connector = connector
        self._iter_chunk_size = 64

    def __del__(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def __await__(self) -> Any:
        return self._connect().__await__()

    async def _connect(self) -> InlineConnection:
        if self._connection is None:
            self._connection = self._connector()
        return self

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        return fn(*args, **kwargs)

    def stop(self) -> None:  # type: ignore[override]
        self._running = False
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def close(self) -> None:
        self.stop()


class InlinePool:
    """Stands in for the episode store's `WorkerPool`: connections that run on the caller's thread."""

    async def connect(self, connector: Callable[[], sqlite3.Connection]) -> aiosqlite.Connection:
        return await InlineConnection(connector)


def run_inline(fleet: Fleet) -> None:
    """Make `fleet`'s new episodes execute SQL on the event loop's thread (single-core synthesis)."""
    fleet.store.pool = InlinePool()  # type: ignore[assignment]


def call_key(call: Call) -> str | None:
    """The identity of a call for memoisation (None when its arguments are not plain JSON)."""
    try:
        return call.name + "\0" + json.dumps(call.arguments, sort_keys=True)
    except (TypeError, ValueError):
        return None


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
    _memo: dict[tuple[Any, ...], ToolResult] = field(default_factory=dict)
    _usable: dict[str, bool] = field(default_factory=dict)
    _golden_db: tuple[State, bytes] | None = None

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

    def domain_values(self, setup_key: str, state: State) -> DomainValues:
        """Candidate parameter values drawn from an initial state, shared by every task built on it."""
        dv = self._values.get(setup_key)
        if dv is None or dv.state is not state:
            dv = self._values[setup_key] = DomainValues(state)
        return dv

    # ------------------------------------------------------------------ states
    def initial(self, setup_key: str, setup: Any) -> tuple[bytes, State, str]:
        """(database bytes, canonical state, cents hash) of the seed with `setup` applied (cached)."""
        if setup_key not in self._initial:
            seed = self.env.seed_state()
            if not setup:
                self._initial[setup_key] = (self.env.seed_db, seed, cents_hash(seed))
            else:
                state = apply_diff(self.pks, seed, setup)
                self._initial[setup_key] = (self.env.database_from_state(state), state, cents_hash(state))
        return self._initial[setup_key]

    def task_initial(self, task: Task) -> tuple[bytes, State, str]:
        key = json.dumps({t: d.model_dump(mode="json") for t, d in task.setup.items()}, sort_keys=True)
        return self.initial(key, task.setup)

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

    async def export_tables(self, episode_id: str, tables: list[str] | None) -> State:
        """The canonical export of some tables only (all when None): cheap state for write diffs."""
        episode = self.fleet.store.get(episode_id)
        if tables is None:
            return await episode.export()
        infos = [t for t in self.env.tables if t.name in tables]
        async with episode.lock:
            return await episode.conn._execute(
                export_state, episode.conn._conn, infos, self.env.manifest.volatile_columns
            )

    def note_golden_db(self, golden: State, database: bytes) -> None:
        """Remember the serialised database whose export is `golden` (only the latest task's)."""
        self._golden_db = (golden, database)

    def golden_db(self, golden: State | None) -> bytes | None:
        """The database noted for exactly this `golden` object, if any."""
        if golden is None or self._golden_db is None or self._golden_db[0] is not golden:
            return None
        return self._golden_db[1]

    # ------------------------------------------------------------------ calls
    async def call(self, episode_id: str, history: tuple[Any, ...], call: Call) -> ToolResult:
        """`Fleet.call`, answered from memory when executing it could not change the episode.

        `history` names the episode's state: its initial state and the successful writes made
        since (tools are deterministic functions of state and arguments: the 'deterministic'
        self-check holds every shipped task to that). A read call, or a call that failed (the
        runtime rolls failed calls back), leaves the state as it was, so the same call on the same
        history gives the same result without running; walks retry the same refused writes and
        lookups many times. A call that changed state is always executed for real.
        """
        ck = call_key(call)
        key = (history, ck)
        if ck is not None:
            hit = self._memo.get(key)
            if hit is not None:
                return hit
        res = await self.fleet.call(episode_id, call.name, call.arguments)
        if ck is not None and (res.is_error or self.env.tools[call.name].read_only):
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = res
        return res

    async def replay(
        self, database: bytes, calls: list[Call], *, tables: list[str] | None = None, hashed: bool = True
    ) -> tuple[State, str]:
        """Run `calls` in a fresh episode on `database`; the exported end state (of `tables`) and its hash."""
        episode = await self.fleet.create_episode(self.env.name, database=database)
        try:
            for call in calls:
                await self.fleet.call(episode.id, call.name, call.arguments)
            state = await self.export_tables(episode.id, tables)
        finally:
            await self.fleet.close_episode(episode.id)
        return state, state_hash(state) if hashed else ""

    async def replay_snapshots(
        self, database: bytes, calls: list[Call], at: list[int], *, unless_equal: bytes | None = None
    ) -> tuple[State | None, dict[int, bytes]]:
        """`replay` (full export, unhashed), also serialising the database just before each call in `at`.

        A snapshot taken before call i is exactly the state a fresh replay of `calls[:i]` reaches,
        so replays that differ from this one only from call i on can start there. When the end
        database is byte for byte `unless_equal`, its export would be that database's export:
        None is returned instead of exporting again.
        """
        wanted = set(at)
        snapshots: dict[int, bytes] = {}
        episode = await self.fleet.create_episode(self.env.name, database=database)
        try:
            for i, call in enumerate(calls):
                if i in wanted:
                    snapshots[i] = await episode.snapshot()
                await self.fleet.call(episode.id, call.name, call.arguments)
            if unless_equal is not None and await episode.snapshot() == unless_equal:
                state = None
            else:
                state = await episode.export()
        finally:
            await self.fleet.close_episode(episode.id)
        return state, snapshots
