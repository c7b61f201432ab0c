"""Measure what each tool reads and writes, and what it returns, by running it on the seed state.

The read/write sets come from SQLite's authorizer hook, set on the episode's connection inside its
worker thread, so they are what the tool's SQL actually touched rather than what it declares.
Results are parsed as JSON and their keys (with the values seen) become the evidence for the
tool graph's value edges.
"""

from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from envforge.server import Environment, Episode, Fleet

from ..task.models import ParamDomain
from .domains import DomainValues

_READ = sqlite3.SQLITE_READ
_WRITE_ACTIONS = {sqlite3.SQLITE_INSERT: "*", sqlite3.SQLITE_DELETE: "*"}


@dataclass
class Footprint:
    reads: dict[str, set[str]] = field(default_factory=dict)
    writes: dict[str, set[str]] = field(default_factory=dict)

    def add_read(self, table: str, column: str | None) -> None:
        cols = self.reads.setdefault(table, set())
        if column:
            cols.add(column)

    def add_write(self, table: str, column: str) -> None:
        self.writes.setdefault(table, set()).add(column)


@dataclass
class Probe:
    """Everything learnt about one tool from probing it."""

    footprint: Footprint = field(default_factory=Footprint)
    keys: dict[str, list[Any]] = field(default_factory=dict)
    probes: int = 0
    successes: int = 0


def _authorizer(fp: Footprint):  # type: ignore[no-untyped-def]
    def cb(action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None) -> int:
        if arg1 and not arg1.startswith("sqlite_"):
            if action == _READ:
                fp.add_read(arg1, arg2)
            elif action == sqlite3.SQLITE_UPDATE and arg2:
                fp.add_write(arg1, arg2)
            elif action in _WRITE_ACTIONS:
                fp.add_write(arg1, "*")
        return sqlite3.SQLITE_OK

    return cb


async def set_authorizer(episode: Episode, fp: Footprint | None) -> None:
    """Install (or remove, with None) the footprint recorder; this also expires cached statements.

    It rides on the episode's own authorizer (`Episode.set_probe`), which must stay installed:
    the episode relies on it to know which tables were written.
    """
    await episode.set_probe(_authorizer(fp) if fp is not None else None)


def parse_result(text: str) -> Any:
    """The tool result as JSON, or None when it is plain text."""
    if not text or text[0] not in "[{":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def scalar_pairs(value: Any) -> list[tuple[str, Any]]:
    """Every (key, scalar value) in a JSON value, at any depth; list scalars count under their key."""
    out: list[tuple[str, Any]] = []

    def walk(v: Any, key: str | None) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, k)
        elif isinstance(v, list):
            for x in v:
                walk(x, key)
        elif key is not None and v is not None:
            out.append((key, v))

    walk(value, None)
    return out


async def probe_tool(
    fleet: Fleet,
    env: Environment,
    name: str,
    domains: dict[str, ParamDomain],
    values: DomainValues,
    *,
    key_names: set[str] | None = None,
    probes: int = 8,
) -> Probe:
    """Call the tool `probes` times with arguments from its domains, recording footprint and keys."""
    spec = env.tools[name]
    rng = random.Random(f"probe:{env.name}:{name}")
    result = Probe()
    keys: dict[str, dict[str, Any]] = {}
    episode = await fleet.create_episode(env.name)
    try:
        for _ in range(probes):
            required = [p for p in spec.parameters if p in spec.required]
            rng.shuffle(required)
            bindings: dict[str, Any] = {}
            args = {p: values.pick_bound(rng, domains[p], bindings, key_names or set()) for p in required}
            await set_authorizer(episode, result.footprint)
            res = await fleet.call(episode.id, name, args)
            await set_authorizer(episode, None)
            result.probes += 1
            if res.is_error:
                continue
            result.successes += 1
            for k, v in scalar_pairs(parse_result(res.text)):
                keys.setdefault(k, {})[json.dumps(v, sort_keys=True)] = v
    finally:
        await fleet.close_episode(episode.id)
    result.keys = {k: [vs[s] for s in sorted(vs)] for k, vs in sorted(keys.items())}
    return result
