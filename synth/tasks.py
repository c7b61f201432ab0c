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
from dataclasses import dataclass, field
from typing import Any

from envforge.server import State

from . import reasoning as R
from .context import call_key
from .domains import DomainValues, fillable
from .footprint import parse_result, scalar_pairs
from .models import (
    ArgSource,
    Call,
    Checkpoint,
    Dag,
    DagEdge,
    DagNode,
    Difficulty,
    Fact,
    GraphEdge,
    RowCheck,
    StateDiff,
    Task,
)
from .render import render_scenario
from .statediff import diff_states, state_hashes


@dataclass(frozen=True)
class SynthConfig:
    min_calls: int = 2
    max_calls: int = 7
    p_reason: float = 0.7
    p_branch: float = 0.35
    p_summary: float = 0.4
    p_refusal: float = 0.05
    tries_per_step: int = 8


class BuildFailed(Exception):
    """The walk could not be completed; `reason` is counted in the synthesis report."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _json_key(v: Any) -> str:
    return json.dumps(v, sort_keys=True)


@dataclass
class _Option:
    """A way to extend the DAG: feed `edge.param` of `edge.target` from node `node`'s result."""

    node: DagNode
    edge: GraphEdge
    values: list[Any]


@dataclass
class Builder:
    ctx: Any  # SynthContext (imported lazily to keep the module graph flat)
    rng: random.Random
    cfg: SynthConfig
    initial_state: State
    nodes: list[DagNode] = field(default_factory=list)
    edges: list[DagEdge] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    facts: list[Fact] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    write_diffs: dict[str, StateDiff] = field(default_factory=dict)
    done_calls: set[str] = field(default_factory=set)
    calls: int = 0
    writes: int = 0
    refusals: int = 0
    reasoned: bool = False
    episode_id: str = ""
    state: State = field(default_factory=dict)
    # The episode's state as (initial state, successful write calls...): the key of the call memo.
    history: tuple[Any, ...] = ("",)

    # ------------------------------------------------------------------ helpers
    @property
    def env(self):  # type: ignore[no-untyped-def]
        return self.ctx.env

    def _usable(self, tool: str) -> bool:
        usable = self.ctx._usable.get(tool)
        if usable is None:
            spec = self.env.tools[tool]
            usable = self.ctx._usable[tool] = all(fillable(self.ctx.domains[tool][p]) for p in spec.required)
        return usable

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
        spec = self.env.tools[tool]
        args: dict[str, Any] = {}
        sources: dict[str, ArgSource] = {}
        bindings: dict[str, Any] = {}
        for p, (value, src) in fixed.items():
            args[p], sources[p] = value, src
            base = p[:-1] if isinstance(value, list) and p.endswith("s") else p
            bindings[base] = value[0] if isinstance(value, list) and value else value
            self._bind_row(bindings, base)
        todo = [p for p in spec.parameters if p in spec.required and p not in fixed]
        for p in todo:
            fed = self._from_results(tool, p)
            if fed is not None:
                args[p], sources[p] = fed
                bindings.setdefault(p, fed[0])
        rest = [p for p in todo if p not in args]
        self.rng.shuffle(rest)
        for p in rest:
            args[p] = self._values.pick_bound(
                self.rng, self.ctx.domains[tool][p], bindings, self.ctx.key_names
            )
            sources[p] = ArgSource(param=p, source="user")
        order = [p for p in spec.parameters if p in args]
        return {p: args[p] for p in order}, [sources[p] for p in order]

    def _bind_row(self, bindings: dict[str, Any], column: str) -> None:
        """Bind the key columns of the one row whose primary key `column` equals the bound value."""
        for t in self.env.tables:
            if t.primary_key == (column,):
                row = next(
                    (r for r in self.initial_state.get(t.name, []) if r.get(column) == bindings[column]), None
                )
                for k, v in (row or {}).items():
                    if k in self.ctx.key_names:
                        bindings.setdefault(k, v)

    def _from_results(self, tool: str, param: str) -> tuple[Any, ArgSource] | None:
        """A unique value for `param` in the latest result whose graph edge names it."""
        for node in reversed(self.nodes):
            if node.kind != "call" or not node.executed or node.expect_error or node.id not in self.data:
                continue
            for e in self.ctx.out_edges(node.call.name):
                if e.target != tool or e.param != param or e.evidence != "name":
                    continue
                vals = self._key_values(node.id, e.key)
                if len(vals) == 1:
                    return vals[0], ArgSource(param=param, source="node", node=node.id, key=e.key)
        return None

    def _key_values(self, node_id: str, key: str) -> list[Any]:
        """The distinct values under `key` in a node's result, in JSON-text order (the last seen of equal
        texts). Computed once per (node, key): results never change once recorded, and every step
        asks again for every node and edge."""
        cache: dict[str, dict[str, list[Any]]] = self.__dict__.setdefault("_values_cache", {})
        by_key = cache.get(node_id)
        if by_key is None:
            by_key = cache[node_id] = {}
            texts: dict[str, dict[str, Any]] = {}
            for k, v in scalar_pairs(self.data[node_id]):
                texts.setdefault(k, {})[_json_key(v)] = v
            for k, vals in texts.items():
                by_key[k] = [vals[t] for t in sorted(vals)]
        return by_key.get(key, [])

    @property
    def _values(self) -> DomainValues:
        if not hasattr(self, "_dv"):
            self._dv = self.ctx.domain_values(self.history[0], self.initial_state)
        return self._dv

    # ------------------------------------------------------------------ execution
    async def _run(self, call: Call) -> tuple[bool, Any, StateDiff | None, str]:
        """Execute one call; (ok, parsed result, state diff for writes, text)."""
        res = await self.ctx.call(self.episode_id, self.history, call)
        if res.is_error:
            return False, None, None, res.text
        diff = None
        if not self.env.tools[call.name].read_only:
            self.history = (*self.history, call_key(call))
            tables = self.ctx.write_tables([call.name])
            after = await self.ctx.export_tables(self.episode_id, tables)
            diff = diff_states(self.ctx.pks, {t: self.state[t] for t in tables}, after)
            self.state.update(after)
        return True, parse_result(res.text), diff, res.text

    def _record_call(
        self,
        call: Call,
        sources: list[ArgSource],
        data: Any,
        diff: StateDiff | None,
        *,
        refused: bool = False,
        executed: bool = True,
    ) -> DagNode:
        spec = self.env.tools[call.name]
        node = DagNode(
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
        for s in sources:
            if s.source == "node" and s.node is not None:
                self._edge(s.node, node.id, "data", f"{s.key}→{s.param}")
            elif s.source == "user":
                self._add_fact(s.param, call.arguments[s.param], node.id)
        if executed:
            self.calls += 1
            self.done_calls.add(_json_key(call.model_dump()))
            reads = set(self.ctx.tool(call.name).reads)
            for prev in self.nodes[:-1]:
                if prev.kind == "call" and prev.write and prev.executed and not prev.expect_error:
                    if reads & set(self.ctx.tool(prev.call.name).writes):
                        self._edge(prev.id, node.id, "state", "")
        if data is not None and executed and not refused:
            self.data[node.id] = data
        if diff:
            self.write_diffs[node.id] = diff
            self.writes += 1
        if refused:
            self.refusals += 1
        return node

    def _edge(self, a: str, b: str, kind: str, label: str) -> None:
        if not any(e.source == a and e.target == b and e.kind == kind for e in self.edges):
            self.edges.append(DagEdge(source=a, target=b, kind=kind, label=label))  # type: ignore[arg-type]

    def _call_text(self, node: DagNode) -> str:
        assert node.call is not None
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
        return next(n for n in self.nodes if n.id == node_id)

    # ------------------------------------------------------------------ steps
    async def start(self) -> None:
        graph = self.ctx.graph
        starts = sorted(
            t.name
            for t in graph.tools
            if t.read_only and self._usable(t.name) and t.required and self.ctx.out_edges(t.name)
        )
        if not starts:
            starts = sorted(t.name for t in graph.tools if self._usable(t.name))
        if not starts:
            raise BuildFailed("no_usable_tools")
        tool = self.rng.choice(starts)
        for _ in range(self.cfg.tries_per_step):
            args, sources = self._fill(tool, {})
            call = Call(name=tool, arguments=args)
            ok, data, diff, _ = await self._run(call)
            if ok and (diff is None or diff):
                self._record_call(call, sources, data, diff)
                return
        raise BuildFailed("start_failed")

    def _options(self) -> list[_Option]:
        out = []
        for node in self.nodes:
            if node.id not in self.data:
                continue
            for e in self.ctx.out_edges(node.call.name):  # type: ignore[union-attr]
                if not self._usable(e.target):
                    continue
                vals = self._key_values(node.id, e.key)
                if vals:
                    out.append(_Option(node, e, list(vals)))
        return out

    async def step(self, remaining: int) -> bool:
        """Add one call (possibly with a reasoning node before it). False when nothing worked."""
        options = self._options()
        if not options:
            return False
        must_write = self.writes == 0 and remaining <= 1
        weights = []
        for o in options:
            target = self.ctx.tool(o.edge.target)
            w = 1.0 + int(o.node.id[1:]) * 0.5
            if not target.read_only:
                w *= 3.0 if remaining <= 2 else 1.0
            elif must_write:
                w = 0.0
            weights.append(w)
        if not any(weights):
            return False
        for _ in range(self.cfg.tries_per_step):
            option = self.rng.choices(options, weights=weights)[0]
            if await self._try_option(option):
                return True
        return False

    async def _try_option(self, o: _Option) -> bool:
        e = o.edge
        domain = self.ctx.domains[e.target][e.param]
        value: Any
        pre: list[DagNode] = []
        if len(o.values) == 1:
            value = o.values[0]
            src = ArgSource(param=e.param, source="node", node=o.node.id, key=e.key)
        else:
            chosen = None
            if not self.reasoned and self.rng.random() < self.cfg.p_reason:
                chosen = self._select_reasoning(o)
            if chosen is not None:
                reason, value = chosen
                pre.append(reason)
                src = ArgSource(param=e.param, source="node", node=reason.id, key=e.key)
            else:
                value = self.rng.choice(o.values)
                src = ArgSource(param=e.param, source="user")
        if domain.is_list:
            value = [value]
        target = self.ctx.tool(e.target)
        if (
            not target.read_only
            and not pre
            and self.rng.random() < self.cfg.p_branch
            and (branched := await self._try_branch(o, value, src))
        ):
            return branched
        args, sources = self._fill(e.target, {e.param: (value, src)})
        call = Call(name=e.target, arguments=args)
        if _json_key(call.model_dump()) in self.done_calls:
            return False
        ok, data, diff, _ = await self._run(call)
        refuse = (
            not ok and not target.read_only and self.refusals == 0 and self.rng.random() < self.cfg.p_refusal
        )
        if not ok and not refuse:
            return False
        if ok and diff is not None and not diff:
            return False  # a write that changed nothing proves nothing
        self._commit_reasoning(pre)
        self._record_call(call, sources, data, diff, refused=refuse)
        return True

    def _commit_reasoning(self, pre: list[DagNode]) -> None:
        for r in pre:
            assert r.id == self._new_id(), "reasoning node ids are assigned just before use"
            self.nodes.append(r)
            if r.source:
                self._edge(r.source, r.id, "data", r.field or "")
            self.reasoned = True

    def _select_reasoning(self, o: _Option) -> tuple[DagNode, Any] | None:
        """argmax/argmin/filter over a list in the source result that carries the edge's key."""
        e = o.edge
        cands = []
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
                for eq in R.unique_matches(items, f):
                    cands.append(("filter", path, f, eq, R.filter_select(items, f, eq, e.key)))
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
        node = DagNode(
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
        figures = sorted(k for k, v in (data.items() if isinstance(data, dict) else []) if R.is_number(v))
        alts = sorted(
            {
                e.target
                for e in self.ctx.out_edges(o.node.call.name)  # type: ignore[union-attr]
                if e.key == o.edge.key
                and e.target != o.edge.target
                and self._usable(e.target)
                and not self.ctx.tool(e.target).read_only
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
            e
            for e in self.ctx.out_edges(o.node.call.name)  # type: ignore[union-attr]
            if e.key == o.edge.key and e.target == alt
        )
        first_args, first_src = self._fill(o.edge.target, {o.edge.param: (value, src)})
        alt_src = src.model_copy(update={"param": alt_edge.param})
        alt_value = (
            [o.values[0]]
            if self.ctx.domains[alt][alt_edge.param].is_list and not isinstance(value, list)
            else value
        )
        second_args, second_src = self._fill(alt, {alt_edge.param: (alt_value, alt_src)})
        then_call = Call(name=o.edge.target, arguments=first_args)
        else_call = Call(name=alt, arguments=second_args)
        take_then = self.rng.random() < 0.5
        comparator = self.rng.choice([">", "<"])
        above = math.floor(x * 0.8) if x * 0.8 < x else x - 1
        below = math.ceil(x * 1.2) + 1
        want_true = take_then
        threshold = (above if want_true else below) if comparator == ">" else (below if want_true else above)
        if not ((x > threshold) if comparator == ">" else (x < threshold)) == want_true:
            return False
        run = then_call if take_then else else_call
        if _json_key(run.model_dump()) in self.done_calls:
            return False
        ok, result, diff, _ = await self._run(run)
        if not ok or not diff:
            return False
        bid = self._new_id()
        then_id, else_id = f"n{len(self.nodes) + 1}", f"n{len(self.nodes) + 2}"
        branch = DagNode(
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
                call, sources, result if executed else None, diff if executed else None, executed=executed
            )
            self._edge(bid, node.id, "control", "then" if call is then_call else "else")
        return True

    def _summarise(self) -> None:
        """A closing count or sum over a listed result that the agent must tell the user."""
        cands = []
        for node in self.nodes:
            if node.id not in self.data or node.write:
                continue
            for path, items in R.collections(self.data[node.id]):
                for f in R.numeric_fields(items):
                    cands.append(("sum", node.id, path, f, None, R.total(items, f)))
                for f in R.text_fields(items):
                    values = sorted({it[f] for it in items})
                    if 1 < len(values) < len(items):
                        for eq in values:
                            cands.append(("count", node.id, path, f, eq, R.count_where(items, f, eq)))
        if not cands:
            return
        op, source, path, f, eq, value = self.rng.choice(cands)
        ref = self._step_ref(source)
        if op == "sum":
            text = f"Add up the {f} of the items listed in the result of {ref} and tell the user the total"
        else:
            text = (
                f"Count the items listed in the result of {ref} whose {f} is {json.dumps(eq)}; tell the user"
            )
        node = DagNode(
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
        self.reasoned = True


def dag_depth(dag: Dag) -> int:
    """Nodes on the longest path (the DAG's nodes are stored in topological order)."""
    depth: dict[str, int] = {}
    preds: dict[str, list[str]] = {}
    for e in dag.edges:
        preds.setdefault(e.target, []).append(e.source)
    for n in dag.nodes:
        depth[n.id] = 1 + max((depth[p] for p in preds.get(n.id, [])), default=0)
    return max(depth.values(), default=0)


async def build_task(ctx: Any, task_id: str, seed: str, cfg: SynthConfig) -> tuple[Task, State]:
    """Build and execute one task: (task, golden state). Raises `BuildFailed` when the walk cannot finish."""
    rng = random.Random(seed)
    database, initial_state, initial_cents = ctx.initial("", {})
    b = Builder(ctx=ctx, rng=rng, cfg=cfg, initial_state=initial_state, state=dict(initial_state))
    target = rng.randint(cfg.min_calls, cfg.max_calls)
    episode = await ctx.fleet.create_episode(ctx.env.name, database=database)
    b.episode_id = episode.id
    try:
        await b.start()
        stalls = 0
        while b.calls < target or (b.writes == 0 and b.calls < cfg.max_calls):
            if not await b.step(target - b.calls):
                stalls += 1
                if stalls >= 3:
                    break
        # A walk that is rejected anyway is rejected before the full export it would not use.
        if b.writes == 0:
            raise BuildFailed("no_write")
        if b.calls < cfg.min_calls:
            raise BuildFailed("too_short")
        golden = await ctx.export_tables(episode.id, None)
        if hasattr(ctx, "note_golden_db"):
            ctx.note_golden_db(golden, await ctx.fleet.store.get(episode.id).snapshot())
    finally:
        await ctx.fleet.close_episode(episode.id)
    if rng.random() < cfg.p_summary or not b.reasoned:
        b._summarise()
    dag = Dag(nodes=b.nodes, edges=b.edges)
    checkpoints = []
    for node in b.nodes:
        diff = b.write_diffs.get(node.id)
        if not diff:
            continue
        rows = []
        for table, d in diff.items():
            pk = ctx.pks[table]
            keys = [{c: r[c] for c in pk} for r in d.inserted + d.deleted] + [u.key for u in d.updated]
            for key in keys:
                final = next((r for r in golden[table] if all(r.get(c) == v for c, v in key.items())), None)
                rows.append(RowCheck(table=table, key=key, row=final))
        checkpoints.append(Checkpoint(node=node.id, tool=node.call.name, rows=rows))  # type: ignore[union-attr]
    executed = [n for n in b.nodes if n.kind == "call" and n.executed]
    tables = set()
    for n in executed:
        t = ctx.graph.tool(n.call.name)  # type: ignore[union-attr]
        tables |= set(t.reads) | set(t.writes)
    scenario = render_scenario(ctx.env.name, dag, b.facts, b.outputs, b.data)
    golden_hash, golden_cents = state_hashes(golden)
    if golden_cents == initial_cents:
        raise BuildFailed("no_change")
    task = Task(
        id=task_id,
        env=ctx.env.name,
        seed=seed,
        dag=dag,
        scenario=scenario,
        golden_calls=[n.call for n in executed],  # type: ignore[misc]
        golden_hash=golden_hash,
        golden_cents_hash=golden_cents,
        golden_diff=diff_states(ctx.pks, initial_state, golden),
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
    return task, golden
