"""Deterministic probes: the generated env must match its docs and behave like a careful implementation.

Per documented tool: the schema matches the docs (name, parameter names, required, types, enums);
valid calls built from seed data succeed, and a write's change a row; missing and wrong-typed
arguments, unknown ids, and values naming no row by a column whose every row has its own
(`_names_a_row`) are refused with a `ToolError` (a crash is no refusal) and change nothing, and such
a name is never written into a row as data; read tools write nothing and write tools write only the
tables they declare, measured by SQLite's authorizer (`synth/graph/footprint.py`) rather than trusted.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from envforge.server import Environment, Fleet
from envforge.synth.graph.domains import DomainValues, derive_domains, key_columns
from envforge.synth.graph.footprint import Footprint, set_authorizer

from .docs_input import ToolDoc

RUNTIME_LOG = "envforge.server.runtime.calls"
"""The logger the runtime reports a tool's unexpected exception to, with the exception."""
ENV_ERROR_PREFIX = "Error: internal error of the environment"
"""How a call's result begins when the tool crashed (the runtime's wording, as agents see it)."""
UNKNOWN_STR = "UNKNOWN-ID-0000"
UNKNOWN_INT = 987_654_321


@dataclass
class ProbeOutcome:
    checks: int = 0
    passed: int = 0
    problems: list[str] = field(default_factory=list)
    valid_args: dict[str, dict[str, Any]] = field(default_factory=dict)

    def check(self, ok: bool, problem: str) -> None:
        self.checks += 1
        if ok:
            self.passed += 1
        else:
            self.problems.append(problem)


def _types(schema: dict[str, Any]) -> set[str]:
    """The non-null JSON types a property admits, looking through anyOf/Optional and enums."""
    out: set[str] = set()
    for opt in schema.get("anyOf") or [schema]:
        t = opt.get("type")
        if isinstance(t, list):
            out |= {x for x in t if x != "null"}
        elif t and t != "null":
            out.add(t)
        elif "enum" in opt or "const" in opt:
            out.add("string")
    return out


def _enum(schema: dict[str, Any]) -> set[Any]:
    vals: set[Any] = set()
    for opt in schema.get("anyOf") or [schema]:
        vals |= set(opt.get("enum") or [])
        if "const" in opt:
            vals.add(opt["const"])
    return vals


def schema_problems(doc: ToolDoc, env: Environment) -> list[str]:
    """How the generated tool's surface differs from its documentation (empty: it matches)."""
    spec = env.tools.get(doc.name)
    if spec is None:
        return [f"tool {doc.name!r} is documented but not implemented (implemented: {sorted(env.tools)})"]
    out = []
    want, got = set(doc.properties), set(spec.parameters)
    if want != got:
        out.append(f"{doc.name}: parameters {sorted(got)} but the docs say {sorted(want)}")
    if set(doc.required) != set(spec.required):
        out.append(f"{doc.name}: required {sorted(spec.required)} but the docs say {sorted(doc.required)}")
    props = spec.input_schema.get("properties", {})
    for p in sorted(want & got):
        dt, gt = _types(doc.properties[p]), _types(props.get(p, {}))
        if dt and gt and not dt <= gt and not (dt == {"number"} and gt == {"integer", "number"}):
            out.append(f"{doc.name}.{p}: type {sorted(gt)} but the docs say {sorted(dt)}")
        de, ge = _enum(doc.properties[p]), _enum(props.get(p, {}))
        if de and de != ge:
            got_vals, doc_vals = sorted(map(str, ge)), sorted(map(str, de))
            out.append(f"{doc.name}.{p}: allowed values {got_vals} but the docs say {doc_vals}")
    return out


def _wrong_value(schema: dict[str, Any]) -> Any:
    types = _types(schema)
    return 12345 if types & {"string", "array", "object"} else "not-a-number"


OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-f]+>")
"""How a result shows an object that is no value (`str()` of it): Qwen2.5-Coder-1.5B's write tools
returned `await db.execute(...)`, a cursor, and every result read "<...LocalCursor object at
0x7f...>": it tells the agent nothing, and its address differs from run to run."""


