"""The first env a real model wrote that passed every gate: Slack, by Qwen2.5-Coder-1.5B from the
Slack MCP server's `tools/list` (the corpus's `mcp_slack`), bundled as `envs/slack`.

Its synthesis.json names the model and says every gate passed; replaying the model's answers
(`tests/fixtures/envsynth/accepted_slack_1.5b/responses.json`) through today's pipeline builds it
byte for byte (so its files are that model's answers as the pipeline keeps them, not hand edits);
it serves its documented tools over MCP; and its 60 tasks verify. Every test a bundled env meets
runs on it too.
"""

from __future__ import annotations

import json
from pathlib import Path

from envforge.server import load_env
from envforge.synth.envsynth import (
    GATES,
    ReplayResponder,
    SynthSettings,
    load_docs,
    synthesize_env,
)

from support.paths import ENVSYNTH_FIXTURES, REPO
from support.synthesized import assert_serves_docs_and_tasks_verify

ROOT = REPO / "envs" / "slack"
ANSWERS = ENVSYNTH_FIXTURES / "accepted_slack_1.5b"
CORPUS_DOCS = REPO / "benchmarks" / "envsynth_corpus" / "mcp_slack" / "docs"
FILES = ("env.toml", "schema.sql", "tools.py", "seed.json", "policy.md", "policy_rules.toml", "phrases.toml")


def test_a_real_model_wrote_it_and_every_gate_passed() -> None:
    report = json.loads((ROOT / "synthesis.json").read_text())
    assert report["status"] == "accepted" and report["model"] == "local/qwen2.5-coder-1.5b"
    assert {g: r["pass_rate"] for g, r in report["gate_results"].items()} == dict.fromkeys(GATES, 1.0)
    assert report["llm_calls"] > report["reused_answers"]  # some of it asked live, not all replayed
    recorded = json.loads((ANSWERS / "responses.json").read_text())["responses"]
    assert len(recorded) == report["llm_calls"]
    for doc in CORPUS_DOCS.iterdir():  # the real document it was written from, as the corpus keeps it
        assert (ROOT / "docs" / doc.name).read_bytes() == doc.read_bytes()


async def test_its_own_answers_build_it_byte_for_byte(tmp_path: Path) -> None:
    responder = ReplayResponder.from_path(ANSWERS)
    report = await synthesize_env(
        load_docs(ROOT / "docs"), tmp_path, responder, SynthSettings(name="slack", max_rounds=8)
    )
    assert report.status == "accepted"
    for f in FILES:
        assert (tmp_path / f).read_bytes() == (ROOT / f).read_bytes(), f
    assert (tmp_path / "graph.json").read_bytes() == (ROOT / "graph.json").read_bytes()
    # the pipeline's task gate keeps its first tasks; `synth tasks ENV --n 60 --seed 0` then
    # stocked the env, and its first tasks are these
    built = (tmp_path / "tasks.jsonl").read_bytes().splitlines(keepends=True)
    assert built and (ROOT / "tasks.jsonl").read_bytes().splitlines(keepends=True)[: len(built)] == built


async def test_it_serves_its_docs_and_its_tasks_verify() -> None:
    docs = load_docs(ROOT / "docs")
    env = load_env(ROOT)
    assert env.manifest.trust == "confined"
    assert len(env.tools) == 8 and sum(len(r) for r in env.seed_state().values()) >= 100
    await assert_serves_docs_and_tasks_verify(env, ROOT, docs, min_tasks=50)
