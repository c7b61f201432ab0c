"""`envforge rescore`: stored trajectories scored again against the current tasks, no model called."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from envforge.harness import EvalConfig, LLMConfig, rescore, run_eval
from envforge.synth import load_tasks

from support.fake_llm import FakeOpenAI, scripted_brain
from support.paths import REPO

RETAIL = REPO / "envs" / "retail_orders"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "envforge.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


async def test_rescore_against_changed_tasks_changes_the_reward_without_a_model(tmp_path: Path) -> None:
    task = next(t for t in load_tasks(RETAIL) if t.required_outputs and "outputs" in t.reward_basis)
    run = tmp_path / "run"
    with FakeOpenAI(scripted_brain(task)) as fake:
        config = EvalConfig(
            agent="openai/fake-agent",
            agent_llm=LLMConfig(model="openai/fake-agent", api_base=fake.url, api_key="x"),
            task_ids=[task.id],
        )
        _, (rec,) = await run_eval([RETAIL], config, run)
    assert rec.reward == 1.0
    # The model server is gone: anything that tried to call it would fail.
    env_copy = tmp_path / "retail_orders"
    shutil.copytree(RETAIL, env_copy)
    changed = task.model_copy(update={"required_outputs": ["a value the agent never said"]})
    (env_copy / "tasks.jsonl").write_text(changed.model_dump_json() + "\n")
    history = (run / "trials.jsonl").read_bytes()

    same = cli("rescore", str(run), "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["overall"]["pass_hat_k"] == [1.0]

    fresh = cli("rescore", str(run), "--tasks-from", str(env_copy), "--json", "--out", str(tmp_path / "new"))
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout)["overall"]["pass_hat_k"] == [0.0]
    (new,) = [json.loads(line) for line in (tmp_path / "new" / "trials.jsonl").read_text().splitlines()]
    assert new["reward"] == 0.0 and new["score"]["outputs_missing"] == ["a value the agent never said"]
    assert new["usage"] == json.loads(history)["usage"]  # the stored trajectory, not a new one
    assert (run / "trials.jsonl").read_bytes() == history  # history is never rewritten
    assert (run / "rescored.jsonl").exists()

    report = cli("report", str(tmp_path / "new"), "--json")
    assert report.returncode == 0 and json.loads(report.stdout)["overall"]["mean_reward"] == 0.0
    again = cli("rescore", str(run), "--tasks-from", str(env_copy), "--out", str(tmp_path / "new"))
    assert again.returncode == 2 and "already holds a run" in " ".join(again.stderr.split())


def test_rescore_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    result = cli("rescore", str(tmp_path))
    assert result.returncode == 2 and "no manifest.json" in result.stderr and "Traceback" not in result.stderr


async def test_a_record_whose_final_state_does_not_match_its_hash_is_reported(tmp_path: Path) -> None:
    """A trial's stored diff or hash altered after the run: rebuilding its final state from the
    diff no longer gives the state the run hashed, so rescore must not score it (an edited diff
    could turn a failed trial golden); it names the trial, keeps its stored score, exits 1. The
    other trials are rescored as ever."""
    ids = [t.id for t in load_tasks(RETAIL)[:3]]
    run = tmp_path / "run"
    _, records = await run_eval([RETAIL], EvalConfig(agent="oracle", task_ids=ids), run)
    assert [r.reward for r in records] == [1.0, 1.0, 1.0]
    lines = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    lines[0]["final_state_hash"] = "0" * 64  # the hash altered
    lines[1]["final_diff"] = {}  # the diff altered: the oracle's writes gone, as if never made
    (run / "trials.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    result = await rescore(run)
    assert sorted(result.mismatched) == sorted([lines[0]["trial_key"], lines[1]["trial_key"]])
    assert [r.reward for r in result.records] == [1.0, 1.0, 1.0]  # stored scores kept, third rescored

    done = cli("rescore", str(run), "--out", str(tmp_path / "new"))
    assert done.returncode == 1, done.stderr
    said = " ".join(done.stderr.split())
    for line in lines[:2]:
        assert f"error: {line['trial_key']}: the final state rebuilt from its stored diff hashes to" in said
    assert "2 trial(s) failed the final-state hash check" in said and "Traceback" not in said
    assert lines[2]["trial_key"] not in said


async def test_a_stored_final_state_without_its_hash_or_unreadable_is_reported(tmp_path: Path) -> None:
    """The hash check is not skipped by removing the hash, and one record's unreadable diff (wrong
    shape, a table the env has not) is that record's error, not the end of the whole rescore."""
    ids = [t.id for t in load_tasks(RETAIL)[:4]]
    run = tmp_path / "run"
    _, records = await run_eval([RETAIL], EvalConfig(agent="oracle", task_ids=ids), run)
    assert [r.reward for r in records] == [1.0] * 4
    lines = [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]
    lines[0]["final_state_hash"] = None  # the hash removed, the diff altered: the writes gone
    lines[0]["final_diff"] = {}
    lines[1]["final_diff"] = {"orders": "not a table diff"}
    lines[2]["final_diff"] = {"no_such_table": {"inserted": [{"id": "X"}]}}
    (run / "trials.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    result = await rescore(run)
    assert sorted(result.mismatched) == sorted(line["trial_key"] for line in lines[:3])
    assert [r.reward for r in result.records] == [1.0] * 4  # stored scores kept, the fourth rescored

    done = cli("rescore", str(run), "--out", str(tmp_path / "new"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    said = " ".join(done.stderr.split())
    assert all(f"error: {line['trial_key']}:" in said for line in lines[:3]), said
    assert "3 trial(s) failed the final-state hash check" in said
