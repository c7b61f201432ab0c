"""Task construction: random walks on the tool graph, merged into a DAG, executed for real.

A task is built inside one episode started from its initial state. Each step extends the DAG from
any node already in it (so every new walk shares an entity with what came before): an edge of the
tool graph says which earlier result can feed which parameter of the next tool, and the value is
taken from that result, chosen by a reasoning node (argmax/argmin/filter over a list, or a branch
on a compared figure) where a list offers several. Every call is executed as it is added; a call
that fails is dropped and another is tried, so the DAG in the end is exactly what ran, in
topological order, and the episode's final state is the golden state.
"""

from __future__ import annotations

import json
import math
import random
import re
from bisect import bisect_right
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter
from typing import Any, Literal, NamedTuple

from envforge.server import Environment, Episode, ScratchConnection, State

from ..graph.domains import DomainValues, accepts, weighted_choice
from ..task.golden import BuiltTask, GoldenRun
from ..task.models import (
    ArgSource,
    Call,
    CallNode,
    Checkpoint,
    Dag,
    DagEdge,
    DagNode,
    Difficulty,
    Fact,
    GraphEdge,
    Principal,
    ReasonNode,
    ReasonOp,
    Row,
    RowCheck,
    StateDiff,
    Task,
)
from ..task.policy_rules import identity_facts, load_policy_rules
from ..task.statediff import json_key
from ..walk.context import SynthContext
from ..walk.mirror import Mirror
from ..walk.replayer import call_key, scratch_connection
from ..walk.setup import Fresh
from ..walk.states import setup_key
from ..wording.render import VagueReference, render_scenario
from . import reasoning as R


@dataclass(frozen=True)
class SynthConfig:
    min_calls: int = 2
    max_calls: int = 7
    p_reason: float = 0.7
    p_branch: float = 0.35
    p_summary: float = 0.4
    p_refusal: float = 0.05
    tries_per_step: int = 8
    # Share of tasks whose initial state adds a fresh entity to the seed (`setup.py`); drawn from a
    # stream of its own, so that without steering a task without one is built exactly as it would
    # be with p_setup=0.
    p_setup: float = 0.2
    # Walks weigh their choices by what has worked in earlier attempts of the run (`outcomes.py`):
    # far fewer failed tries, at the price of attempts depending on the attempts before them.
    steer: bool = True


# Share of walks (with a principal and no fresh entity) that start from a tool taking the
# principal's key.
P_PRINCIPAL_START = 0.5

# Steps in which every try failed that a walk survives, before and after its first write.
STALLS_BEFORE_WRITE = 1
STALLS_AFTER_WRITE = 3


class BuildFailed(Exception):
    """The walk could not be completed; `reason` is counted in the synthesis report."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _json_key(v: Any) -> str:
    return json_key(v)


class CallOutcome(NamedTuple):
    """What one call of a walk came to."""

    ok: bool
    """It returned (it was not refused, invalid or an env error)."""
    data: Any
    """Its parsed result (`footprint.parse_result`; None when not ok)."""
    diff: StateDiff | None
    """For a write that returned, the state diff it made (empty: it changed nothing)."""
    text: str
    """Its result as the agent would see it."""


@dataclass(slots=True)
class _Option:
    """A way to extend the DAG: feed `edge.param` of `edge.target` from node `node`'s result."""

    node: CallNode
    edge: GraphEdge
    values: list[Any]
    weight: float  # before the step's adjustments: later nodes are likelier sources
    writes: bool  # whether the target tool writes
    feeds: tuple[str, str, str, str]  # the edge as `Outcomes` tallies it
    # `Outcomes.values` key of the option's value when it has only one (the call is then fixed but
    # for the other arguments, and how that value did matters): None with several.
    value_key: Hashable | None


