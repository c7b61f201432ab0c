"""Reasoning steps of a walk: picks (argmax/argmin/filter over a listed result), branches ("if
the figure is above T then write A, else write B": both calls built, one run) and a closing count
or sum the user must be told. Each draws from the builder's rng in a fixed order: the same seed
builds the same task.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from ..graph.domains import accepts
from ..task.models import ArgSource, Call, ReasonNode, ReasonOp
from . import reasoning as R
from .state import Builder, Option


def commit_reasoning(b: Builder, pre: list[ReasonNode]) -> None:
    for r in pre:
        assert r.id == b.new_id(), "reasoning node ids are assigned just before use"
        b.nodes.append(r)
        if r.source:
            b.edge(r.source, r.id, "data", r.field or "")
        b.reasoned = True


def select_reasoning(b: Builder, o: Option) -> tuple[ReasonNode, Any] | None:
    """argmax/argmin/filter over a list in the source result that carries the edge's key."""
    e = o.edge
    domain = b.ctx.domains[e.target][e.param]
    kind = (o.node.id, e.key, domain.type, tuple(domain.enum))
    cands = b.reasonings.get(kind)
    if cands is None:  # the candidates depend on the node's result, the key and the domain only
        cands = b.reasonings[kind] = []
        for path, items in R.collections(b.data[o.node.id]):
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
    op, path, f, eq, v = b.rng.choice(cands)
    nid = b.new_id()
    ref = b.step_ref(o.node.id)
    if op == "filter":
        text = (
            f"From the list in the result of {ref}, take the item whose {f} is {json.dumps(eq)}; "
            f"use its {e.key}"
        )
    else:
        which = "highest" if op == "argmax" else "lowest"
        text = f"From the list in the result of {ref}, take the item with the {which} {f}; use its {e.key}"
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


