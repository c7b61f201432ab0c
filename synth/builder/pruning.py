"""The end of a walk: reads whose results feed nothing that stays are dropped, the rest renumbered."""

from __future__ import annotations

import re

from ..task.models import DagNode
from .state import Builder


def prune_dead_reads(b: Builder) -> int:
    """Drop every read whose result feeds nothing that stays (a later argument, a reasoning
    step, a required output), and renumber the rest; returns how many calls were dropped.

    Writes (run, refused or the untaken side of a branch) and the branches and closing counts
    and sums stay; a pick stays when a kept call takes its value; a read stays when a kept node
    takes data from it. The DAG is in topological order, so one pass from the end decides."""
    feeds: dict[str, list[str]] = {}
    for e in b.edges:
        if e.kind in ("data", "control"):
            feeds.setdefault(e.source, []).append(e.target)
    needed: set[str] = set()
    for node in reversed(b.nodes):
        if node.kind == "call":
            keep = node.write or node.expect_error
        else:
            keep = node.op in ("branch", "count", "sum")
        if keep or any(t in needed for t in feeds.get(node.id, [])):
            needed.add(node.id)
    if len(needed) == len(b.nodes):
        return 0
    dropped = sum(1 for n in b.nodes if n.id not in needed and n.kind == "call" and n.executed)
    new_id = {n.id: f"n{i}" for i, n in enumerate(n for n in b.nodes if n.id in needed)}

    def ref(old: str | None) -> str | None:
        return None if old is None else new_id.get(old, old)

    def steps(text: str) -> str:
        def one(m: re.Match[str]) -> str:
            old = f"n{int(m.group(1)) - 1}"
            return b.step_ref(new_id[old]) if old in new_id else m.group(0)

        return re.sub(r"\bstep (\d+)\b", one, text)

    nodes: list[DagNode] = []
    for n in b.nodes:
        if n.id not in needed:
            continue
        if n.kind == "call":
            args = [a.model_copy(update={"node": ref(a.node)}) if a.source == "node" else a for a in n.args]
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
    b.nodes = nodes
    b.by_id = {n.id: n for n in nodes if n.kind == "call"}
    for n in nodes:
        if n.kind == "call":
            n.text = b.call_text(n)
    b.edges = [
        e.model_copy(update={"source": new_id[e.source], "target": new_id[e.target]})
        for e in b.edges
        if e.source in new_id and e.target in new_id
    ]
    b.edge_keys = {(e.source, e.target, e.kind) for e in b.edges}
    b.data = {new_id[k]: v for k, v in b.data.items() if k in new_id}
    b.texts = {new_id[k]: v for k, v in b.texts.items() if k in new_id}
    b.write_diffs = {new_id[k]: v for k, v in b.write_diffs.items() if k in new_id}
    b.output_labels = [steps(label) for label in b.output_labels]
    b.facts = []
    for n in nodes:
        if n.kind == "call":
            for a in n.args:
                if a.source == "user":
                    b.add_fact(a.param, n.call.arguments[a.param], n.id)
    b.calls -= dropped
    return dropped
