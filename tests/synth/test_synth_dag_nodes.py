"""DAG nodes are a union by `kind`; on file each keeps the one flat record tasks.jsonl has always had."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from envforge.synth import CallNode, Dag, ReasonNode, Task

from support.paths import bundled_env_dirs


def test_every_shipped_task_reads_back_and_writes_the_same_bytes() -> None:
    shipped = [p / "tasks.jsonl" for p in bundled_env_dirs() if (p / "tasks.jsonl").exists()]
    lines = [line for path in shipped for line in path.read_text().splitlines()]
    assert len(lines) >= 150
    kinds: set[type] = set()
    for line in lines:
        task = Task.model_validate_json(line)
        kinds |= {type(n) for n in task.dag.nodes}
        assert task.model_dump_json() == line
    assert kinds == {CallNode, ReasonNode}


def test_a_node_keeps_only_its_kinds_fields_and_refuses_the_others_set() -> None:
    reason = {"id": "n1", "kind": "reason", "text": "pick", "op": "argmax", "call": None, "args": []}
    node = Dag.model_validate({"nodes": [reason], "edges": []}).nodes[0]
    assert isinstance(node, ReasonNode) and not hasattr(node, "call")
    flat = json.loads(Dag(nodes=[node], edges=[]).model_dump_json())["nodes"][0]
    assert list(flat)[:8] == ["id", "kind", "text", "call", "write", "executed", "expect_error", "args"]
    assert flat["call"] is None and flat["executed"] is True and flat["op"] == "argmax"
    with pytest.raises(ValidationError):  # a reasoning step that claims a call is not one
        Dag.model_validate({"nodes": [{**reason, "call": {"name": "t", "arguments": {}}}], "edges": []})
    with pytest.raises(ValidationError):  # a call node must carry its call
        Dag.model_validate({"nodes": [{"id": "n0", "kind": "call", "text": "x"}], "edges": []})