@dataclass
class Builder:
    ctx: SynthContext
    rng: random.Random
    cfg: SynthConfig
    initial_state: State
    nodes: list[DagNode] = field(default_factory=list)
    edges: list[DagEdge] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    facts: list[Fact] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    #: What each output is (its entity and unit), in the order of `outputs`: a bare figure such as
    #: "2" is unambiguous only when the user knows what it counts.
    output_labels: list[str] = field(default_factory=list)
    write_diffs: dict[str, StateDiff] = field(default_factory=dict)
    done_calls: set[str] = field(default_factory=set)
    calls: int = 0
    writes: int = 0
    refusals: int = 0
    last_kind: str = "ok"  # the kind of the last call's result (`ToolResult.kind`)
    reasoned: bool = False
    episode: Episode = field(init=False)  # the walk's episode (set by `build_task`)
    conn: ScratchConnection = field(init=False)  # its connection, which reports what each call wrote
    mirror: Mirror = field(init=False)  # the walk's state as the golden run leaves it (set by `build`)
    stale: set[str] = field(default_factory=set)
    fresh: Fresh | None = None  # the entity a setup added, for the walk to act on
    # Whose story the task is (`principal.py`): every call stays on its rows and public ones.
    principal: Principal | None = None
    # What the walk's writes did so far, to keep a later write from undoing an earlier one: the
    # keys of the rows they inserted (per table), and each changed column's value before the walk.
    inserted: dict[str, set[Any]] = field(default_factory=dict)
    written_tools: list[str] = field(default_factory=list)
    fed: set[str] = field(
        default_factory=set
    )  # nodes whose result feeds a later node  # the tools of those writes, each once
    inserted_keys: set[Any] = field(default_factory=set)
    before_walk: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    _last_key: tuple[Call, str] | None = None
    _by_id: dict[str, CallNode] = field(default_factory=dict)
    _edge_keys: set[tuple[str, str, str]] = field(default_factory=set)  # (source, target, kind) of `edges`
    _node_options: dict[str, list[_Option]] = field(default_factory=dict)
    # `_from_results` answers
    _fed: dict[tuple[str, str], tuple[Any, ArgSource] | None] = field(default_factory=dict)
    _figures: dict[str, list[str]] = field(default_factory=dict)  # numeric keys of a node's result
    _alts: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)  # branch alternatives
    _reasonings: dict[tuple[Any, ...], list[tuple[Any, ...]]] = field(default_factory=dict)
    # The episode's state as (initial state, successful write calls...): the key of the call memo.
    history: tuple[Any, ...] = ("",)
    # Each executed call node's result text (`GoldenRun.texts`).
    texts: dict[str, str] = field(default_factory=dict)
    # The state right after the first successful write (`GoldenRun.after_first_write`), taken
    # when a second write is about to run; None until then, or when the mirror did not hold it whole.
    after_first_write: State | None = None
    _first_write_taken: bool = False
    # The principal and `Ownership.checker` for it on the initial state (`_allows`).
    _check: tuple[Principal, Callable[[Any, Any], bool]] | None = None

    # ------------------------------------------------------------------ helpers
    @property
    def env(self) -> Environment:
        return self.ctx.env

    def _usable(self, tool: str) -> bool:
        return self.ctx.index.usable(tool)

    def _key(self, call: Call) -> str:
        """The call's identity (`context.call_key`), for the memo, the history and `done_calls`.

        The builder asks for the same call's key several times in a row: the last one is kept.
        """
        last = self._last_key
        if last is not None and last[0] is call:
            return last[1]
        key = call_key(call)
        if key is None:  # arguments that are not plain JSON
            key = _json_key(call.model_dump())
        self._last_key = (call, key)
        return key

    def _new_id(self) -> str:
        return f"n{len(self.nodes)}"

    def _step_ref(self, node_id: str) -> str:
        return f"step {int(node_id[1:]) + 1}"

    def _add_fact(self, name: str, value: Any, node_id: str) -> None:
        same = [f for f in self.facts if f.name.split(" (")[0] == name]
        if any(_json_key(f.value) == _json_key(value) for f in same):
            return
        label = f"{name} ({self._step_ref(node_id)})" if same else name
        self.facts.append(Fact(name=label, value=value))

    def _fill(
        self, tool: str, fixed: dict[str, tuple[Any, ArgSource]]
    ) -> tuple[dict[str, Any], list[ArgSource]]:
        """Arguments for `tool`: the fixed ones, then earlier results by name, then user facts."""
        parameters, required = self.ctx.index.parameters(tool)
        args: dict[str, Any] = {}
        sources: dict[str, ArgSource] = {}
        bindings: dict[str, Any] = {}
        for p, (value, src) in fixed.items():
            args[p], sources[p] = value, src
            base = p[:-1] if isinstance(value, list) and p.endswith("s") else p
            bindings[base] = value[0] if isinstance(value, list) and value else value
            self._bind_row(bindings, base)
        todo = [p for p in required if p not in fixed]
        for p in todo:
            fed = self._from_results(tool, p)
            if fed is not None:
                args[p], sources[p] = fed
                value = fed[0]
                if isinstance(value, list):  # a list parameter: its one item names the entity
                    p = p[:-1] if p.endswith("s") else p
                    value = value[0]
                bindings.setdefault(p, value)
        rest = [p for p in todo if p not in args]
        self.rng.shuffle(rest)
        domains = self.ctx.domains[tool]
        values = self._values
        weigh = self.ctx.outcomes.weigh_for_writes
        for p in rest:
            args[p] = values.pick_bound(self.rng, domains[p], bindings, self.ctx.key_names, weigh)
            sources[p] = _user(p)
        order = [p for p in parameters if p in args]
        return {p: args[p] for p in order}, [sources[p] for p in order]

    def _bind_row(self, bindings: dict[str, Any], column: str) -> None:
        """Bind the key columns of the one row whose primary key `column` equals the bound value."""
        values = self._values
        for table in self.ctx.index.keyed_by(column):
            rows = values.rows_with(table, column, bindings[column])
            if rows:
                for k, v in values.key_items(rows[0], self.ctx.key_names):
                    bindings.setdefault(k, v)

    def _from_results(self, tool: str, param: str) -> tuple[Any, ArgSource] | None:
        """A unique value for `param` in the latest result whose graph edge names it.

        The answer changes only when a result is recorded, so it is kept until then.
        """
        key = (tool, param)
        if key not in self._fed:
            self._fed[key] = self._find_result(tool, param)
        return self._fed[key]

    def _find_result(self, tool: str, param: str) -> tuple[Any, ArgSource] | None:
        # `data` holds exactly the executed, not refused call nodes that returned JSON, in order.
        domain = self.ctx.domains[tool][param]
        if not self.ctx.index.tool(tool).read_only and not self.ctx.index.names_entity(domain):
            # An attribute an earlier result shows (a ticket's priority, a reservation's cabin) is
            # the entity's current value: a write given it back changes nothing or is refused.
            return None
        for node_id in reversed(self.data):
            node = self._by_id[node_id]
            for key in self.ctx.index.name_keys(node.call.name, tool, param):
                vals = self._key_values(node_id, key)
                if len(vals) == 1 and accepts(domain, vals[0]) and self._allows(tool, param, vals[0]):
                    value = [vals[0]] if domain.is_list else vals[0]
                    return value, _from_node(param, node_id, key)
        return None

    def _key_values(self, node_id: str, key: str) -> list[Any]:
        """The distinct values under `key` in a node's result, in JSON-text order (the last seen of
        equal texts): `results.key_values`, kept per result object."""
        return self.ctx.readings.values(self.data[node_id]).get(key, [])

    @property
    def _values(self) -> DomainValues:
        if not hasattr(self, "_dv"):
            if self.principal is None:
                self._dv = self.ctx.states.domain_values(self.history[0], self.initial_state)
            else:
                self._dv = self.ctx.ownership.values(self.history[0], self.initial_state, self.principal)
        return self._dv

    def _allows(self, tool: str, param: str, value: Any) -> bool:
        """Whether `value` for `tool`'s `param` names no other principal's row."""
        principal = self.principal
        if principal is None:
            return True
        check = self._check
        if check is None or check[0] is not principal:  # the principal is set once, after creation
            check = self._check = (
                principal,
                self.ctx.ownership.checker(self.history[0], self.initial_state, principal),
            )
        return check[1](self.ctx.domains[tool][param], value)

    def _on_story(self, call: Call) -> bool:
        """Whether every argument of `call` stays on the principal's rows and public ones."""
        return self.principal is None or all(self._allows(call.name, p, v) for p, v in call.arguments.items())

    # ------------------------------------------------------------------ execution
    async def _run(self, call: Call) -> CallOutcome:
        """Execute one call (or answer it from the call memo)."""
        key = self._key(call)
        read_only = self.env.tools[call.name].read_only
        if not read_only and self.writes == 1 and not self._first_write_taken:
            # Only successful writes that change something change the state, and each is recorded
            # as it runs: with one recorded, the state now is the one right after it.
            self._first_write_taken = True
            if not self.stale:
                self.after_first_write = dict(self.mirror.state)  # the mirror replaces, never mutates, lists
        res = await self.ctx.replayer.call(self.episode, self.history, call, key)
        self.last_kind = res.kind
        written = self.conn.take_written()
        if res.is_error:
            self.ctx.outcomes.record(call.name, read_only, call.arguments, False, res.text)
            return CallOutcome(ok=False, data=None, diff=None, text=res.text)
        diff = None
        if not read_only:
            self.history = (*self.history, key)
            # The diff covers the tool's write tables; of those, a call can change only the ones
            # its statements were authorized to write (`written`): the rest are not re-read.
            tables = self.ctx.index.write_tables([call.name])
            if "*" not in written:
                tables = [t for t in tables if t in written]
            updated = self.conn.taken_columns
            if updated is not None and self.stale:  # a stale table may have changed anywhere
                updated = {t: cols for t, cols in updated.items() if t not in self.stale}
            diff = await self.mirror.refresh(self.episode, tables, updated)
            if diff:
                undone = self.undoes(diff)
                for tool in self.written_tools:
                    self.ctx.outcomes.sequels.add((tool, call.name), not undone)
                if undone:
                    # The call has run: the walk's state now contradicts the story it told.
                    raise BuildFailed("write_undone")
            # `mirror.state` is the golden state at the end, without a full export: a table is
            # current if it was re-read after the last call that changed it. A call changes only
            # tables its statements were authorized to write, so those not re-read here are
            # stale until they are (at the end, if not before).
            self.stale |= written
            self.stale.difference_update(tables)
        # A write that changed nothing is of no use to a walk: it counts as a failure.
        self.ctx.outcomes.record(call.name, read_only, call.arguments, diff is None or bool(diff))
        return CallOutcome(ok=True, data=self.ctx.replayer.parsed(res), diff=diff, text=res.text)

    def _current_tuples(self, table: str) -> list[tuple[Any, ...]] | None:
        """The episode's rows of `table` now, as the mirror holds them (None: not held, or stale)."""
        if "*" in self.stale or table in self.stale:
            return None
        return self.mirror.tuples_of(table)

    async def golden_state(self) -> State:
        """The episode's state now: `mirror.state` with every possibly stale table re-read."""
        stale = self.stale
        tables = [t.name for t in self.env.tables if "*" in stale or t.name in stale]
        await self.mirror.refresh(self.episode, tables)
        self.stale = set()
        return self.mirror.state

    def _record_call(
        self,
        call: Call,
        sources: list[ArgSource],
        data: Any,
        diff: StateDiff | None,
        *,
        refused: bool = False,
        executed: bool = True,
        text: str = "",
    ) -> CallNode:
        spec = self.env.tools[call.name]
        node = CallNode(
            id=self._new_id(),
            kind="call",
            text="",
            call=call,
            write=not spec.read_only,
            executed=executed,
            expect_error=refused,
            args=sources,
        )
        node.text = self._call_text(node)
        self.nodes.append(node)
        self._by_id[node.id] = node
        for s in sources:
            if s.source == "node" and s.node is not None:
                self._edge(s.node, node.id, "data", f"{s.key}→{s.param}")
            elif s.source == "user":
                self._add_fact(s.param, call.arguments[s.param], node.id)
        if executed:
            self.calls += 1
            self.texts[node.id] = text
            self.done_calls.add(self._key(call))
            reads = set(self.ctx.index.tool(call.name).reads)
            for prev in self.nodes[:-1]:
                if prev.kind == "call" and prev.write and prev.executed and not prev.expect_error:
                    if reads & set(self.ctx.index.tool(prev.call.name).writes):
                        self._edge(prev.id, node.id, "state", "")
        if data is not None and executed and not refused:
            self.data[node.id] = data
            self._fed.clear()
        if diff:
            self.write_diffs[node.id] = diff
            self.writes += 1
            self._note_write(diff)
            if call.name not in self.written_tools:
                self.written_tools.append(call.name)
        if refused:
            self.refusals += 1
        return node

    def _note_write(self, diff: StateDiff) -> None:
        for table, d in diff.items():
            pk = self.ctx.pks[table]
            if len(pk) == 1:
                keys = {r.get(pk[0]) for r in d.inserted}
                self.inserted.setdefault(table, set()).update(keys)
                self.inserted_keys |= keys
            for u in d.updated:
                key = json_key(u.key)
                for col, value in u.before.items():
                    self.before_walk.setdefault((table, key, col), value)

    def undoes(self, diff: StateDiff) -> bool:
        """Whether a write's diff undoes what an earlier write of the walk did: it deletes or changes
        a row the walk inserted, or sets a column back to its value before the walk changed it."""
        for table, d in diff.items():
            pk = self.ctx.pks[table]
            made = self.inserted.get(table)
            if made and len(pk) == 1:
                if any(r.get(pk[0]) in made for r in d.deleted):
                    return True
                if any(u.key.get(pk[0]) in made for u in d.updated):
                    return True
            if self.before_walk:
                for u in d.updated:
                    key = json_key(u.key)
                    for col, value in u.after.items():
                        old = self.before_walk.get((table, key, col), _UNSET)
                        if old is not _UNSET and old == value:
                            return True
        return False

    def _acts_on_own_insert(self, call: Call) -> bool:
        """Whether a write call names a row an earlier write of the walk inserted (it would undo or
        rework it: cancel the booking just made)."""
        if not self.inserted_keys or self.ctx.index.tool(call.name).read_only:
            return False
        for v in call.arguments.values():
            for item in v if isinstance(v, list) else [v]:
                try:
                    if item in self.inserted_keys:
                        return True
                except TypeError:
                    continue
        return False

    def _edge(self, a: str, b: str, kind: str, label: str) -> None:
        if (a, b, kind) not in self._edge_keys:
            self._edge_keys.add((a, b, kind))
            self.edges.append(DagEdge(source=a, target=b, kind=kind, label=label))
            if kind == "data":
                self.fed.add(a)

    def live_calls(self) -> int:
        """The executed calls that will stay: writes, refusals and the reads that feed something so
        far (a read that feeds nothing is pruned at the end, so it does not count toward a
        walk's length)."""
        dead = sum(1 for n in self._by_id.values() if n.executed and not n.write and n.id not in self.fed)
        return self.calls - dead

    def _call_text(self, node: CallNode) -> str:
        spec = self.env.tools[node.call.name]
        desc = spec.description.strip().split("\n")[0].rstrip(".")
        parts = []
        for s in node.args:
            value = node.call.arguments[s.param]
            if s.source == "node" and s.node is not None:
                ref = self.nodes_by_id(s.node)
                where = (
                    "the result above" if ref.kind == "reason" else f"the result of {self._step_ref(s.node)}"
                )
                parts.append(f"{s.param}: the {s.key} from {where}")
            else:
                parts.append(f"{s.param}: {json.dumps(value, ensure_ascii=False)}")
        return f"{desc} ({'; '.join(parts)})" if parts else desc

    def nodes_by_id(self, node_id: str) -> DagNode:
        node = self._by_id.get(node_id)  # every call node is there; reasoning nodes are looked for
        if node is not None:
            return node
        return next(n for n in self.nodes if n.id == node_id)

    # ------------------------------------------------------------------ steps
    async def start(self) -> None:
        graph = self.ctx.graph
        starts = sorted(
            t.name
            for t in graph.tools
            if t.read_only and self._usable(t.name) and t.required and self.ctx.index.out_edges(t.name)
        )
        if not starts:
            starts = sorted(t.name for t in graph.tools if self._usable(t.name))
        if not starts:
            raise BuildFailed("no_usable_tools")
        fixed: dict[str, tuple[Any, ArgSource]] = {}
        own: list[str] = []
        aimed = self._aimed_starts(starts)
        if aimed:  # a setup's fresh entity: the walk starts from it
            tool, param = self.rng.choice(aimed)
            assert self.fresh is not None  # aimed starts exist only for a setup's fresh entity
            value = self.fresh.value
            fixed = {param: ([value] if self.ctx.domains[tool][param].is_list else value, _user(param))}
        else:
            # The story starts from its principal, half the time, where a tool takes the
            # principal's key: that call works (the principal exists) and leads to what the
            # principal owns; the other half keeps the starts varied.
            own = self._principal_starts(starts) if self.rng.random() < P_PRINCIPAL_START else []
            tool = weighted_choice(self.rng, own or starts, self.ctx.outcomes.starts.weight)
        failed: set[str] = set()
        dropped: set[str] = set()
        for _ in range(self.cfg.tries_per_step):
            args, sources = self._fill(tool, fixed)
            call = Call(name=tool, arguments=args)
            key = self._key(call)
            if key in failed or not self._on_story(call):
                # The principal's view offers this tool nothing new: another start tool may.
                dropped.add(tool)
                rest = [t for t in (own or starts) if t not in dropped] or [
                    t for t in starts if t not in dropped
                ]
                if fixed or not rest:
                    continue
                tool = weighted_choice(self.rng, rest, self.ctx.outcomes.starts.weight)
                continue
            out = await self._run(call)
            if out.ok and (out.diff is None or out.diff):
                self._record_call(call, sources, out.data, out.diff, text=out.text)
                return
            failed.add(key)
        raise BuildFailed("start_failed")

    def _principal_starts(self, starts: list[str]) -> list[str]:
        """The start tools with a required parameter that takes the principal's key."""
        if self.principal is None:
            return []
        ((column, _),) = self.principal.key.items()
        ref = f"{self.principal.table}.{column}"
        return [
            t
            for t in starts
            if any(ref in self.ctx.domains[t][p].columns for p in self.env.tools[t].required)
        ]

    def _aimed_starts(self, starts: list[str]) -> list[tuple[str, str]]:
        """(tool, parameter) pairs that take the fresh entity's key: the start tools first, else
        any usable tool (none without a fresh entity)."""
        if self.fresh is None:
            return []
        ref = f"{self.fresh.table}.{self.fresh.column}"
        for tools in (starts, sorted(t.name for t in self.ctx.graph.tools if self._usable(t.name))):
            aimed = [
                (tool, p)
                for tool in tools
                for p in sorted(self.env.tools[tool].required)
                if ref in self.ctx.domains[tool][p].columns
            ]
            if aimed:
                return aimed
        return []

    def acts_on_fresh(self) -> bool:
        """Whether a successful write call takes the fresh entity's key (the setup is then used)."""
        value = self.fresh.value if self.fresh else None
        for n in self.nodes:
            if n.kind == "call" and n.write and n.executed and not n.expect_error and n.call is not None:
                for v in n.call.arguments.values():
                    if v == value or (isinstance(v, list) and value in v):
                        return True
        return False

    def _options(self) -> list[_Option]:
        """Every way to extend the DAG, in node order. A node's options never change once it has
        a result (its edges and values are fixed), so they are listed once per node."""
        out = []
        for node_id in self.data:
            options = self._node_options.get(node_id)
            if options is None:
                node = self._by_id[node_id]
                tool = node.call.name
                weight = 1.0 + int(node_id[1:]) * 0.5
                options = self._node_options[node_id] = []
                plan = self.ctx.index.edge_plan(tool)
                readings = self.ctx.readings
                if self.principal is None:
                    extensions = readings.extensions(tool, self.data[node_id], plan)
                else:  # the values the principal may name, kept per principal and initial state
                    who = (self.history[0], self.principal.table, json_key(self.principal.key))
                    extensions = readings.allowed_extensions(
                        tool, self.data[node_id], plan, who, self._allows
                    )
                for planned, vals, single in extensions:
                    options.append(
                        _Option(node, planned.edge, vals, weight, planned.writes, planned.feeds, single)
                    )
            out.extend(options)
        return out

    async def step(self, remaining: int) -> bool:
        """Add one call (possibly with a reasoning node before it). False when nothing worked."""
        options = self._options()
        if not options:
            return False
        must_write = self.writes == 0 and remaining <= 1
        boost = 3.0 if remaining <= 2 else 1.0
        # Each option's weight: its node's, times (a) how likely its call is to work, from this
        # run's outcomes (its edge's success rate, and how its value has done where it has one
        # value), and how much its tool is wanted for coverage (`outcomes.Outcomes.record_task`);
        # (b) for a write that can take a setup's fresh entity not yet acted on, 10 (the entity
        # is there to be acted on); (c) for a write, the least of how often its tool has left
        # each tool this walk wrote with undone (cancel after book, restock after fill). One
        # pass, the factors in that order: the floats are those of one pass per factor.
        outcomes = self.ctx.outcomes
        edge_w, value_w = outcomes.edges.weights.get, outcomes.values.weights.get
        cover_w = outcomes.coverage.get
        fresh_pending = self.fresh is not None and not self.acts_on_fresh()
        fresh = self.fresh.value if self.fresh is not None else None
        done = self.written_tools
        sequel_w = outcomes.sequels.weights.get
        sequel_of: dict[str, float] = {}  # per target tool, the least sequel weight over `done`
        weights = []
        for o in options:
            if o.writes:
                w = o.weight * boost
            elif must_write:
                weights.append(0.0)
                continue
            else:
                w = o.weight
            if not w:
                weights.append(0.0)
                continue
            target = o.edge.target
            w = w * edge_w(o.feeds, 1.0) * value_w(o.value_key, 1.0) * cover_w(target, 1.0)
            if o.writes:
                if fresh_pending and fresh in o.values:
                    w = w * 10.0
                if done and w:
                    least = sequel_of.get(target)
                    if least is None:
                        least = sequel_of[target] = min(sequel_w((t, target), 1.0) for t in done)
                    w = w * least
            weights.append(w)
        if not any(weights):
            return False
        # `rng.choices(options, weights)[0]` for each try, its arithmetic done once per step: the
        # cumulative weights and their total, then one draw and a bisection per try (the same
        # draw, and so the same option, as `choices` makes).
        cum_weights = list(accumulate(weights))
        total = cum_weights[-1] + 0.0
        hi = len(options) - 1
        draw = self.rng.random
        for _ in range(self.cfg.tries_per_step):
            option = options[bisect_right(cum_weights, draw() * total, 0, hi)]
            if await self._try_option(option):
                return True
        return False

    async def _try_option(self, o: _Option) -> bool:
        e = o.edge
        domain = self.ctx.domains[e.target][e.param]
        value: Any
        pre: list[ReasonNode] = []
        if len(o.values) == 1:
            value = o.values[0]
            src = _from_node(e.param, o.node.id, e.key)
        else:
            chosen = None
            if not self.reasoned and self.rng.random() < self.cfg.p_reason:
                chosen = self._select_reasoning(o)
            if chosen is not None:
                reason, value = chosen
                pre.append(reason)
                src = _from_node(e.param, reason.id, e.key)
            else:
                value = self._pick_value(o)
                src = _user(e.param)
        if domain.is_list:
            value = [value]
        target = self.ctx.index.tool(e.target)
        if (
            not target.read_only
            and not pre
            and self.rng.random() < self.cfg.p_branch
            and (branched := await self._try_branch(o, value, src))
        ):
            return branched
        args, sources = self._fill(e.target, {e.param: (value, src)})
        call = Call(name=e.target, arguments=args)
        if self._key(call) in self.done_calls or not self._on_story(call) or self._acts_on_own_insert(call):
            return False
        out = await self._run(call)
        ok, data, diff = out.ok, out.data, out.diff
        self.ctx.outcomes.record_edge(o.feeds, ok and (diff is None or bool(diff)))
        refuse = (
            not ok
            and not target.read_only
            and self.refusals == 0
            and self.rng.random() < self.cfg.p_refusal
            and self.last_kind == "refused"  # an env error is never shipped as an expected refusal
        )
        if not ok and not refuse:
            return False
        if ok and diff is not None and not diff:
            return False  # a write that changed nothing proves nothing
        self._commit_reasoning(pre)
        self._record_call(call, sources, data, diff, refused=refuse, text=out.text)
        return True

    def _pick_value(self, o: _Option) -> Any:
        """One of the option's values, those that have worked for calls like this one likelier."""
        target = o.edge.target
        read_only = self.ctx.index.tool(target).read_only
        weigh = self.ctx.outcomes.value_weight
        return weighted_choice(self.rng, o.values, lambda v: weigh(target, read_only, o.edge.param, v))

    def _commit_reasoning(self, pre: list[ReasonNode]) -> None:
        for r in pre:
            assert r.id == self._new_id(), "reasoning node ids are assigned just before use"
            self.nodes.append(r)
            if r.source:
                self._edge(r.source, r.id, "data", r.field or "")
            self.reasoned = True

    def _select_reasoning(self, o: _Option) -> tuple[ReasonNode, Any] | None:
        """argmax/argmin/filter over a list in the source result that carries the edge's key."""
        e = o.edge
        domain = self.ctx.domains[e.target][e.param]
        kind = (o.node.id, e.key, domain.type, tuple(domain.enum))
        cands = self._reasonings.get(kind)
        if cands is None:  # the candidates depend on the node's result, the key and the domain only
            cands = self._reasonings[kind] = []
            for path, items in R.collections(self.data[o.node.id]):
                if not all(e.key in it for it in items):
                    continue
                for f in R.numeric_fields(items):
                    if f == e.key:
                        continue
                    for op in ("argmax", "argmin"):
                        v = R.extreme(items, f, e.key, op)
                        if v is not None:
                            cands.append((op, path, f, None, v))
                for f in R.text_fields(items):
                    if f == e.key:
                        continue
                    # A value held by one item only selects that item (what `R.filter_select` finds).
                    by_value = {it[f]: it for it in items}
                    for eq in R.unique_matches(items, f):
                        cands.append(("filter", path, f, eq, by_value[eq][e.key]))
            cands[:] = [c for c in cands if accepts(domain, c[4])]
        if not cands:
            return None
        op, path, f, eq, v = self.rng.choice(cands)
        nid = self._new_id()
        ref = self._step_ref(o.node.id)
        if op == "filter":
            text = (
                f"From the list in the result of {ref}, take the item whose {f} is {json.dumps(eq)}; "
                f"use its {e.key}"
            )
        else:
            which = "highest" if op == "argmax" else "lowest"
            text = (
                f"From the list in the result of {ref}, take the item with the {which} {f}; use its {e.key}"
            )
        node = ReasonNode(
            id=nid,
            kind="reason",
            text=text,
            op=op,
            source=o.node.id,
            path=path,
            field=f,
            equals=eq,
            select=e.key,
            value=v,
        )
        return node, v

    async def _try_branch(self, o: _Option, value: Any, src: ArgSource) -> bool:
        """'If <figure> is above/below T then write A else write B': both calls built, one executed."""
        data = self.data[o.node.id]
        figures = self._figures.get(o.node.id)
        if figures is None:
            items = data.items() if isinstance(data, dict) else []
            figures = self._figures[o.node.id] = sorted(k for k, v in items if R.is_number(v))
        source = o.node.call.name
        alts = self._alts.get((source, o.edge.key, o.edge.target))
        if alts is None:
            alts = self._alts[(source, o.edge.key, o.edge.target)] = sorted(
                {
                    e.target
                    for e in self.ctx.index.out_edges(source)
                    if e.key == o.edge.key
                    and e.target != o.edge.target
                    and self._usable(e.target)
                    and not self.ctx.index.tool(e.target).read_only
                }
            )
        if not figures or not alts:
            return False
        fig = self.rng.choice(figures)
        x = data[fig]
        if x <= 0:
            return False
        alt = self.rng.choice(alts)
        alt_edge = next(
            e for e in self.ctx.index.out_edges(o.node.call.name) if e.key == o.edge.key and e.target == alt
        )
        first_args, first_src = self._fill(o.edge.target, {o.edge.param: (value, src)})
        alt_src = src.model_copy(update={"param": alt_edge.param})
        alt_list = self.ctx.domains[alt][alt_edge.param].is_list
        if alt_list and not isinstance(value, list):
            alt_value = [o.values[0]]
        elif not alt_list and isinstance(value, list) and value:
            alt_value = value[0]  # a list parameter's value, for a single-valued one
        else:
            alt_value = value
        second_args, second_src = self._fill(alt, {alt_edge.param: (alt_value, alt_src)})
        then_call = Call(name=o.edge.target, arguments=first_args)
        else_call = Call(name=alt, arguments=second_args)
        take_then = self.rng.random() < 0.5
        comparators: list[Literal[">", "<"]] = [">", "<"]
        comparator = self.rng.choice(comparators)
        above = math.floor(x * 0.8) if x * 0.8 < x else x - 1
        below = math.ceil(x * 1.2) + 1
        want_true = take_then
        threshold = (above if want_true else below) if comparator == ">" else (below if want_true else above)
        if not ((x > threshold) if comparator == ">" else (x < threshold)) == want_true:
            return False
        run, untaken = (then_call, else_call) if take_then else (else_call, then_call)
        if self._key(run) in self.done_calls or not (self._on_story(run) and self._on_story(untaken)):
            return False
        if self._acts_on_own_insert(run) or self._acts_on_own_insert(untaken):
            return False
        # The call not taken must be one that would have worked here (what `verify` checks as
        # `untaken_branch`): tried on a copy of the episode, before the branch is taken.
        if self.ctx.replayer.tried(self.history, self._key(run)) is False:
            return False  # `run` failed here before: `_run` would say so from memory
        key = self._key(untaken)
        works = self.ctx.replayer.tried(self.history, key)
        if works is None:
            snapshot = await self.episode.snapshot()
            works = await self.ctx.replayer.try_instead(
                snapshot, untaken, history=self.history, key=key, before=self._current_tuples
            )
        if not works:
            return False
        out = await self._run(run)
        if not out.ok or not out.diff:
            return False
        bid = self._new_id()
        then_id, else_id = f"n{len(self.nodes) + 1}", f"n{len(self.nodes) + 2}"
        branch = ReasonNode(
            id=bid,
            kind="reason",
            op="branch",
            source=o.node.id,
            path=[fig],
            field=fig,
            comparator=comparator,
            threshold=float(threshold),
            then_node=then_id,
            else_node=else_id,
            value=take_then,
            text=(
                f"If the {fig} in the result of {self._step_ref(o.node.id)} is "
                f"{'greater' if comparator == '>' else 'less'} than {threshold:g}, "
                f"do {self._step_ref(then_id)}; "
                f"otherwise do {self._step_ref(else_id)}"
            ),
        )
        self.nodes.append(branch)
        self._edge(o.node.id, bid, "data", fig)
        self.reasoned = True
        for call, sources, executed in (
            (then_call, first_src, take_then),
            (else_call, second_src, not take_then),
        ):
            node = self._record_call(
                call,
                sources,
                out.data if executed else None,
                out.diff if executed else None,
                executed=executed,
                text=out.text if executed else "",
            )
            self._edge(bid, node.id, "control", "then" if call is then_call else "else")
        return True

    def prune_dead_reads(self) -> int:
        """Drop every read whose result feeds nothing that stays (a later argument, a reasoning
        step, a required output), and renumber the rest; returns how many calls were dropped.

        Writes (run, refused or the untaken side of a branch) and the branches and closing counts
        and sums stay; a pick stays when a kept call takes its value; a read stays when a kept node
        takes data from it. The DAG is in topological order, so one pass from the end decides."""
        feeds: dict[str, list[str]] = {}
        for e in self.edges:
            if e.kind in ("data", "control"):
                feeds.setdefault(e.source, []).append(e.target)
        needed: set[str] = set()
        for node in reversed(self.nodes):
            if node.kind == "call":
                keep = node.write or node.expect_error
            else:
                keep = node.op in ("branch", "count", "sum")
            if keep or any(t in needed for t in feeds.get(node.id, [])):
                needed.add(node.id)
        if len(needed) == len(self.nodes):
            return 0
        dropped = sum(1 for n in self.nodes if n.id not in needed and n.kind == "call" and n.executed)
        new_id = {n.id: f"n{i}" for i, n in enumerate(n for n in self.nodes if n.id in needed)}

        def ref(old: str | None) -> str | None:
            return None if old is None else new_id.get(old, old)

        def steps(text: str) -> str:
            def one(m: re.Match[str]) -> str:
                old = f"n{int(m.group(1)) - 1}"
                return self._step_ref(new_id[old]) if old in new_id else m.group(0)

            return re.sub(r"\bstep (\d+)\b", one, text)

        nodes: list[DagNode] = []
        for n in self.nodes:
            if n.id not in needed:
                continue
            if n.kind == "call":
                args = [
                    a.model_copy(update={"node": ref(a.node)}) if a.source == "node" else a for a in n.args
                ]
                nodes.append(n.model_copy(update={"id": new_id[n.id], "args": args}))
            else:
                nodes.append(
                    n.model_copy(
                        update={
                            "id": new_id[n.id],
                            "source": ref(n.source),
                            "then_node": ref(n.then_node),
                            "else_node": ref(n.else_node),
                            "text": steps(n.text),
                        }
                    )
                )
        self.nodes = nodes
        self._by_id = {n.id: n for n in nodes if n.kind == "call"}
        for n in nodes:
            if n.kind == "call":
                n.text = self._call_text(n)
        self.edges = [
            e.model_copy(update={"source": new_id[e.source], "target": new_id[e.target]})
            for e in self.edges
            if e.source in new_id and e.target in new_id
        ]
        self._edge_keys = {(e.source, e.target, e.kind) for e in self.edges}
        self.data = {new_id[k]: v for k, v in self.data.items() if k in new_id}
        self.texts = {new_id[k]: v for k, v in self.texts.items() if k in new_id}
        self.write_diffs = {new_id[k]: v for k, v in self.write_diffs.items() if k in new_id}
        self.output_labels = [steps(label) for label in self.output_labels]
        self.facts = []
        for n in nodes:
            if n.kind == "call":
                for a in n.args:
                    if a.source == "user":
                        self._add_fact(a.param, n.call.arguments[a.param], n.id)
        self.calls -= dropped
        return dropped

    def _summarise(self) -> None:
        """A closing count or sum over a listed result that the agent must tell the user."""
        # the figure itself is computed for the one chosen
        cands: list[tuple[ReasonOp, str, Any, str, Any, Any]] = []
        for node in self.nodes:
            if node.id not in self.data or node.kind != "call" or node.write:
                continue
            for path, items in R.collections(self.data[node.id]):
                for f in R.numeric_fields(items):
                    cands.append(("sum", node.id, path, f, None, items))
                for f in R.text_fields(items):
                    values = sorted({it[f] for it in items})
                    if 1 < len(values) < len(items):
                        for eq in values:
                            cands.append(("count", node.id, path, f, eq, items))
        if not cands:
            return
        op, source, path, f, eq, items = self.rng.choice(cands)
        value = R.total(items, f) if op == "sum" else R.count_where(items, f, eq)
        ref = self._step_ref(source)
        items_of = f"the items listed in the result of {ref}"
        if op == "sum":
            unit = "to the cent" if isinstance(value, float) else "a whole number"
            label = f"the total {f} of {items_of} ({unit})"
            text = f"Add up the {f} of {items_of} and tell the user the total ({unit})"
        else:
            label = f"how many of {items_of} have {f} {json.dumps(eq)} (a whole number)"
            text = f"Count {items_of} whose {f} is {json.dumps(eq)}; tell the user how many (a whole number)"
        node = ReasonNode(
            id=self._new_id(),
            kind="reason",
            op=op,
            source=source,
            path=path,
            field=f,
            equals=eq,
            value=value,
            text=text,
        )
        self.nodes.append(node)
        self._edge(source, node.id, "data", f)
        self.outputs.append(R.format_number(value))
        self.output_labels.append(label)
        self.reasoned = True


