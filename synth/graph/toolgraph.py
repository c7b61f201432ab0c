"""The tool dependency graph: an edge A -> B when a value A returns can feed a parameter of B.

Edges are derived from evidence only: a JSON key in A's actual results named like B's parameter
("name"), or an entity-key column whose observed values all lie in the parameter's schema domain
("values"). State edges (A writes a table B reads) come from the authorizer-measured footprints.
Output is deterministic: tools, edges and columns are sorted, so `graph.json` diffs cleanly.
"""

from __future__ import annotations

import json
from pathlib import Path

from envforge.server import Environment, Fleet, env_file_exists, read_env_text, replace_file

from ..task.models import GraphEdge, ParamDomain, StateEdge, ToolGraph, ToolNode
from .domains import DomainValues, derive_domains, key_columns, type_fits
from .footprint import Probe, probe_tool


def _edge_evidence(
    key: str, key_values: list[object], domain: ParamDomain, dom_values: list[object], id_keys: set[str]
) -> str | None:
    base = domain.param[:-1] if domain.is_list and domain.param.endswith("s") else domain.param
    if not key_values or not all(type_fits(domain.type, v) for v in key_values):
        return None
    if key == base:
        return "name"
    if domain.enum or not domain.columns or not (key in id_keys or key == "id"):
        return None
    allowed = {json.dumps(v, sort_keys=True) for v in dom_values}
    if all(json.dumps(v, sort_keys=True) in allowed for v in key_values):
        return "values"
    return None


async def build_graph(env: Environment, fleet: Fleet | None = None, *, probes: int = 8) -> ToolGraph:
    """Probe every tool on the seed state and derive the graph from what was observed."""
    own = fleet is None
    fleet = fleet or Fleet([env])
    try:
        domains = derive_domains(env)
        values = DomainValues(env.seed_state())
        id_keys = key_columns(env)
        measured: dict[str, Probe] = {}
        for name in sorted(env.tools):
            measured[name] = await probe_tool(
                fleet, env, name, domains[name], values, key_names=id_keys, probes=probes
            )
    finally:
        if own:
            await fleet.aclose()
    nodes = []
    for name in sorted(env.tools):
        spec, probe = env.tools[name], measured[name]
        nodes.append(
            ToolNode(
                name=name,
                read_only=spec.read_only,
                parameters=list(spec.parameters),
                required=sorted(spec.required),
                domains=[domains[name][p] for p in spec.parameters],
                reads={t: sorted(c) for t, c in sorted(probe.footprint.reads.items())},
                writes={t: sorted(c) for t, c in sorted(probe.footprint.writes.items())},
                result_keys=sorted(probe.keys),
                probes=probe.probes,
                successes=probe.successes,
            )
        )
    edges: list[GraphEdge] = []
    for src in nodes:
        for key, key_values in measured[src.name].keys.items():
            for dst in nodes:
                if dst.name == src.name:
                    continue
                for domain in dst.domains:
                    evidence = _edge_evidence(key, key_values, domain, values.values(domain), id_keys)
                    if evidence:
                        edges.append(
                            GraphEdge(
                                source=src.name,
                                target=dst.name,
                                key=key,
                                param=domain.param,
                                evidence=evidence,
                            )
                        )
    edges.sort(key=lambda e: (e.source, e.target, e.param, e.key))
    state_edges = []
    for w in nodes:
        for r in nodes:
            shared = sorted(set(w.writes) & set(r.reads))
            if shared and w.name != r.name:
                state_edges.append(StateEdge(writer=w.name, reader=r.name, tables=shared))
    return ToolGraph(env=env.name, tools=nodes, edges=edges, state_edges=state_edges)


def graph_json(graph: ToolGraph) -> str:
    return json.dumps(graph.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"


def write_graph(graph: ToolGraph, root: Path) -> Path:
    return replace_file(Path(root) / "graph.json", graph_json(graph))  # a link there is replaced


def load_graph(root: Path) -> ToolGraph | None:
    if not env_file_exists(root, "graph.json"):
        return None
    return ToolGraph.model_validate_json(read_env_text(root, "graph.json"))  # never through a link out


def _labels(graph: ToolGraph) -> dict[tuple[str, str], str]:
    labels: dict[tuple[str, str], list[str]] = {}
    for e in graph.edges:
        item = e.param if e.key == e.param else f"{e.key}→{e.param}"
        labels.setdefault((e.source, e.target), [])
        if item not in labels[(e.source, e.target)]:
            labels[(e.source, e.target)].append(item)
    return {k: ", ".join(v) for k, v in labels.items()}


def to_mermaid(graph: ToolGraph) -> str:
    lines = ["graph LR"]
    for t in graph.tools:
        shape = f"{t.name}[{t.name}]" if t.read_only else f"{t.name}[/{t.name}/]"
        lines.append(f"  {shape}")
    for (a, b), label in sorted(_labels(graph).items()):
        lines.append(f"  {a} -->|{label}| {b}")
    for s in graph.state_edges:
        lines.append(f"  {s.writer} -.->|{', '.join(s.tables)}| {s.reader}")
    return "\n".join(lines) + "\n"


def to_dot(graph: ToolGraph) -> str:
    lines = [f'digraph "{graph.env}" {{', "  rankdir=LR;"]
    for t in graph.tools:
        shape = "box" if t.read_only else "box, style=bold"
        lines.append(f'  "{t.name}" [shape={shape}];')
    for (a, b), label in sorted(_labels(graph).items()):
        lines.append(f'  "{a}" -> "{b}" [label="{label}"];')
    for s in graph.state_edges:
        lines.append(f'  "{s.writer}" -> "{s.reader}" [style=dashed, label="{", ".join(s.tables)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
