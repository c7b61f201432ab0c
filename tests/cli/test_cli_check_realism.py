"""`envforge check` measures realism on real task files: its `--json` carries the realism block,
`--strict-realism` fails an env whose tasks read like scripts or repeat each other (and only
then), and τ²'s imported tasks are measured the same way."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envforge.server import load_env
from envforge.synth import import_tau2_env, load_tasks, tau2_tasks_to_envforge, write_tasks_to

from support.paths import REPO, TAU2_RETAIL
from support.skips import TAU2_NO_DATA, tau2_data_missing

REALISM_KEYS = {
    "env",
    "tasks",
    "procedural",
    "procedural_share",
    "tool_name_tasks",
    "tool_description_tasks",
    "numbered_step_tasks",
    "dead_read_tasks",
    "dead_reads",
    "duplicates",
    "duplicate_groups",
    "principals",
    "multi_principal_tasks",
    "no_principal_tasks",
    "stiff_tasks",
    "calls",
    "writes",
    "reasoning",
    "examples",
}


def check(*args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "check", "--json", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def env_copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(REPO / "envs" / name, dst)
    return dst


def test_check_json_holds_the_realism_of_bundled_tasks(tmp_path: Path) -> None:
    env_dir = env_copy(tmp_path, "gym")
    tasks = load_tasks(env_dir)
    rc, report, stderr = check(str(env_dir))
    (env,) = report["envs"]
    realism = env["realism"]
    assert set(realism) == REALISM_KEYS
    assert realism["env"] == "gym" and realism["tasks"] == len(tasks)
    assert realism["calls"]["max"] == max(len(t.golden_calls) for t in tasks)
    assert realism["dead_reads"] is not None  # synthesized tasks record their data flow
    assert realism["principals"] >= 1 and realism["no_principal_tasks"] == 0  # gym's tasks are members'
    assert rc == 0 and report["passed"]  # realism does not fail the check without the flag
    assert "gym: realism" in stderr and "calls" in stderr


def test_strict_realism_fails_an_env_whose_tasks_name_tools_or_repeat(tmp_path: Path) -> None:
    """A task set that reads like a person (plain goals, no repeats) is not failed for those; one
    instruction that names a tool and one task shipped twice under a new id are."""
    env_dir = env_copy(tmp_path, "gym")
    tool = sorted(load_env(env_dir).tools)[0]
    tasks = [
        t.model_copy(
            update={"scenario": t.scenario.model_copy(update={"instruction": "Sort out my classes."})}
        )
        for t in load_tasks(env_dir)
    ]
    write_tasks_to(tasks, env_dir / "tasks.jsonl")
    rc, report, _ = check("--strict-realism", str(env_dir))
    missed = report["envs"][0]["realism_missed"]
    assert not [m for m in missed if "procedural" in m or "duplicates" in m]
    assert (rc == 0) == (not missed)

    scripted = tasks[0].scenario.model_copy(update={"instruction": f"Please use {tool} for me."})
    tasks[0] = tasks[0].model_copy(update={"scenario": scripted})
    tasks.append(tasks[1].model_copy(update={"id": tasks[1].id + "-again"}))
    write_tasks_to(tasks, env_dir / "tasks.jsonl")
    rc, report, _ = check("--strict-realism", str(env_dir))
    realism = report["envs"][0]["realism"]
    assert rc == 1 and not report["passed"]
    assert realism["tool_name_tasks"] == 1 and realism["examples"]["procedural"] == [tasks[0].id]
    assert realism["duplicate_groups"] == [[tasks[1].id, tasks[1].id + "-again"]]
    assert {"1 procedural instructions", "1 duplicates"} <= set(report["envs"][0]["realism_missed"])
    rc, report, _ = check(str(env_dir))  # without the flag: reported, not failed
    assert rc == 0 and report["envs"][0]["realism"]["duplicates"] == 1


@pytest.mark.skipif(tau2_data_missing("tasks.json"), reason=TAU2_NO_DATA)
def test_check_measures_tau2_tasks_the_same_way(tmp_path: Path) -> None:
    """τ²'s own tasks: goals in the user's words (no tool names, no steps), principals the user
    ids their gold actions reach, calls and writes from their actions."""
    env_dir = tmp_path / "tau2_retail"
    import_tau2_env(TAU2_RETAIL, env_dir, tasks=False)
    raw = json.loads((TAU2_RETAIL / "tasks.json").read_text(encoding="utf-8"))[:6]
    tasks = tau2_tasks_to_envforge(raw, {"train": [t["id"] for t in raw]}, load_env(env_dir))
    write_tasks_to(tasks, env_dir / "tasks.jsonl")
    _, report, _ = check(str(env_dir))
    realism = report["envs"][0]["realism"]
    assert realism["tasks"] == 6 and realism["procedural"] == 0
    assert realism["no_principal_tasks"] == 0 and realism["principals"] >= 1
    assert realism["dead_reads"] is not None  # judged by value, from the replayed results
    assert realism["calls"]["max"] == max(len(t["evaluation_criteria"]["actions"]) for t in raw)
    writes = [sum(1 for n in t.dag.nodes if n.kind == "call" and n.write) for t in tasks]
    assert realism["writes"]["max"] == max(writes)
