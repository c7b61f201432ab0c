"""The five envs synthesized from shipped tool docs (one per input format) and their recorded responses.

Each must: say in synthesis.json that every gate passed; load; serve its documented tools over MCP
(in-process); keep its tasks verified; and be exactly what the pipeline builds from its docs and
recordings today (so the shipped files are pipeline output, not hand edits).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envforge.server import load_env
from envforge.synth.envsynth import (
    GATES,
    ReplayResponder,
    SynthSettings,
    ToolDoc,
    load_docs,
    parse_markdown,
    parse_openapi,
    synthesize_env,
)

from support.paths import ENVSYNTH_FIXTURES, REPO
from support.synthesized import assert_serves_docs_and_tasks_verify

FORMATS = {
    "library": "tools.openai.json",
    "pharmacy": "tools_list.mcp.json",
    "car_rental": "openapi.yaml",
    "gym": "tools.md",
    "helpdesk_lite": "openapi.json",
}


@pytest.mark.parametrize("name", sorted(FORMATS))
async def test_shipped_env_passed_every_gate_and_serves_its_docs(name: str) -> None:
    root = REPO / "envs" / name
    report = json.loads((root / "synthesis.json").read_text())
    assert report["status"] == "accepted"
    assert {g: r["pass_rate"] for g, r in report["gate_results"].items()} == dict.fromkeys(GATES, 1.0)
    docs = load_docs(root / "docs")
    assert [p.name for p in (root / "docs").iterdir()] == [FORMATS[name]]
    env = load_env(root)
    assert len(env.tools) >= 6 and sum(len(r) for r in env.seed_state().values()) >= 100
    await assert_serves_docs_and_tasks_verify(env, root, docs, min_tasks=3)


@pytest.mark.parametrize("name", sorted(FORMATS))
async def test_shipped_env_is_what_the_pipeline_builds(name: str, tmp_path: Path) -> None:
    root = REPO / "envs" / name
    responder = ReplayResponder.from_path(ENVSYNTH_FIXTURES / name)
    report = await synthesize_env(load_docs(root / "docs"), tmp_path, responder, SynthSettings(name=name))
    assert report.status == "accepted"
    for f in ("env.toml", "schema.sql", "tools.py", "seed.json", "policy.md", "policy_rules.toml"):
        assert (tmp_path / f).read_bytes() == (root / f).read_bytes(), f
    assert (tmp_path / "graph.json").read_bytes() == (root / "graph.json").read_bytes()
    # The pipeline's task gate ships its first few tasks; the env was then stocked with more by
    # `envforge synth tasks ENV --n 60 --seed 0`, whose first tasks are these.
    built = (tmp_path / "tasks.jsonl").read_bytes().splitlines(keepends=True)
    assert built and (root / "tasks.jsonl").read_bytes().splitlines(keepends=True)[: len(built)] == built


def test_formats_normalise_alike() -> None:
    """The same tool in markdown and OpenAPI (with a $ref enum) gives the same ToolDoc."""
    md = parse_markdown(
        "## list_classes\nList classes.\n\nParameters:\n"
        "- day (string, optional): Only this day; one of: mon, tue.\n- n (integer, required): How many.\n"
    )
    api = parse_openapi(
        {
            "openapi": "3.0.0",
            "components": {"schemas": {"Day": {"type": "string", "enum": ["mon", "tue"]}}},
            "paths": {
                "/c": {
                    "get": {
                        "operationId": "list_classes",
                        "summary": "List classes.",
                        "parameters": [
                            {"name": "day", "in": "query", "schema": {"$ref": "#/components/schemas/Day"}},
                            {"name": "n", "in": "query", "required": True, "schema": {"type": "integer"}},
                        ],
                    }
                }
            },
        }
    )
    for docs in (md, api):
        (d,) = docs
        assert isinstance(d, ToolDoc) and d.name == "list_classes" and d.description == "List classes."
        assert d.required == ["n"] and d.properties["day"]["enum"] == ["mon", "tue"]
        assert d.properties["n"]["type"] == "integer"