class _RowFinder:
    """The first row whose key columns equal a key's values (`==`): a scan, in C, for one-column
    keys; an index per column set for the others. Given the rows as the tuples a `Mirror` holds
    (aligned with them), a column's values are taken from the tuples, in C."""

    def __init__(self, rows: list[Row], tuples: list[tuple[Any, ...]] | None = None, cols: Any = ()) -> None:
        self.rows = rows
        self.tuples = tuples
        self.at = {c: i for i, c in enumerate(cols)}
        self.columns: dict[str, list[Any]] = {}
        self.indexes: dict[tuple[str, ...], dict[tuple[Any, ...], Row] | None] = {}

    def _column(self, col: str) -> list[Any]:
        values = self.columns.get(col)
        if values is None:
            if self.tuples is not None and col in self.at:
                values = list(map(itemgetter(self.at[col]), self.tuples))
            else:
                values = [r.get(col) for r in self.rows]
            self.columns[col] = values
        return values

    def __call__(self, key: Row) -> Row | None:
        if len(key) == 1:
            ((col, want),) = key.items()
            try:
                return self.rows[self._column(col).index(want)]
            except ValueError:
                return None
        cols = tuple(key)
        if cols not in self.indexes:  # the first row of each key, as the scan would find it
            keys = list(zip(*(self._column(c) for c in cols), strict=True))
            index: dict[tuple[Any, ...], Row] | None
            try:
                index = dict(zip(reversed(keys), reversed(self.rows), strict=True))
            except TypeError:  # an unhashable value: scan instead
                index = None
            self.indexes[cols] = index
        index = self.indexes[cols]
        if index is None:
            return next((r for r in self.rows if all(r.get(c) == v for c, v in key.items())), None)
        try:
            return index.get(tuple(key.values()))
        except TypeError:
            return None


