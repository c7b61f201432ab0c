"""The tool graph as walks look it up: per tool and per edge, each answer worked out once.

The builder asks the same questions thousands of times per task (a tool's node, its out-edges,
whether it can be filled, which of its results' keys name a parameter); the graph itself answers
them with linear scans. Everything here depends on the env and its graph only, which do not
change during a run, so the answers are kept for the run (they are as many as tools and edges).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envforge.server import Environment

from ..task.models import GraphEdge, ParamDomain, ToolGraph, ToolNode, ToolShape
from .domains import fillable


@dataclass(frozen=True)
class PlannedEdge:
    """A graph edge as walks use it: the target parameter's domain, `kind` (what decides which
    values the domain accepts), whether the target writes, and the edge as `Outcomes` tallies it."""

    edge: GraphEdge
    domain: ParamDomain
    kind: tuple[Any, ...]
    writes: bool
    feeds: tuple[str, str, str, str]


class GraphIndex:
    """Cached lookups into `graph` and the env's tools (see the module docstring)."""

    def __init__(
        self,
        env: Environment,
        graph: ToolGraph,
        domains: dict[str, dict[str, ParamDomain]],
        key_names: set[str],
    ) -> None:
        self.env = env
        self.graph = graph
        self.domains = domains
        self.key_names = key_names
        self._tools: dict[str, ToolNode] = {}
        self._out_edges: dict[str, list[GraphEdge]] = {}
        self._usable: dict[str, bool] = {}
        self._edge_plans: dict[str, list[PlannedEdge]] = {}
        self._keyed_by: dict[str, list[str]] = {}
        self._names_entity: dict[int, tuple[ParamDomain, bool]] = {}
        self._parameters: dict[str, tuple[list[str], list[str]]] = {}
        self._name_keys: dict[tuple[str, str, str], list[str]] = {}
        self._write_tables: dict[tuple[str, ...], list[str]] = {}
        self._shapes: tuple[ToolShape, ...] | None = None

    def tool_shapes(self) -> tuple[ToolShape, ...]:
        """The env's tools as the adversaries see them (`ToolShape`), in the env's order."""
        if self._shapes is None:
            self._shapes = tuple(
                ToolShape(
                    name=spec.name,
                    read_only=spec.read_only,
                    parameters=tuple(spec.parameters),
                    required=tuple(p for p in spec.parameters if p in spec.required),
                )
                for spec in self.env.tools.values()
            )
        return self._shapes

    def tool(self, name: str) -> ToolNode:
        """`graph.tool(name)` without its linear scan: the builder asks thousands of times per task."""
        node = self._tools.get(name)
        if node is None:
            node = self._tools[name] = self.graph.tool(name)
        return node

    def out_edges(self, source: str) -> list[GraphEdge]:
        """`graph.out_edges(source)` (same edges, same order), computed once per tool."""
        edges = self._out_edges.get(source)
        if edges is None:
            edges = self._out_edges[source] = self.graph.out_edges(source)
        return edges

    def usable(self, tool: str) -> bool:
        """Whether synthesis can fill every required parameter of `tool` (`domains.fillable`)."""
        usable = self._usable.get(tool)
        if usable is None:
            spec = self.env.tools[tool]
            usable = self._usable[tool] = all(fillable(self.domains[tool][p]) for p in spec.required)
        return usable

    def edge_plan(self, source: str) -> list[PlannedEdge]:
        """`source`'s out-edges into usable tools, each with what walks need to know of it."""
        plan = self._edge_plans.get(source)
        if plan is None:
            plan = self._edge_plans[source] = []
            for e in self.out_edges(source):
                if self.usable(e.target):
                    domain = self.domains[e.target][e.param]
                    plan.append(
                        PlannedEdge(
                            edge=e,
                            domain=domain,
                            kind=(domain.type, tuple(domain.enum)),
                            writes=not self.tool(e.target).read_only,
                            feeds=(source, e.key, e.target, e.param),
                        )
                    )
        return plan

    def name_keys(self, source: str, target: str, param: str) -> list[str]:
        """Keys of `source`'s results that name `target`'s `param` (name-evidence edges, in order)."""
        keys = self._name_keys.get((source, target, param))
        if keys is None:
            keys = self._name_keys[(source, target, param)] = [
                e.key
                for e in self.out_edges(source)
                if e.target == target and e.param == param and e.evidence == "name"
            ]
        return keys

    def parameters(self, tool: str) -> tuple[list[str], list[str]]:
        """A tool's parameters, and its required ones, in signature order."""
        hit = self._parameters.get(tool)
        if hit is None:
            spec = self.env.tools[tool]
            hit = self._parameters[tool] = (
                list(spec.parameters),
                [p for p in spec.parameters if p in spec.required],
            )
        return hit

    def names_entity(self, domain: ParamDomain) -> bool:
        """Whether the parameter takes an entity's key (a primary- or foreign-key column's values)."""
        hit = self._names_entity.get(id(domain))
        if hit is None or hit[0] is not domain:
            keys = self.key_names
            hit = self._names_entity[id(domain)] = (
                domain,
                any(ref.split(".", 1)[1] in keys for ref in domain.columns),
            )
        return hit[1]

    def keyed_by(self, column: str) -> list[str]:
        """The tables whose primary key is `column` alone, in schema order."""
        tables = self._keyed_by.get(column)
        if tables is None:
            tables = self._keyed_by[column] = [t.name for t in self.env.tables if t.primary_key == (column,)]
        return tables

    def write_tables(self, tools: list[str]) -> list[str]:
        """Tables any of `tools` may change: declared `writes` plus those measured by the authorizer."""
        key = tuple(tools)
        cached = self._write_tables.get(key)
        if cached is not None:
            return list(cached)
        out: set[str] = set()
        for name in tools:
            if name in self.env.tools:
                out |= set(self.env.tools[name].writes) | set(self.tool(name).writes)
        self._write_tables[key] = sorted(out)
        return sorted(out)
