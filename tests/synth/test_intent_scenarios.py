"""Scenarios state intent, not procedure: attacks on the rendered user instructions.

A task that reads like a macro script tests list-following; a persona that is a product, or a
warning that a wish "is expected to be refused", gives the answer away. Each test here is what a
reader (or a policy hunting for reward) would exploit, run over the real bundled task files, real
env folders and the real CLI.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from envforge.cli.synth_commands import register
from envforge.server import load_env
from envforge.synth import (
    PHRASES_FILE,
    PhraseError,
    Phrases,
    derive_phrases,
    load_phrases,
    load_tasks,
    missing_facts,
    phrase_problems,
    render_scenario,
)
from envforge.synth.envsynth import ReplayResponder, SynthSettings, load_docs, synthesize_env

from support.paths import ENVSYNTH_FIXTURES, REPO, bundled_env_dirs

NUMBERED = re.compile(r"^\s*\d+[.)]", re.MULTILINE)
SYNTHESIZED = ("car_rental", "gym", "helpdesk_lite", "library", "pharmacy")

ENVS_WITH_TASKS = [d for d in bundled_env_dirs() if (d / "tasks.jsonl").exists()]
runner = CliRunner()
app = typer.Typer()
register(app)


def procedure_in(text: str, tool_names: list[str]) -> list[str]:
    """What in `text` reads as procedure: tool names, numbered steps, ordering or refusal hints."""
    lowered = text.lower()
    found = [name for name in tool_names if name.lower() in lowered]
    if NUMBERED.search(text):
        found.append("a numbered step")
    found += [
        s for s in ("in this order", "expected to be refused", "step 1", "result of step") if s in lowered
    ]
    return found


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_no_bundled_instruction_reads_as_procedure(env_dir: Path) -> None:
    env = load_env(env_dir)
    tools = sorted(env.tools)
    leaks = {
        t.id: found
        for t in load_tasks(env_dir)
        if (found := procedure_in(t.scenario.instruction + "\n" + t.scenario.persona, tools))
    }
    assert not leaks, f"{len(leaks)} instructions read as procedure, e.g. {next(iter(leaks.items()))}"


def _person_names(env_dir: Path, phrases: Phrases, extra_rows: dict[str, list[dict[str, Any]]]) -> set[str]:
    seed = json.loads((env_dir / "seed.json").read_text(encoding="utf-8"))
    names: set[str] = set()
    for table, entity in phrases.entities.items():
        if not entity.person or not entity.name:
            continue
        for row in [*seed.get(table, []), *extra_rows.get(table, [])]:
            parts = [row.get(c) for c in entity.name.split()]
            if all(isinstance(p, str) for p in parts):
                names.add(" ".join(str(p) for p in parts))
                names.add(str(parts[0]))  # the walker's principal is named by its first name column
    return names


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_every_bundled_persona_is_a_person(env_dir: Path) -> None:
    """Only a row of a person-like table names a persona: never a product, a book or a car. A
    task without a principal (a restock: it acts for no one) is a member of staff's."""
    env = load_env(env_dir)
    phrases = load_phrases(env)
    people = {e.singular for e in phrases.entities.values() if e.person}
    assert people, f"{env_dir.name} has no person-like entity"
    for task in load_tasks(env_dir):
        persona = task.scenario.persona
        if task.dag.principal is None and persona.startswith("A member of staff of the "):
            continue
        name, sep, role = persona.partition(", ")
        if not sep:  # no name: "A member of the library service"
            assert any(persona.lower().startswith(f"{a} {p} of ") for p in people for a in ("a", "an")), (
                persona
            )
            continue
        inserted = {t: d.inserted for t, d in task.setup.items()}
        assert name in _person_names(env_dir, phrases, inserted), f"{task.id}: persona {persona!r}"
        assert any(role.startswith(f"{a} {p} of ") for p in people for a in ("a", "an")), persona


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_every_needed_fact_and_output_is_in_the_instruction(env_dir: Path) -> None:
    for task in load_tasks(env_dir):
        assert missing_facts(task.scenario, task.scenario.instruction) == [], task.id
        assert task.scenario.must_be_told == task.required_outputs