_UNSET = object()

_USER: dict[str, ArgSource] = {}


def _user(param: str) -> ArgSource:
    """`ArgSource(param=param, source="user")`, one per name (sources are never changed in place)."""
    src = _USER.get(param)
    if src is None:
        src = _USER[param] = ArgSource(param=param, source="user")
    return src


_FROM_NODE: dict[tuple[str, str, str], ArgSource] = {}
_FROM_NODE_KEPT = 10_000  # sources kept: far more than one env's walks use


def _from_node(param: str, node: str, key: str) -> ArgSource:
    """`ArgSource(param=param, source="node", node=node, key=key)`, one per triple: walks build the
    same few sources over and over (node ids restart at n0 in every walk), and validating each
    anew was a visible share of a step. Sources are never changed in place, so one object can
    serve every node that takes the same value from the same place."""
    k = (param, node, key)
    src = _FROM_NODE.get(k)
    if src is None:
        if len(_FROM_NODE) >= _FROM_NODE_KEPT:
            _FROM_NODE.clear()
        src = _FROM_NODE[k] = ArgSource(param=param, source="node", node=node, key=key)
    return src


def dag_depth(dag: Dag) -> int:
    """Nodes on the longest path (the DAG's nodes are stored in topological order)."""
    depth: dict[str, int] = {}
    preds: dict[str, list[str]] = {}
    for e in dag.edges:
        preds.setdefault(e.target, []).append(e.source)
    for n in dag.nodes:
        depth[n.id] = 1 + max((depth[p] for p in preds.get(n.id, [])), default=0)
    return max(depth.values(), default=0)