def _keyless_rows(
    state: dict[str, list[dict[str, Any]]], env: Environment, tables: Collection[str]
) -> list[str]:
    """The written tables holding a row whose primary key is NULL. SQLite lets a key that is not
    INTEGER PRIMARY KEY be NULL, so an INSERT that leaves out a TEXT `id` succeeds with a row no
    later call can name, and two such rows look like one to whatever compares states by key
    (captured on Slack: every message the 1.5B's tools posted had the id NULL)."""
    seed = env.seed_state()
    found = []
    for table in env.tables:
        keys = table.primary_key
        if table.name in tables and keys:
            now, before = (_keyless(rows.get(table.name, []), keys) for rows in (state, seed))
            if now > before:
                found.append(f"inserted a row into {table.name} with no {'/'.join(keys)} (NULL)")
    return found


def _keyless(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> int:
    return sum(1 for row in rows if any(row.get(k) is None for k in keys))


def _row_naming_params(
    domains: dict[str, Any],
    required: list[str],
    ids: set[str],
    seed: dict[str, list[dict[str, Any]]],
    after: dict[str, list[dict[str, Any]]],
    valid: dict[str, Any],
) -> dict[str, str]:
    """The required text parameters of a write that name a row by a column other than a key
    (`_names_a_row`), each with that `table.column`."""
    named = {}
    for p in required:
        dom = domains[p]
        if dom.enum or dom.is_list or dom.type != "string":
            continue
        if any(c.split(".", 1)[1] in ids for c in dom.columns):
            continue  # an id: the unknown-id probe's
        key = _names_a_row(seed, after, dom.columns, valid[p])
        if key:
            named[p] = key
    return named


def _stored_as(
    seed: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]], value: Any, names: set[str]
) -> str:
    """The `table.column` of a row the call wrote (new or changed) that holds `value` in a column
    not named in `names`, or "". The same 1.5B, told to look the message up, kept inserting a new
    message whose text was the timestamp of the one to react to: a name of a row, written as data."""
    for table, rows in after.items():
        before = {tuple(sorted(row.items())) for row in seed.get(table, [])}
        for row in rows:
            if tuple(sorted(row.items())) in before:
                continue
            for column, held in row.items():
                if column not in names and held == value:
                    return f"{table}.{column}"
    return ""


def _names_a_row(
    seed: dict[str, list[dict[str, Any]]],
    after: dict[str, list[dict[str, Any]]],
    columns: Collection[str],
    value: Any,
) -> str:
    """The `table.column` by which a write tool's argument names an existing row, or "".

    An id in all but name: a column whose every seed row holds its own value (a message's
    timestamp, a user's email), and which the call did not store the value it was given into (a
    value it stores is content it creates, as a new message's text). A write given such a value
    that names no row must refuse it: Qwen2.5-Coder-1.5B's `slack_add_reaction(channel_id,
    timestamp, reaction)` never looked the message up and inserted a new message holding the
    timestamp as its text, whatever the timestamp named; the id probe above skipped it, as
    `timestamp` is neither a primary nor a foreign key."""
    unique = ""
    for column in columns:
        table, name = column.split(".", 1)
        held = [row.get(name) for row in seed.get(table, [])]
        if sum(1 for row in after.get(table, []) if row.get(name) == value) > held.count(value):
            return ""  # stored as given, in any of the columns it could name a row by
        if not unique and len(held) >= 2 and None not in held and len(set(map(str, held))) == len(held):
            unique = column
    return unique


async def _state_hash(fleet: Fleet, episode_id: str) -> str:
    return (await fleet.export(episode_id))[1]


class _Crashes(logging.Handler):
    """What each tool's last crash said, from the runtime's own log of it: an agent is told only
    "internal error of the environment", but the model repairing the tool needs the error itself
    (Qwen2.5-Coder-1.5B's Slack tools crashed on `name 'text' is not defined`, and the evidence
    did not say so)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.said: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and isinstance(record.args, tuple) and len(record.args) >= 2:
            self.said[str(record.args[1])] = f"{type(exc).__name__}: {exc}"[:200]

    def why(self, tool: str, text: str) -> str:
        crashed = text.startswith(ENV_ERROR_PREFIX) and tool in self.said
        return f" [it crashed: {self.said[tool]}]" if crashed else ""


async def probe_env(env: Environment, docs: list[ToolDoc], *, attempts: int = 12) -> ProbeOutcome:
    """Run every deterministic probe; each contributes one check to the gate's pass rate."""
    with _crash_log() as crashes:
        return await _probe_env(env, docs, attempts, crashes)