@pytest.mark.parametrize("env_dir", ENVS_WITH_TASKS, ids=lambda d: d.name)
def test_expected_refusals_read_as_the_users_wish(env_dir: Path) -> None:
    """A write the policy refuses is asked for plainly: no hint the agent may lean on."""
    tasks = load_tasks(env_dir)
    refused = [t for t in tasks if any(n.kind == "call" and n.expect_error for n in t.dag.nodes)]
    for task in refused:
        text = task.scenario.instruction.lower()
        assert "refus" not in text and "declin" not in text and "not allowed" not in text, task.id


def _dag(nodes: list[dict[str, Any]], principal: dict[str, Any] | None = None) -> Any:
    from envforge.synth import Dag

    return Dag.model_validate({"nodes": nodes, "edges": [], "principal": principal})


def _retail_phrases() -> Phrases:
    return load_phrases(load_env(REPO / "envs" / "retail_orders"))


READ = {
    "id": "n0",
    "kind": "call",
    "text": "List a customer's orders, oldest first",
    "call": {"name": "list_customer_orders", "arguments": {"customer_id": "C-1031"}},
    "args": [{"param": "customer_id", "source": "user"}],
}
WRITE = {
    "id": "n1",
    "kind": "call",
    "text": "Cancel a pending or processing order",
    "call": {
        "name": "cancel_order",
        "arguments": {"customer_id": "C-1031", "order_id": "O-5008", "reason": "ordered_by_mistake"},
    },
    "write": True,
    "args": [
        {"param": "customer_id", "source": "user"},
        {"param": "order_id", "source": "user"},
        {"param": "reason", "source": "user"},
    ],
}
FACTS = [
    {"name": "customer_id", "value": "C-1031"},
    {"name": "order_id", "value": "O-5008"},
    {"name": "reason", "value": "ordered_by_mistake"},
]


def _render(
    nodes: list[dict[str, Any]], data: dict[str, Any], principal: dict[str, Any] | None = None
) -> Any:
    from envforge.synth import Fact

    facts = [Fact.model_validate(f) for f in FACTS]
    return render_scenario("retail_orders", _dag(nodes, principal), facts, [], data, [], _retail_phrases())


def test_a_read_that_only_feeds_nothing_is_not_spoken_of() -> None:
    """The user states the goal; listing their orders first is the agent's business."""
    scenario = _render([READ, WRITE], {"n0": [{"order_id": "O-5008"}]})
    text = scenario.instruction
    assert "my orders" not in text and "oldest first" not in text
    assert "cancel order O-5008" in text
    assert procedure_in(text, ["list_customer_orders", "cancel_order"]) == []


def test_a_refused_wish_is_asked_for_without_a_warning() -> None:
    refused = {**WRITE, "expect_error": True}
    text = _render([refused], {}).instruction
    assert "cancel order O-5008" in text and "refus" not in text.lower()


def test_a_product_is_never_the_persona() -> None:
    product = {"product_id": "P-104", "name": "Trail Running Shoes", "category": "footwear"}
    scenario = _render([READ, WRITE], {"n0": product})
    assert "Trail Running Shoes" not in scenario.persona
    assert scenario.persona == "A customer of the retail orders service"


def test_the_principal_is_the_persona() -> None:
    principal = {"table": "customers", "key": {"customer_id": "C-1031"}, "name": "Noor Haddad"}
    product = {"product_id": "P-104", "name": "Trail Running Shoes"}
    scenario = _render([READ, WRITE], {"n0": product}, principal)
    assert scenario.persona == "Noor Haddad, a customer of the retail orders service"
    # a principal of a table that is no person names nobody
    thing = {"table": "products", "key": {"product_id": "P-104"}, "name": "Trail Running Shoes"}
    assert "Trail" not in _render([WRITE], {}, thing).persona