async def build_task(ctx: SynthContext, task_id: str, seed: str, cfg: SynthConfig) -> BuiltTask:
    """Build and execute one task, with what its golden run showed. Raises `BuildFailed` when the
    walk cannot finish."""
    rng = random.Random(seed)
    setup = None
    setup_rng = random.Random(f"{seed}:setup")
    if setup_rng.random() < cfg.p_setup and ctx.setups.tables:
        setup = ctx.setups.fresh_entity(setup_rng)
        if setup is None:
            raise BuildFailed("setup_rejected")
    key = setup_key(setup.diff if setup else {})
    database, initial_state, initial_cents = ctx.states.initial(
        key, setup.diff if setup else {}, database=setup.database if setup else None
    )
    b = Builder(ctx=ctx, rng=rng, cfg=cfg, initial_state=initial_state, history=(key,))
    b.fresh = setup.fresh if setup else None
    ownership = ctx.ownership
    if setup is not None:
        b.principal = ownership.principal_of(key, initial_state, setup.fresh.table, setup.fresh.value)
    if b.principal is None:
        b.principal = ownership.pick(random.Random(f"{seed}:principal"), key, initial_state, steer=cfg.steer)
    target = rng.randint(cfg.min_calls, cfg.max_calls)
    episode = await ctx.replayer.open_episode(database)
    b.episode = episode
    b.conn = scratch_connection(episode)
    b.mirror = ctx.states.mirror(key, initial_state)
    try:
        await b.start()
        stalls = 0
        # A walk's length counts the calls that stay (`live_calls`); reads that feed nothing yet
        # may still, and the walk stops at twice its longest length whatever it counts.
        while b.calls < 2 * cfg.max_calls and (
            (live := b.live_calls()) < target or (b.writes == 0 and b.calls < cfg.max_calls)
        ):
            if not await b.step(target - live):
                stalls += 1
                # A walk that has written is a task already and may try harder to grow; one that
                # could not extend itself before writing seldom writes later (it is discarded).
                if stalls >= (STALLS_AFTER_WRITE if b.writes else STALLS_BEFORE_WRITE):
                    break
        if b.nodes:
            first = b.nodes[0]  # the start call
            assert first.kind == "call"
            ctx.outcomes.record_walk(first.call.name, b.writes > 0)
            if cfg.steer and b.writes == 0:
                ownership.record(b.principal, False)  # a walk that writes counts once judged
        # A walk that is rejected anyway is rejected before the full export it would not use.
        if b.writes == 0:
            raise BuildFailed("no_write")
        if b.calls < cfg.min_calls:
            raise BuildFailed("too_short")
        if b.fresh is not None and not b.acts_on_fresh():
            raise BuildFailed("setup_unused")
        golden = await b.golden_state()
        ctx.replayer.note_golden_db(golden, await episode.snapshot(), b.mirror)
    finally:
        await ctx.replayer.close_episode(episode)
    if rng.random() < cfg.p_summary or not b.reasoned:
        b._summarise()
    b.prune_dead_reads()
    if b.calls < cfg.min_calls:
        raise BuildFailed("too_short")
    if b.calls > cfg.max_calls:  # reads that fed something late made it longer than asked
        raise BuildFailed("too_long")
    dag = Dag(nodes=b.nodes, edges=b.edges, principal=b.principal)
    checkpoints = []
    finders: dict[str, _RowFinder] = {}
    for node in b.nodes:
        diff = b.write_diffs.get(node.id)
        if not diff or node.kind != "call":  # only call nodes write
            continue
        rows = []
        for table, d in diff.items():
            pk = ctx.pks[table]
            keys = [{c: r[c] for c in pk} for r in d.inserted + d.deleted] + [u.key for u in d.updated]
            find = finders.get(table)
            if find is None:
                tuples = b.mirror.tuples_of(table)
                find = finders[table] = _RowFinder(golden[table], tuples, ctx.states.readers[table].cols)
            for row_key in keys:
                rows.append(RowCheck(table=table, key=row_key, row=find(row_key)))
        checkpoints.append(Checkpoint(node=node.id, tool=node.call.name, rows=rows))
    executed = [n for n in b.nodes if n.kind == "call" and n.executed]
    tables = set()
    for n in executed:
        t = ctx.graph.tool(n.call.name)
        tables |= set(t.reads) | set(t.writes)
    created: dict[str, tuple[str, str]] = {}  # what each write made: only that is "the new …"
    for node_id, diff in b.write_diffs.items():
        for table, d in diff.items():
            pk = ctx.pks[table]
            if len(pk) == 1:
                for row in d.inserted:
                    created[_json_key(row[pk[0]])] = (node_id, table)
    # What the user must know to be verified as the env's identity rule asks (their email where
    # the walk gave them only their customer id): facts of the principal's own row, drawn by no rng.
    schemas = {name: spec.input_schema for name, spec in ctx.env.tools.items()}
    calls = [n.call for n in executed]
    facts = b.facts + identity_facts(
        load_policy_rules(ctx.env), schemas, calls, b.principal, initial_state, b.facts
    )
    try:
        scenario = render_scenario(
            ctx.env.name,
            dag,
            facts,
            b.outputs,
            b.data,
            b.output_labels,
            ctx.phrases,
            ctx.references,
            created,
        )
    except VagueReference:
        raise BuildFailed("vague_reference") from None
    golden_hash, golden_cents = ctx.states.hasher.hashes(golden)
    if golden_cents == initial_cents:
        raise BuildFailed("no_change")
    task = Task(
        id=task_id,
        env=ctx.env.name,
        seed=seed,
        dag=dag,
        setup=setup.diff if setup else {},
        scenario=scenario,
        golden_calls=[n.call for n in executed],
        golden_hash=golden_hash,
        golden_cents_hash=golden_cents,
        golden_diff=b.mirror.diff_from_initial(),
        required_outputs=list(b.outputs),
        checkpoints=checkpoints,
        difficulty=Difficulty(
            calls=len(executed),
            writes=sum(1 for n in executed if n.write and not n.expect_error),
            reasoning=sum(1 for n in b.nodes if n.kind == "reason"),
            depth=dag_depth(dag),
            tables=len(tables),
        ),
    )
    run = GoldenRun(
        state=golden,
        texts=tuple(b.texts[n.id] for n in executed),
        after_first_write=b.after_first_write,
    )
    return BuiltTask(task=task, golden=run)