async def try_branch(b: Builder, o: Option, value: Any, src: ArgSource) -> bool:
    """'If <figure> is above/below T then write A else write B': both calls built, one executed."""
    data = b.data[o.node.id]
    figures = b.figures.get(o.node.id)
    if figures is None:
        items = data.items() if isinstance(data, dict) else []
        figures = b.figures[o.node.id] = sorted(k for k, v in items if R.is_number(v))
    source = o.node.call.name
    alts = b.alts.get((source, o.edge.key, o.edge.target))
    if alts is None:
        alts = b.alts[(source, o.edge.key, o.edge.target)] = sorted(
            {
                e.target
                for e in b.ctx.index.out_edges(source)
                if e.key == o.edge.key
                and e.target != o.edge.target
                and b.usable(e.target)
                and not b.ctx.index.tool(e.target).read_only
                and (b.role is None or b.ctx.roles.may_call(b.role, e.target))  # the user may ask
            }
        )
    if not figures or not alts:
        return False
    fig = b.rng.choice(figures)
    x = data[fig]
    if x <= 0:
        return False
    alt = b.rng.choice(alts)
    alt_edge = next(
        e for e in b.ctx.index.out_edges(o.node.call.name) if e.key == o.edge.key and e.target == alt
    )
    first_args, first_src = b.fill(o.edge.target, {o.edge.param: (value, src)})
    alt_src = src.model_copy(update={"param": alt_edge.param})
    alt_list = b.ctx.domains[alt][alt_edge.param].is_list
    if alt_list and not isinstance(value, list):
        alt_value = [o.values[0]]
    elif not alt_list and isinstance(value, list) and value:
        alt_value = value[0]  # a list parameter's value, for a single-valued one
    else:
        alt_value = value
    second_args, second_src = b.fill(alt, {alt_edge.param: (alt_value, alt_src)})
    then_call = Call(name=o.edge.target, arguments=first_args)
    else_call = Call(name=alt, arguments=second_args)
    take_then = b.rng.random() < 0.5
    comparators: list[Literal[">", "<"]] = [">", "<"]
    comparator = b.rng.choice(comparators)
    above = math.floor(x * 0.8) if x * 0.8 < x else x - 1
    below = math.ceil(x * 1.2) + 1
    want_true = take_then
    threshold = (above if want_true else below) if comparator == ">" else (below if want_true else above)
    if not ((x > threshold) if comparator == ">" else (x < threshold)) == want_true:
        return False
    run, untaken = (then_call, else_call) if take_then else (else_call, then_call)
    if b.key(run) in b.done_calls or not (b.on_story(run) and b.on_story(untaken)):
        return False
    if b.acts_on_own_insert(run) or b.acts_on_own_insert(untaken):
        return False
    # The call not taken must be one that would have worked here (what `verify` checks as
    # `untaken_branch`): tried on a copy of the episode, before the branch is taken.
    if b.ctx.replayer.tried(b.history, b.key(run)) is False:
        return False  # `run` failed here before: `_run` would say so from memory
    key = b.key(untaken)
    works = b.ctx.replayer.tried(b.history, key)
    if works is None:
        snapshot = await b.episode.snapshot()
        works = await b.ctx.replayer.try_instead(
            snapshot, untaken, history=b.history, key=key, before=b.current_tuples
        )
    if not works:
        return False
    out = await b.run(run)
    if not out.ok or not out.diff:
        return False
    bid = b.new_id()
    then_id, else_id = f"n{len(b.nodes) + 1}", f"n{len(b.nodes) + 2}"
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
            f"If the {fig} in the result of {b.step_ref(o.node.id)} is "
            f"{'greater' if comparator == '>' else 'less'} than {threshold:g}, "
            f"do {b.step_ref(then_id)}; "
            f"otherwise do {b.step_ref(else_id)}"
        ),
    )
    b.nodes.append(branch)
    b.edge(o.node.id, bid, "data", fig)
    b.reasoned = True
    for call, sources, executed in (
        (then_call, first_src, take_then),
        (else_call, second_src, not take_then),
    ):
        node = b.record_call(
            call,
            sources,
            out.data if executed else None,
            out.diff if executed else None,
            executed=executed,
            text=out.text if executed else "",
        )
        b.edge(bid, node.id, "control", "then" if call is then_call else "else")
    return True


def summarise(b: Builder) -> None:
    """A closing count or sum over a listed result that the agent must tell the user."""
    # the figure itself is computed for the one chosen
    cands: list[tuple[ReasonOp, str, Any, str, Any, Any]] = []
    for node in b.nodes:
        if node.id not in b.data or node.kind != "call" or node.write:
            continue
        for path, items in R.collections(b.data[node.id]):
            for f in R.numeric_fields(items):
                cands.append(("sum", node.id, path, f, None, items))
            for f in R.text_fields(items):
                values = sorted({it[f] for it in items})
                if 1 < len(values) < len(items):
                    for eq in values:
                        cands.append(("count", node.id, path, f, eq, items))
    if not cands:
        return
    op, source, path, f, eq, items = b.rng.choice(cands)
    value = R.total(items, f) if op == "sum" else R.count_where(items, f, eq)
    ref = b.step_ref(source)
    items_of = f"the items listed in the result of {ref}"
    if op == "sum":
        unit = "to the cent" if isinstance(value, float) else "a whole number"
        label = f"the total {f} of {items_of} ({unit})"
        text = f"Add up the {f} of {items_of} and tell the user the total ({unit})"
    else:
        label = f"how many of {items_of} have {f} {json.dumps(eq)} (a whole number)"
        text = f"Count {items_of} whose {f} is {json.dumps(eq)}; tell the user how many (a whole number)"
    node = ReasonNode(
        id=b.new_id(),
        kind="reason",
        op=op,
        source=source,
        path=path,
        field=f,
        equals=eq,
        value=value,
        text=text,
    )
    b.nodes.append(node)
    b.edge(source, node.id, "data", f)
    b.outputs.append(R.format_number(value))
    b.output_labels.append(label)
    b.reasoned = True
