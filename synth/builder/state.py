"""The DAG a walk is building, and the episode its calls run in.

`Builder` holds one task's build: the nodes and edges so far, the facts the user is given, each
call's result and diff, and what the walk's writes did (`writelog.py`: so that a later write
never undoes an earlier one). Its methods fill a call's arguments (earlier results first, then
values from the principal's view), run a call (from the call memo where it has run before) and
record it. How a walk grows is `walking.py`; its reasoning steps and branches `branching.py`;
the reads pruned at the end `pruning.py`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from envforge.server import Environment, Episode, ScratchConnection, State

from ..graph.domains import DomainValues, accepts
from ..task.models import ArgSource, Call, CallNode, DagEdge, DagNode, Fact, GraphEdge, Principal, StateDiff
from ..task.statediff import json_key
from ..walk.context import SynthContext
from ..walk.mirror import Mirror
from ..walk.replayer import call_key
from ..walk.setup import Fresh
from .config import BuildFailed, SynthConfig
from .writelog import WriteLog


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
class Option:
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
    """One task's build in progress: the DAG so far and the episode its golden calls run in.

    `walking.start` and `walking.step` grow it, `branching` adds its reasoning nodes,
    `pruning.prune_dead_reads` trims it, and `tasks.build_task` turns it into a `Task`."""

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
    mirror: Mirror = field(init=False)  # the walk's state as the golden run leaves it (set by `build_task`)
    stale: set[str] = field(default_factory=set)
    fresh: Fresh | None = None  # the entity a setup added, for the walk to act on
    # Whose story the task is (`principal.py`): every call stays on its rows and public ones.
    principal: Principal | None = None
    # Who the user is (`roles.py`): the principal's role or staff's; a write its role may not ask
    # for is never called (a patient does not restock). None: any write.
    role: str | None = None
    aim: str | None = None  # the write tool the walk leans towards (`mix.py`)
    # What the walk's writes did so far, to keep a later write from undoing an earlier one.
    write_log: WriteLog = field(default_factory=WriteLog)
    written_tools: list[str] = field(default_factory=list)  # the tools of those writes, each once
    fed: set[str] = field(default_factory=set)  # nodes whose result feeds a later node
    _last_key: tuple[Call, str] | None = None
    by_id: dict[str, CallNode] = field(default_factory=dict)
    edge_keys: set[tuple[str, str, str]] = field(default_factory=set)  # (source, target, kind) of `edges`
    # Per-walk memos of the steps: each node's options (`walking`), and a node's numeric keys,
    # a branch's alternatives and a pick's candidates (`branching`).
    node_options: dict[str, list[Option]] = field(default_factory=dict)
    # `_from_results` answers
    _fed: dict[tuple[str, str], tuple[Any, ArgSource] | None] = field(default_factory=dict)
    figures: dict[str, list[str]] = field(default_factory=dict)  # numeric keys of a node's result
    alts: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)  # branch alternatives
    reasonings: dict[tuple[Any, ...], list[tuple[Any, ...]]] = field(default_factory=dict)
    # The episode's state as (initial state, successful write calls...): the key of the call memo.
    history: tuple[Any, ...] = ("",)
    # Each executed call node's result text (`GoldenRun.texts`).
    texts: dict[str, str] = field(default_factory=dict)
    # The state right after the first successful write (`GoldenRun.after_first_write`), taken
    # when a second write is about to run; None until then, or when the mirror did not hold it whole.
    after_first_write: State | None = None
    _first_write_taken: bool = False
    # The principal and `Ownership.checker` for it on the initial state (`allows`).
    _check: tuple[Principal, Callable[[Any, Any], bool]] | None = None

    # ------------------------------------------------------------------ helpers
    @property
    def env(self) -> Environment:
        return self.ctx.env

    def usable(self, tool: str) -> bool:
        return self.ctx.index.usable(tool)

    def key(self, call: Call) -> str:
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

    def new_id(self) -> str:
        return f"n{len(self.nodes)}"

    def step_ref(self, node_id: str) -> str:
        return f"step {int(node_id[1:]) + 1}"

    def add_fact(self, name: str, value: Any, node_id: str) -> None:
        same = [f for f in self.facts if f.name.split(" (")[0] == name]
        if any(_json_key(f.value) == _json_key(value) for f in same):
            return
        label = f"{name} ({self.step_ref(node_id)})" if same else name
        self.facts.append(Fact(name=label, value=value))

    def fill(
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
            sources[p] = from_user(p)
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
            node = self.by_id[node_id]
            for key in self.ctx.index.name_keys(node.call.name, tool, param):
                vals = self._key_values(node_id, key)
                if len(vals) == 1 and accepts(domain, vals[0]) and self.allows(tool, param, vals[0]):
                    value = [vals[0]] if domain.is_list else vals[0]
                    return value, from_node(param, node_id, key)
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

    def allows(self, tool: str, param: str, value: Any) -> bool:
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

    def on_story(self, call: Call) -> bool:
        """Whether the user's role may ask for `call` and every argument of it stays on the
        principal's rows and public ones."""
        if self.role is not None and not self.ctx.roles.may_call(self.role, call.name):
            return False
        return self.principal is None or all(self.allows(call.name, p, v) for p, v in call.arguments.items())

    # ------------------------------------------------------------------ execution
    async def run(self, call: Call) -> CallOutcome:
        """Execute one call (or answer it from the call memo)."""
        key = self.key(call)
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
                ownership = self.ctx.ownership
                if ownership.strangers_written(self.history[0], self.initial_state, self.principal, diff):
                    # Its arguments were all the principal's, but the tool wrote someone else's row.
                    self.ctx.outcomes.record(call.name, read_only, call.arguments, False)
                    raise BuildFailed("write_off_story")
            # `mirror.state` is the golden state at the end, without a full export: a table is
            # current if it was re-read after the last call that changed it. A call changes only
            # tables its statements were authorized to write, so those not re-read here are
            # stale until they are (at the end, if not before).
            self.stale |= written
            self.stale.difference_update(tables)
        # A write that changed nothing is of no use to a walk: it counts as a failure.
        self.ctx.outcomes.record(call.name, read_only, call.arguments, diff is None or bool(diff))
        return CallOutcome(ok=True, data=self.ctx.replayer.parsed(res), diff=diff, text=res.text)

    def current_tuples(self, table: str) -> list[tuple[Any, ...]] | None:
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

    def record_call(
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
            id=self.new_id(),
            kind="call",
            text="",
            call=call,
            write=not spec.read_only,
            executed=executed,
            expect_error=refused,
            args=sources,
        )
        node.text = self.call_text(node)
        self.nodes.append(node)
        self.by_id[node.id] = node
        for s in sources:
            if s.source == "node" and s.node is not None:
                self.edge(s.node, node.id, "data", f"{s.key}→{s.param}")
            elif s.source == "user":
                self.add_fact(s.param, call.arguments[s.param], node.id)
        if executed:
            self.calls += 1
            self.texts[node.id] = text
            self.done_calls.add(self.key(call))
            reads = set(self.ctx.index.tool(call.name).reads)
            for prev in self.nodes[:-1]:
                if prev.kind == "call" and prev.write and prev.executed and not prev.expect_error:
                    if reads & set(self.ctx.index.tool(prev.call.name).writes):
                        self.edge(prev.id, node.id, "state", "")
        if data is not None and executed and not refused:
            self.data[node.id] = data
            self._fed.clear()
        if diff:
            self.write_diffs[node.id] = diff
            self.writes += 1
            self.write_log.note(diff, self.ctx.pks)
            if call.name not in self.written_tools:
                self.written_tools.append(call.name)
        if refused:
            self.refusals += 1
        return node

    def undoes(self, diff: StateDiff) -> bool:
        """Whether a write's diff undoes what an earlier write of the walk did (`WriteLog.undoes`)."""
        return self.write_log.undoes(diff, self.ctx.pks)

    def acts_on_own_insert(self, call: Call) -> bool:
        """Whether a write call names a row an earlier write of the walk inserted (it would undo or
        rework it: cancel the booking just made)."""
        if not self.write_log.inserted_keys or self.ctx.index.tool(call.name).read_only:
            return False
        return self.write_log.names_own_insert(call)

    def edge(self, a: str, b: str, kind: str, label: str) -> None:
        if (a, b, kind) not in self.edge_keys:
            self.edge_keys.add((a, b, kind))
            self.edges.append(DagEdge(source=a, target=b, kind=kind, label=label))
            if kind == "data":
                self.fed.add(a)

    def live_calls(self) -> int:
        """The executed calls that will stay: writes, refusals and the reads that feed something so
        far (a read that feeds nothing is pruned at the end, so it does not count toward a
        walk's length)."""
        dead = sum(1 for n in self.by_id.values() if n.executed and not n.write and n.id not in self.fed)
        return self.calls - dead

    def call_text(self, node: CallNode) -> str:
        spec = self.env.tools[node.call.name]
        desc = spec.description.strip().split("\n")[0].rstrip(".")
        parts = []
        for s in node.args:
            value = node.call.arguments[s.param]
            if s.source == "node" and s.node is not None:
                ref = self.nodes_by_id(s.node)
                where = (
                    "the result above" if ref.kind == "reason" else f"the result of {self.step_ref(s.node)}"
                )
                parts.append(f"{s.param}: the {s.key} from {where}")
            else:
                parts.append(f"{s.param}: {json.dumps(value, ensure_ascii=False)}")
        return f"{desc} ({'; '.join(parts)})" if parts else desc

    def nodes_by_id(self, node_id: str) -> DagNode:
        node = self.by_id.get(node_id)  # every call node is there; reasoning nodes are looked for
        if node is not None:
            return node
        return next(n for n in self.nodes if n.id == node_id)

    def acts_on_fresh(self) -> bool:
        """Whether a successful write call takes the fresh entity's key (the setup is then used)."""
        value = self.fresh.value if self.fresh else None
        for n in self.nodes:
            if n.kind == "call" and n.write and n.executed and not n.expect_error and n.call is not None:
                for v in n.call.arguments.values():
                    if v == value or (isinstance(v, list) and value in v):
                        return True
        return False


_USER: dict[str, ArgSource] = {}


def from_user(param: str) -> ArgSource:
    """`ArgSource(param=param, source="user")`, one per name (sources are never changed in place)."""
    src = _USER.get(param)
    if src is None:
        src = _USER[param] = ArgSource(param=param, source="user")
    return src


_FROM_NODE: dict[tuple[str, str, str], ArgSource] = {}
_FROM_NODE_KEPT = 10_000  # sources kept: far more than one env's walks use


def from_node(param: str, node: str, key: str) -> ArgSource:
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
