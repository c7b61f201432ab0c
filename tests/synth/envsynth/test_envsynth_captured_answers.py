"""The pipeline against what a real model wrote: the packaged 0.5B model's answers on the corpus's
Petstore set (`tests/fixtures/envsynth/captured_petstore_0.5b/responses.json`).

It was rejected at the static gate after three repair rounds, and each round was the pipeline's
to improve: the schema stored the tool documents themselves (valid SQL, so no gate said so and
every later stage built on it); tools.py was the documents as JSON, and the evidence it got back,
"statement at module top level: Expr", did not say what to change (it answered with the same
shape, then with echoes of the prompt). Now the static gate names the documents table and blames
the schema, the repair evidence says what to change, and the tools stage is asked to fill in the
skeleton of the documented tools rather than to invent their surface. The answers stay confined:
nothing here is loaded, only gated.
"""

from __future__ import annotations

from pathlib import Path

from envforge.server import check_python
from envforge.synth.envsynth import (
    ReplayResponder,
    SynthSettings,
    load_doc_set,
    load_recordings,
    rejected_dir,
    repair_hints,
    strip_fences,
    synthesize_env,
    with_documented_signatures,
)

from support.envsynth_asked import Asked
from support.paths import ENVSYNTH_FIXTURES, REPO

CORPUS = REPO / "benchmarks" / "envsynth_corpus"
CAPTURED = ENVSYNTH_FIXTURES / "captured_petstore_0.5b"


async def test_the_captured_answers_get_evidence_that_says_what_to_change(tmp_path: Path) -> None:
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    # the schema's repair is the 1.5B model's real answer (a users table), so the gates go on
    later_schema = load_recordings(ENVSYNTH_FIXTURES / "captured_petstore_1.5b_signatures")["schema:0"]
    asked = Asked(CAPTURED, overrides={"schema:1": later_schema})
    settings = SynthSettings(name="petstore", max_rounds=2)
    report = await synthesize_env(docs, tmp_path / "petstore", asked, settings)
    assert report.status == "rejected" and not (tmp_path / "petstore").exists()
    static = report.rounds[0].gates[0]
    assert static.name == "static" and not static.passed
    # the documents table is named, and the schema is asked again (before: only tools was),
    # first on its own, before any stage is written against it
    assert any("stores the tool documents" in p for p in static.problems), static.problems
    assert report.rounds[0].repaired == ["schema"]
    assert "stores the tool documents" in asked.prompts["schema:1"]
    # tools.py (written after the repair) is still the JSON answer, and policy.md the prompt's
    # sections: the full gates blame those two
    assert [g.name for g in report.rounds[1].gates] == ["static"]
    assert report.rounds[1].repaired == ["tools", "policy"]
    # the JSON answer's evidence says what tools.py must be, not only where the gate stopped
    tools_repair = asked.prompts["tools:2"]
    assert "statement at module top level" in tools_repair
    assert "What to change: tools.py is a Python module" in tools_repair
    # the tools stage fills in the documented surface: every tool's signature is in the prompt
    for doc in docs:
        assert f"async def {doc.name}(db: Db" in asked.prompts["tools:0"], doc.name
    assert "## Tool documents (JSON)" not in asked.prompts["tools:0"]
    # nor is the schema stage shown the documents' JSON keys it made columns of, but the tools
    assert '"parameters"' not in asked.prompts["schema:0"]
    assert "## The tools the tables must serve" in asked.prompts["schema:0"]
    assert "async def createUser(db: Db" in asked.prompts["schema:0"]


SKELETON_RUN = ENVSYNTH_FIXTURES / "captured_petstore_0.5b_skeleton"


def test_a_copied_skeleton_with_a_broken_header_gets_the_documented_header() -> None:
    # shown the skeleton, the model copied it but wrote `password: str | None` without `= None`
    # after a defaulted parameter: a syntax error, repeated in all three repair rounds
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    answer = strip_fences(load_recordings(SKELETON_RUN)["tools:0"])
    assert [v.rule for v in check_python(answer)] == ["syntax error"]
    fixed = with_documented_signatures(answer, docs)
    assert check_python(fixed) == []
    # only the headers changed: every body and decorator the model wrote is still there
    assert [ln for ln in answer.splitlines() if ln.lstrip().startswith(("@tool", "raise", '"""'))] == [
        ln for ln in fixed.splitlines() if ln.lstrip().startswith(("@tool", "raise", '"""'))
    ]


async def test_the_captured_skeleton_answers_fail_only_on_the_documents_table(tmp_path: Path) -> None:
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    responder = ReplayResponder.from_path(SKELETON_RUN)
    settings = SynthSettings(name="petstore", max_rounds=0)
    report = await synthesize_env(docs, tmp_path / "petstore", responder, settings)
    static = report.rounds[0].gates[0]
    # `CREATE TABLE tool_documents (..., description TEXT, parameters JSON)`: the same misreading
    # under the name the prompt did not forbid; tools.py parses (it keeps the skeleton's
    # placeholders, named; policy.md repeats the prompt's sections, named too)
    assert static.blame == ["schema", "tools", "policy"], static.problems
    assert static.problems[0].startswith("schema.sql stores the tool documents")
    named = ("schema.sql stores the tool documents", "policy.md repeats", "tools.py: ")
    assert not [p for p in static.problems if "line" in p.split(":")[0]]  # no syntax problem
    assert all(p.startswith(named) for p in static.problems)


async def test_a_rejected_run_keeps_every_answer_to_replay_it(tmp_path: Path) -> None:
    docs = load_doc_set(CORPUS, CORPUS / "openapi_petstore_users" / "docs")
    settings = SynthSettings(name="petstore", max_rounds=0)
    captured = ReplayResponder.from_path(SKELETON_RUN)
    first = await synthesize_env(docs, tmp_path / "a" / "petstore", captured, settings)
    kept = rejected_dir(tmp_path / "a" / "petstore") / "rejected_candidate" / "responses.json"
    answers = load_recordings(kept)
    assert answers == {k: v for k, v in load_recordings(SKELETON_RUN).items() if k.endswith(":0")}
    again = await synthesize_env(docs, tmp_path / "b" / "petstore", ReplayResponder.from_path(kept), settings)
    assert [g.model_dump(exclude={"seconds"}) for g in again.rounds[0].gates] == [
        g.model_dump(exclude={"seconds"}) for g in first.rounds[0].gates
    ]


SLACK_RUN = ENVSYNTH_FIXTURES / "captured_slack_0.5b_skeleton"


async def test_the_seed_stage_is_told_its_keys_and_the_load_evidence_what_to_change(tmp_path: Path) -> None:
    # asked for ```json {table: [rows]}```, the model answered {"table": ["tool_documents"]} in
    # all four rounds; the load gate said "seed.json:2: unknown table 'table'" and no more
    docs = load_doc_set(CORPUS, CORPUS / "mcp_slack" / "docs")
    asked = Asked(SLACK_RUN)
    await synthesize_env(docs, tmp_path / "slack", asked, SynthSettings(name="slack", max_rounds=0))
    assert "## Tables to fill (the seed's keys)\ntool_documents" in asked.prompts["seed:0"]
    assert "return {'tool_documents': tool_documents_rows}" in asked.prompts["seed:0"]
    assert strip_fences(load_recordings(SLACK_RUN)["seed:0"]).startswith('{\n  "table"')
    hints = repair_hints(["seed.json:2: unknown table 'table'"])
    assert hints and "top-level keys are the schema's table names" in hints[0]
