"""`envforge check` says how varied an env's tasks are and which cast the wrong person: a patient
asking to restock a drug, a write pharmacy's policy says acts for no patient (issue 36, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from envforge.synth import Principal, load_tasks, write_tasks_to

from support.paths import ENVS

PHARMACY = ENVS / "pharmacy"


def check(*args: str) -> tuple[int, dict[str, object], str]:
    from envforge.cli.synth_commands import register

    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["check", "--json", *args])
    out = result.stdout
    return result.exit_code, json.loads(out[out.index('{"passed"') :]), result.output


def test_check_fails_strictly_a_patient_who_restocks_and_names_the_task(tmp_path: Path) -> None:
    tasks = load_tasks(PHARMACY)
    restock = next(t for t in tasks if t.dag.principal is None)
    patient = next(t.dag.principal for t in tasks if t.dag.principal is not None)
    assert isinstance(patient, Principal)
    miscast = restock.model_copy(update={"dag": restock.dag.model_copy(update={"principal": patient})})
    path = write_tasks_to([miscast, *tasks[:2]], tmp_path / "tasks.jsonl")

    rc, report, out = check(str(PHARMACY), "--tasks", str(path), "--strict-realism")
    (env,) = report["envs"]  # type: ignore[misc]
    assert env["diversity"]["role_mismatches"] == 1, env["diversity"]
    assert f"{restock.id} (restock_drug)" in env["diversity"]["mismatch_examples"]
    assert rc == 1 and "1 tasks whose user may not ask for their writes" in env["realism_missed"]
    assert "role mismatches 1" in out


def test_check_prints_the_diversity_of_the_shipped_tasks(tmp_path: Path) -> None:
    path = write_tasks_to(load_tasks(PHARMACY)[:12], tmp_path / "tasks.jsonl")
    rc, report, out = check(str(PHARMACY), "--tasks", str(path), "--strict-realism")
    (env,) = report["envs"]  # type: ignore[misc]
    diversity = env["diversity"]
    assert diversity["role_mismatches"] == 0 and diversity["tasks"] == 12
    assert diversity["window_min"] >= 4 and set(diversity["roles"]) == {"patient", "staff"}
    assert rc == 0, out
    assert "pharmacy: " in out and "any 10 in a row cover" in out
