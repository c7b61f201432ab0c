"""The transfer benchmark (`benchmarks/erpo_transfer.py`): its pass^1 counts only full passes, its
interval stays honest at 0 and at n, and a run end to end plays both models on τ² retail's test
tasks beside the do-nothing floor, then resumes without playing them again."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from envforge.synth import import_tau2_env

from support.paths import REPO, TAU2_RETAIL
from support.skips import TAU2_NO_DATA, tau2_data_missing


@pytest.fixture
def transfer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module("erpo_transfer")


def test_a_partial_reward_is_no_pass(transfer: ModuleType) -> None:
    # τ²'s success is a reward of 1: a checkpoint scoring 0.5 where the base scored 0 won nothing
    line = transfer.paired_line([0.0, 0.0, 1.0], [0.5, 1.0, 0.99])
    assert "passed 1 task(s) the base model failed and failed 1 it passed" in line


def test_the_interval_is_not_a_point_at_zero_or_all(transfer: ModuleType) -> None:
    lo, hi = transfer.wilson(0, 40)
    assert lo == 0.0 and 0.08 < hi < 0.09  # 0 of 40 is no proof the rate is 0
    lo, hi = transfer.wilson(40, 40)
    assert 0.91 < lo < 0.92 and hi == 1.0
    lo, hi = transfer.wilson(20, 40)
    assert lo < 0.5 < hi and abs((0.5 - lo) - (hi - 0.5)) < 1e-9


def test_passing_only_where_doing_nothing_passes_is_no_transfer(transfer: ModuleType) -> None:
    # seen on retail: a lookup-trained checkpoint passed a task by answering and stopping, which
    # the do-nothing agent passes too; the report counts the passes beyond that floor apart
    settings = {"split": "test", "env": "tau2_retail", "max_turns": 12, "max_new_tokens": 256}
    settings |= {"max_seq_len": 4096, "temperature": 0.7, "seed": 0}
    results = {
        "do nothing": {"model": "noop", "rewards": [1.0, 0.0, 0.0], "seconds": 1},
        "base": {"model": "b", "rewards": [0.0, 0.0, 0.0], "seconds": 1},
        "trained": {"model": "t", "rewards": [1.0, 0.0, 1.0], "seconds": 1},
    }
    rows = {
        r.split("|")[1].strip(): r.split("|")
        for r in transfer.report(results, settings).splitlines()
        if r[:2] == "| "
    }
    header = [c.strip() for c in rows["model"]]
    beyond = header.index("passed where doing nothing fails")
    assert [rows[m][beyond].strip() for m in ("do nothing", "base", "trained")] == ["0", "0", "1"]


def test_kept_episodes_are_never_another_checkpoints(transfer: ModuleType) -> None:
    class T:
        def __init__(self, id: str) -> None:
            self.id = id

    settings = {"split": "test", "seed": 0}
    kept = {"model": "runs/a/step_6", "settings": settings, "tasks": ["0", "1"]}
    tasks = [T("0"), T("1")]
    assert transfer.kept_for(kept, "runs/a/step_6", settings, tasks)
    assert not transfer.kept_for(kept, "runs/b/step_6", settings, tasks)  # another checkpoint
    assert not transfer.kept_for(kept, "runs/a/step_6", {**settings, "seed": 1}, tasks)
    assert not transfer.kept_for(kept, "runs/a/step_6", settings, tasks[:1])


def test_unpaired_rewards_are_refused(transfer: ModuleType) -> None:
    with pytest.raises(ValueError, match="unpaired"):
        transfer.paired_line([0.0], [0.0, 1.0])


@pytest.mark.skipif(tau2_data_missing("tasks.json"), reason=TAU2_NO_DATA)
def test_a_smoke_run_plays_both_models_and_resumes(tmp_path: Path) -> None:
    env_dir = tmp_path / "tau2_retail"
    import_tau2_env(TAU2_RETAIL, env_dir)
    out = tmp_path / "transfer"
    cmd = [sys.executable, str(REPO / "benchmarks" / "erpo_transfer.py"), str(out), "--smoke"]
    cmd += ["--env", str(env_dir), "--limit", "3"]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    rows = [json.loads(line) for line in (env_dir / "tasks.jsonl").read_text().splitlines()]
    test_ids = [row["id"] for row in rows if "test" in row["split"]][:3]
    for label in ("base", "trained"):
        played = json.loads((out / f"{label}.json").read_text())
        assert played["tasks"] == test_ids and len(played["rewards"]) == 3
        episodes = [
            json.loads(line) for line in (out / f"{label}_trajectories.jsonl").read_text().splitlines()
        ]
        # each reward is its own task's: the env plays "12" before "5", the split lists "5" first
        assert [e["task_id"] for e in episodes] == test_ids
        assert [e["reward"] for e in episodes] == played["rewards"]
    md = (out / "transfer.md").read_text()
    labels = [row.split("|")[1].strip() for row in md.splitlines() if row.startswith("| ")]
    assert labels == ["model", "do nothing", "base", "trained"]
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "base: played before, kept" in again.stdout and "trained: played before, kept" in again.stdout
    fewer = [*cmd[:-1], "2"]  # other tasks: played again, never mixed with the kept ones
    changed = subprocess.run(fewer, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert changed.returncode == 0 and "base: played before, kept" not in changed.stdout
    # the base alone, before any checkpoint exists: no trained row, and nothing played for it
    alone = subprocess.run(
        [*cmd[:2], str(tmp_path / "alone"), *cmd[3:], "--only", "base"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert not (tmp_path / "alone" / "trained.json").exists()
    rows = (tmp_path / "alone" / "transfer.md").read_text().splitlines()
    assert [r.split("|")[1].strip() for r in rows if r.startswith("| ")] == ["model", "do nothing", "base"]


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    script = str(REPO / "benchmarks" / "erpo_transfer.py")
    missing = subprocess.run(
        [sys.executable, script, str(tmp_path / "o"), "--env", str(tmp_path / "nowhere"), "--smoke"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and "envforge import tau2" in missing.stderr
    assert "Traceback" not in missing.stderr