def test_rendering_is_deterministic_to_the_byte() -> None:
    first = _render([READ, WRITE], {"n0": {"customer_id": "C-1031", "first_name": "A", "last_name": "B"}})
    again = _render([READ, WRITE], {"n0": {"customer_id": "C-1031", "first_name": "A", "last_name": "B"}})
    assert first.model_dump_json() == again.model_dump_json()
    assert first.persona == "A B, a customer of the retail orders service"


# --------------------------------------------------------------------------- the phrase gate


@pytest.mark.parametrize(
    ("phrase", "problem"),
    [
        ("call cancel_order on {order_id} for {customer_id} ({reason})", "names the tool"),
        ("1. cancel order {order_id} for {customer_id} because {reason}", "numbered step"),
        ("cancel order {order_id} because {reason}", "drops the placeholder {customer_id}"),
        ("cancel order {order_id} of {customer_id} ({reason}) on {when}", "{when} is not a parameter"),
    ],
)
def test_the_gate_rejects_a_bad_phrase(tmp_path: Path, phrase: str, problem: str) -> None:
    env_dir = tmp_path / "retail_orders"
    shutil.copytree(REPO / "envs" / "retail_orders", env_dir, ignore=shutil.ignore_patterns("tasks.jsonl"))
    text = (env_dir / PHRASES_FILE).read_text(encoding="utf-8")
    old = next(line for line in text.splitlines() if line.startswith('phrase = "cancel order'))
    (env_dir / PHRASES_FILE).write_text(text.replace(old, f"phrase = {json.dumps(phrase)}"), encoding="utf-8")
    env = load_env(env_dir)
    with pytest.raises(PhraseError, match=re.escape(problem)):
        load_phrases(env)
    # the CLI refuses in one line, before any walk, and writes no tasks
    result = runner.invoke(app, ["synth", "tasks", str(env_dir), "--n", "1"])
    assert result.exit_code == 2, result.output
    assert problem in result.output and "Traceback" not in result.output
    assert not (env_dir / "tasks.jsonl").exists()


def test_derived_phrases_pass_the_gate_for_every_bundled_env() -> None:
    for env_dir in bundled_env_dirs():
        env = load_env(env_dir)
        assert phrase_problems(derive_phrases(env), env.tools) == [], env_dir.name


@pytest.mark.parametrize("name", SYNTHESIZED)
def test_synthesized_envs_ship_their_generated_vocabulary(name: str) -> None:
    """The five synthesized envs' phrases.toml are the generator's output, unpolished."""
    env = load_env(REPO / "envs" / name)
    assert (env.root / PHRASES_FILE).exists()
    assert load_phrases(env) == derive_phrases(env)


def test_an_env_without_phrases_still_renders_intent(tmp_path: Path) -> None:
    env_dir = tmp_path / "library"
    shutil.copytree(REPO / "envs" / "library", env_dir)
    (env_dir / PHRASES_FILE).unlink()
    result = runner.invoke(app, ["synth", "tasks", str(env_dir), "--n", "3", "--force"])
    assert result.exit_code == 0, result.output
    tools = sorted(load_env(env_dir).tools)
    for task in load_tasks(env_dir):
        assert procedure_in(task.scenario.instruction, tools) == [], task.scenario.instruction


async def test_env_synthesis_writes_a_gated_vocabulary(tmp_path: Path) -> None:
    responder = ReplayResponder.from_path(ENVSYNTH_FIXTURES / "library")
    docs = load_docs(REPO / "envs" / "library" / "docs")
    report = await synthesize_env(docs, tmp_path / "library", responder, SynthSettings(name="library"))
    assert report.status == "accepted", report.reasons
    env = load_env(tmp_path / "library")
    assert (env.root / PHRASES_FILE).exists()
    assert load_phrases(env) == derive_phrases(env)
    tools = sorted(env.tools)
    for task in load_tasks(env.root):
        assert procedure_in(task.scenario.instruction, tools) == [], task.scenario.instruction
