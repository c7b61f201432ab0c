"""How a walk grows: its start call, then one step at a time an edge of the tool graph from a node
already in the DAG, drawn by weights learned from the run's outcomes, with a reasoning node or a
branch (`branching.py`) where a list offers several values.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Any

from ..graph.domains import weighted_choice
from ..task.models import ArgSource, Call, ReasonNode
from ..task.statediff import json_key
from .branching import commit_reasoning, select_reasoning, try_branch
from .config import BuildFailed
from .mix import AIM_BOOST
from .state import Builder, Option, from_node, from_user

# Share of walks (with a principal and no fresh entity) that start from a tool taking the
# principal's key.
P_PRINCIPAL_START = 0.5


async def start(b: Builder) -> None:
    """The walk's first call: a read tool that feeds others (the principal's own, or one taking a
    setup's fresh entity, where there is one), with up to `tries_per_step` tries."""
    graph = b.ctx.graph
    starts = sorted(
        t.name
        for t in graph.tools
        if t.read_only and b.usable(t.name) and t.required and b.ctx.index.out_edges(t.name)
    )
    if not starts:
        starts = sorted(t.name for t in graph.tools if b.usable(t.name))
    if not starts:
        raise BuildFailed("no_usable_tools")
    fixed: dict[str, tuple[Any, ArgSource]] = {}
    own: list[str] = []
    aimed = _aimed_starts(b, starts)
    if aimed:  # a setup's fresh entity: the walk starts from it
        tool, param = b.rng.choice(aimed)
        assert b.fresh is not None  # aimed starts exist only for a setup's fresh entity
        value = b.fresh.value
        fixed = {param: ([value] if b.ctx.domains[tool][param].is_list else value, from_user(param))}
    else:
        # The story starts from its principal, half the time, where a tool takes the
        # principal's key: that call works (the principal exists) and leads to what the
        # principal owns; the other half keeps the starts varied.
        own = _principal_starts(b, starts) if b.rng.random() < P_PRINCIPAL_START else []
        tool = weighted_choice(b.rng, own or starts, b.ctx.outcomes.starts.weight)
    failed: set[str] = set()
    dropped: set[str] = set()
    for _ in range(b.cfg.tries_per_step):
        args, sources = b.fill(tool, fixed)
        call = Call(name=tool, arguments=args)
        key = b.key(call)
        if key in failed or not b.on_story(call):
            # The principal's view offers this tool nothing new: another start tool may.
            dropped.add(tool)
            rest = [t for t in (own or starts) if t not in dropped] or [t for t in starts if t not in dropped]
            if fixed or not rest:
                continue
            tool = weighted_choice(b.rng, rest, b.ctx.outcomes.starts.weight)
            continue
        out = await b.run(call)
        if out.ok and (out.diff is None or out.diff):
            b.record_call(call, sources, out.data, out.diff, text=out.text)
            return
        failed.add(key)
    raise BuildFailed("start_failed")


def _principal_starts(b: Builder, starts: list[str]) -> list[str]:
    """The start tools with a required parameter that takes the principal's key."""
    if b.principal is None:
        return []
    ((column, _),) = b.principal.key.items()
    ref = f"{b.principal.table}.{column}"
    return [t for t in starts if any(ref in b.ctx.domains[t][p].columns for p in b.env.tools[t].required)]


def _aimed_starts(b: Builder, starts: list[str]) -> list[tuple[str, str]]:
    """(tool, parameter) pairs that take the fresh entity's key: the start tools first, else
    any usable tool (none without a fresh entity)."""
    if b.fresh is None:
        return []
    ref = f"{b.fresh.table}.{b.fresh.column}"
    for tools in (starts, sorted(t.name for t in b.ctx.graph.tools if b.usable(t.name))):
        aimed = [
            (tool, p)
            for tool in tools
            for p in sorted(b.env.tools[tool].required)
            if ref in b.ctx.domains[tool][p].columns
        ]
        if aimed:
            return aimed
    return []


def _options(b: Builder) -> list[Option]:
    """Every way to extend the DAG, in node order. A node's options never change once it has
    a result (its edges and values are fixed), so they are listed once per node."""
    out = []
    for node_id in b.data:
        options = b.node_options.get(node_id)
        if options is None:
            node = b.by_id[node_id]
            tool = node.call.name
            weight = 1.0 + int(node_id[1:]) * 0.5
            options = b.node_options[node_id] = []
            plan = b.ctx.index.edge_plan(tool)
            readings = b.ctx.readings
            if b.principal is None:
                extensions = readings.extensions(tool, b.data[node_id], plan)
            else:  # the values the principal may name, kept per principal and initial state
                who = (b.history[0], b.principal.table, json_key(b.principal.key))
                extensions = readings.allowed_extensions(tool, b.data[node_id], plan, who, b.allows)
            for planned, vals, single in extensions:
                options.append(
                    Option(node, planned.edge, vals, weight, planned.writes, planned.feeds, single)
                )
        out.extend(options)
    return out


