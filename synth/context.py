"""What synthesis, verification and scoring share about one env: graph, domains, states, replay.

Episodes are always created from serialised bytes (the seed database, or a task's initial state
built once), and calls go straight to `Fleet.call`, with no MCP framing: this is the hot path of
synthesis and self-verification.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from envforge.server import Environment, Fleet, State, state_hash
from envforge.server.state import export_state

from .domains import derive_domains, key_columns
from .models import Call, ParamDomain, Task, ToolGraph
from .statediff import apply_diff, cents_hash, primary_keys


@dataclass
class SynthContext:
    env: Environment
    graph: ToolGraph
    fleet: Fleet
    domains: dict[str, dict[str, ParamDomain]] = field(default_factory=dict)
    pks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    key_names: set[str] = field(default_factory=set)
    _initial: dict[str, tuple[bytes, State, str]] = field(default_factory=dict)

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
        out: set[str] = set()
        for name in tools:
            if name in self.env.tools:
                out |= set(self.env.tools[name].writes) | set(self.graph.tool(name).writes)
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
