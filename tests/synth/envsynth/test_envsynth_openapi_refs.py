"""OpenAPI `$ref`s are bounded by hops, the refs followed along one path, not by how deep a
schema nests.

Counting every level of nesting as a hop refused real specs (OpenAI's Evals and Conversations:
objects in arrays in objects, a few refs deep) as "too deep (cyclic?)". The bounds that keep a
hostile document out stay: a chain of too many refs, a ref cycle, and refs that name refs many
times over (exponential expansion) are each refused in one line.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from envforge.synth.envsynth import MAX_REF_HOPS, DocsError, parse_openapi


def _spec(body: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    op = {"operationId": "create_item", "requestBody": {"content": {"application/json": {"schema": body}}}}
    return {"openapi": "3.0.0", "paths": {"/items": {"post": op}}, "components": {"schemas": schemas}}


def _nested(levels: int, leaf: dict[str, Any]) -> dict[str, Any]:
    """An object whose one property is an array of objects, `levels` times over, ending in `leaf`."""
    node = leaf
    for i in range(levels):
        node = {"type": "object", "properties": {f"level{i}": {"type": "array", "items": node}}}
    return node


def test_a_deeply_nested_schema_reached_in_two_hops_is_read() -> None:
    # 40 levels of objects in arrays (80 dict/list levels), through two refs: the old bound (20
    # levels of nesting) refused it
    schemas = {
        "Item": {"$ref": "#/components/schemas/Deep"},
        "Deep": _nested(40, {"type": "string", "enum": ["a", "b"]}),
    }
    (tool,) = parse_openapi(_spec({"$ref": "#/components/schemas/Item"}, schemas))
    node: Any = tool.parameters
    for i in reversed(range(40)):
        node = node["properties"][f"level{i}"]["items"]
    assert node == {"type": "string", "enum": ["a", "b"]}


def test_a_chain_of_refs_too_long_in_hops_is_refused() -> None:
    hops = MAX_REF_HOPS + 5
    schemas = {f"S{i}": {"$ref": f"#/components/schemas/S{i + 1}"} for i in range(hops)}
    schemas[f"S{hops}"] = {"type": "object", "properties": {"x": {"type": "string"}}}
    with pytest.raises(DocsError, match=f"longer than {MAX_REF_HOPS} hops"):
        parse_openapi(_spec({"$ref": "#/components/schemas/S0"}, schemas))


def test_a_chain_within_the_hop_bound_is_read_however_it_nests() -> None:
    hops = MAX_REF_HOPS - 1
    schemas = {
        f"S{i}": {"type": "object", "properties": {"next": {"$ref": f"#/components/schemas/S{i + 1}"}}}
        for i in range(hops)
    }
    schemas[f"S{hops}"] = {"type": "integer"}
    (tool,) = parse_openapi(_spec({"$ref": "#/components/schemas/S0"}, schemas))
    node: Any = tool.parameters
    for _ in range(hops):
        node = node["properties"]["next"]
    assert node == {"type": "integer"}


def test_a_ref_cycle_is_refused_by_name() -> None:
    schemas = {
        "Node": {
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}},
        }
    }
    with pytest.raises(DocsError, match="refers to itself"):
        parse_openapi(_spec({"$ref": "#/components/schemas/Node"}, schemas))


def test_refs_that_fan_out_exponentially_are_refused_quickly() -> None:
    # each level names the next twice: 2**18 copies of the leaf within 18 hops, unless bounded
    schemas = {
        f"L{i}": {
            "type": "object",
            "properties": {
                "a": {"$ref": f"#/components/schemas/L{i + 1}"},
                "b": {"$ref": f"#/components/schemas/L{i + 1}"},
            },
        }
        for i in range(18)
    }
    schemas["L18"] = {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "string"}}}
    started = time.perf_counter()
    with pytest.raises(DocsError, match="expand past"):
        parse_openapi(_spec({"$ref": "#/components/schemas/L0"}, schemas))
    assert time.perf_counter() - started < 10


def test_a_schema_nested_past_the_bound_fails_in_one_line_not_a_recursion_error() -> None:
    with pytest.raises(DocsError, match="nests more than"):
        parse_openapi(_spec(_nested(400, {"type": "string"}), {}))


def test_a_ref_to_nothing_is_a_docs_error() -> None:
    with pytest.raises(DocsError, match="names nothing"):
        parse_openapi(_spec({"$ref": "#/components/schemas/Missing"}, {}))