@contextmanager
def _crash_log() -> Iterator[_Crashes]:
    """The runtime's log of tool crashes, read for the block."""
    crashes = _Crashes()
    runtime_log = logging.getLogger(RUNTIME_LOG)
    runtime_log.addHandler(crashes)
    try:
        yield crashes
    finally:
        runtime_log.removeHandler(crashes)


async def _probe_env(env: Environment, docs: list[ToolDoc], attempts: int, crashes: _Crashes) -> ProbeOutcome:
    out = ProbeOutcome()
    documented = {d.name for d in docs}
    for extra in sorted(set(env.tools) - documented):
        out.check(False, f"tool {extra!r} is not in the docs (implement only the documented tools)")
    for doc in docs:
        problems = schema_problems(doc, env)
        out.check(not problems, "; ".join(problems))
    domains = derive_domains(env)
    values = DomainValues(env.seed_state())
    ids = key_columns(env)
    fleet = Fleet([env], max_episodes=64)
    try:
        for doc in docs:
            if doc.name in env.tools:
                domain = domains[doc.name]
                await _probe_tool(fleet, env, doc.name, domain, values, ids, attempts, out, crashes)
    finally:
        await fleet.aclose()
    return out


async def _probe_tool(
    fleet: Fleet,
    env: Environment,
    name: str,
    domains: dict[str, Any],
    values: DomainValues,
    ids: set[str],
    attempts: int,
    out: ProbeOutcome,
    crashes: _Crashes,
) -> None:
    spec = env.tools[name]
    seed = env.seed_state()
    rng = random.Random(f"envsynth-probe:{env.name}:{name}")
    required = [p for p in spec.parameters if p in spec.required]
    episode = await fleet.create_episode(env.name)
    try:
        valid: dict[str, Any] | None = None
        footprint = Footprint()
        last_error = ""
        result = ""
        keyless: list[str] = []
        after: dict[str, list[dict[str, Any]]] = {}
        named: dict[str, str] = {}
        idle: tuple[dict[str, Any], str] | None = None
        start = await _state_hash(fleet, episode.id)
        for attempt in range(attempts):
            order = list(required)
            rng.shuffle(order)
            bindings: dict[str, Any] = {}
            # Alternate entity-consistent arguments (an order with its own customer) with independent
            # ones: consistency helps ownership checks, but binding every key to one existing row
            # (a member with a class they already booked) can make every attempt a duplicate.
            if attempt % 2 == 0:
                args = {p: values.pick_bound(rng, domains[p], bindings, ids) for p in order}
            else:
                args = {p: values.pick(rng, domains[p]) for p in order}
            await set_authorizer(episode, footprint)
            res = await fleet.call(episode.id, name, args)
            await set_authorizer(episode, None)
            if not res.is_error:
                if not spec.read_only and await _state_hash(fleet, episode.id) == start:
                    idle = idle or (args, res.text)  # a write that wrote nothing: try other rows
                    continue
                valid, result = args, res.text
                if not spec.read_only:
                    after = await fleet.export_state(episode.id)
                    keyless = _keyless_rows(after, env, spec.writes)
                break
            last_error = res.text
        why = crashes.why(name, last_error)
        none_ok = f"{name}: no valid call from seed data succeeded (last: {last_error[:200]}){why}"
        if valid is None and idle is not None:
            valid, result = idle
            after = await fleet.export_state(episode.id)
        out.check(valid is not None, none_ok)
        if not spec.read_only:
            out.check(
                idle is None or valid is not idle[0],
                f"{name}: every call from seed data that succeeded changed no row (one was {idle[0]!r}"
                f" -> {idle[1][:120]}): a write must write the row its arguments name"
                if idle
                else "",
            )
        if valid is not None:
            out.valid_args[name] = valid
            shown = OBJECT_REPR.search(result)
            out.check(
                shown is None,
                f"{name}: its result is a Python object, not a value (got: {shown[0] if shown else ''})",
            )
            if not spec.read_only:
                out.check(not keyless, f"{name}: {'; '.join(keyless)}")
                named = _row_naming_params(domains, required, ids, seed, after, valid)
                for p, key in named.items():
                    misplaced = _stored_as(seed, after, valid[p], {p, key.split(".", 1)[1]})
                    out.check(
                        not misplaced,
                        f"{name}: {p}={valid[p]!r} names a row by {key}, yet was written as {misplaced}"
                        " of a row: act on the row it names",
                    )
        written = set(footprint.writes)
        if spec.read_only:
            out.check(not written, f"{name}: a read tool wrote {sorted(written)}")
        else:
            out.check(
                written <= set(spec.writes),
                f"{name}: wrote {sorted(written)} but declares writes={sorted(spec.writes)}",
            )
        # Refusals: each must be an error and leave the state as it was.
        base = valid or {p: values.pick(rng, domains[p]) for p in required}
        bad_calls: list[tuple[str, dict[str, Any]]] = []
        for p in required:
            bad_calls.append((f"missing '{p}'", {k: v for k, v in base.items() if k != p}))
        props = spec.input_schema.get("properties", {})
        for p in spec.parameters:
            bad_calls.append((f"wrong-typed '{p}'", {**base, p: _wrong_value(props.get(p, {}))}))
        if valid is not None:
            for p in required:
                dom = domains[p]
                if dom.enum or dom.is_list:
                    continue
                if any(c.split(".", 1)[1] in ids for c in dom.columns):
                    unknown = UNKNOWN_INT if dom.type == "integer" else UNKNOWN_STR
                    bad_calls.append((f"unknown id {p}={unknown!r}", {**valid, p: unknown}))
                elif p in named:
                    label = f"unknown {p}={UNKNOWN_STR!r} (it names a row by {named[p]}, unique per row)"
                    bad_calls.append((label, {**valid, p: UNKNOWN_STR}))
        for label, args in bad_calls:
            before = await _state_hash(fleet, episode.id)
            crashes.said.pop(name, None)
            res = await fleet.call(episode.id, name, args)
            changed = await _state_hash(fleet, episode.id) != before
            crashed = res.is_error and res.text.startswith(ENV_ERROR_PREFIX)
            out.check(
                res.is_error and not crashed and not changed,
                f"{name}: {label} was not refused (got: {res.text[:160]})"
                if not res.is_error
                else f"{name}: {label} crashed instead of being refused{crashes.why(name, res.text)}"
                if crashed
                else f"{name}: {label} was refused but changed the state",
            )
    finally:
        await fleet.close_episode(episode.id)