async def step(b: Builder, remaining: int) -> bool:
    """Add one call (possibly with a reasoning node before it). False when nothing worked."""
    options = _options(b)
    if not options:
        return False
    must_write = b.writes == 0 and remaining <= 1
    boost = 3.0 if remaining <= 2 else 1.0
    # Each option's weight: its node's, times (a) how likely its call is to work, from this
    # run's outcomes (its edge's success rate, and how its value has done where it has one
    # value), and how much its tool is wanted for coverage (`outcomes.Outcomes.record_task`);
    # (b) for a write that can take a setup's fresh entity not yet acted on, 10 (the entity
    # is there to be acted on); (c) for a write, the least of how often its tool has left
    # each tool this walk wrote with undone (cancel after book, restock after fill); (d) for the
    # write the walk aims at (`mix.py`), `AIM_BOOST`; a write the user's role may not ask for
    # (`roles.py`) weighs 0. One
    # pass, the factors in that order: the floats are those of one pass per factor.
    outcomes = b.ctx.outcomes
    edge_w, value_w = outcomes.edges.weights.get, outcomes.values.weights.get
    cover_w = outcomes.coverage.get
    fresh_pending = b.fresh is not None and not b.acts_on_fresh()
    fresh = b.fresh.value if b.fresh is not None else None
    done = b.written_tools
    sequel_w = outcomes.sequels.weights.get
    sequel_of: dict[str, float] = {}  # per target tool, the least sequel weight over `done`
    role, may_call, aim = b.role, b.ctx.roles.may_call, b.aim
    weights = []
    for o in options:
        if o.writes:
            if role is not None and not may_call(role, o.edge.target):
                weights.append(0.0)  # a write the user's role may not ask for
                continue
            w = o.weight * boost * (AIM_BOOST if o.edge.target == aim else 1.0)
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
    draw = b.rng.random
    for _ in range(b.cfg.tries_per_step):
        option = options[bisect_right(cum_weights, draw() * total, 0, hi)]
        if await _try_option(b, option):
            return True
    return False


async def _try_option(b: Builder, o: Option) -> bool:
    e = o.edge
    domain = b.ctx.domains[e.target][e.param]
    value: Any
    pre: list[ReasonNode] = []
    if len(o.values) == 1:
        value = o.values[0]
        src = from_node(e.param, o.node.id, e.key)
    else:
        chosen = None
        if not b.reasoned and b.rng.random() < b.cfg.p_reason:
            chosen = select_reasoning(b, o)
        if chosen is not None:
            reason, value = chosen
            pre.append(reason)
            src = from_node(e.param, reason.id, e.key)
        else:
            value = _pick_value(b, o)
            src = from_user(e.param)
    if domain.is_list:
        value = [value]
    target = b.ctx.index.tool(e.target)
    if (
        not target.read_only
        and not pre
        and b.rng.random() < b.cfg.p_branch
        and (branched := await try_branch(b, o, value, src))
    ):
        return branched
    args, sources = b.fill(e.target, {e.param: (value, src)})
    call = Call(name=e.target, arguments=args)
    if b.key(call) in b.done_calls or not b.on_story(call) or b.acts_on_own_insert(call):
        return False
    out = await b.run(call)
    ok, data, diff = out.ok, out.data, out.diff
    b.ctx.outcomes.record_edge(o.feeds, ok and (diff is None or bool(diff)))
    refuse = (
        not ok
        and not target.read_only
        and b.refusals == 0
        and b.rng.random() < b.cfg.p_refusal
        and b.last_kind == "refused"  # an env error is never shipped as an expected refusal
    )
    if not ok and not refuse:
        return False
    if ok and diff is not None and not diff:
        return False  # a write that changed nothing proves nothing
    commit_reasoning(b, pre)
    b.record_call(call, sources, data, diff, refused=refuse, text=out.text)
    return True


def _pick_value(b: Builder, o: Option) -> Any:
    """One of the option's values, those that have worked for calls like this one likelier."""
    target = o.edge.target
    read_only = b.ctx.index.tool(target).read_only
    weigh = b.ctx.outcomes.value_weight
    return weighted_choice(b.rng, o.values, lambda v: weigh(target, read_only, o.edge.param, v))