@dataclass
class ExecutedCall:
    tool: str
    arguments: dict[str, Any]
    expect: str
    is_error: bool
    result: str
    crash: str = ""
    """The tool's own exception when it crashed (` [it crashed: ...]`), else ""."""

    @property
    def crashed(self) -> bool:
        return self.is_error and self.result.startswith(ENV_ERROR_PREFIX)


async def execute_proposals(env: Environment, proposals: list[dict[str, Any]]) -> list[ExecutedCall]:
    """Run the tester's calls, each in a fresh episode on the seed state, and keep what came back
    (a crash with the tool's own exception, which the agent-facing result does not say)."""
    fleet = Fleet([env], max_episodes=64)
    done = []
    with _crash_log() as crashes:
        try:
            for p in proposals:
                episode = await fleet.create_episode(env.name)
                given = p.get("arguments")
                args: dict[str, Any] = given if isinstance(given, dict) else {}
                tool = str(p.get("tool", ""))
                crashes.said.pop(tool, None)
                res = await fleet.call(episode.id, tool, args)
                await fleet.close_episode(episode.id)
                done.append(
                    ExecutedCall(
                        tool,
                        args,
                        str(p.get("expect", "")),
                        res.is_error,
                        res.text[:800],
                        crashes.why(tool, res.text),
                    )
                )
        finally:
            await fleet.aclose()
    return done
