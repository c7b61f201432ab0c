"""A new user writes tasks elsewhere with `synth tasks --out FILE` and then checks that file with
`envforge check ENV_DIR --tasks FILE`, without copying the env folder; the realism columns come
with a legend. Wrong files get one `error:` line, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.paths import ENVS, REPO


def envforge(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "envforge.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )


def test_check_reads_the_file_synth_tasks_out_wrote(tmp_path: Path) -> None:
    out = tmp_path / "gym-tasks.jsonl"
    made = envforge("synth", "tasks", str(ENVS / "gym"), "--n", "3", "--seed", "7", "--out", str(out))
    assert made.returncode == 0, made.stderr
    checked = envforge("check", str(ENVS / "gym"), "--tasks", str(out), "--json")
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["passed"] and report["envs"][0]["tasks"] == 3
    assert "proc: instructions naming a tool" in checked.stderr  # the legend, under one env's table


def test_check_help_says_what_the_realism_columns_mean() -> None:
    shown = envforge("check", "--help")
    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())
    assert "--tasks" in text and "proc = instructions naming a tool" in text
    assert "dup = repeated tasks" in text


def test_check_tasks_refuses_a_folder_two_envs_and_another_envs_tasks(tmp_path: Path) -> None:
    folder = envforge("check", str(ENVS / "gym"), "--tasks", str(tmp_path))
    assert folder.returncode == 2 and "is a directory" in folder.stderr and "Traceback" not in folder.stderr
    tasks = tmp_path / "t.jsonl"
    tasks.write_text((ENVS / "retail_orders" / "tasks.jsonl").read_text().splitlines()[0] + "\n")
    two = envforge("check", str(ENVS / "gym"), str(ENVS / "retail_orders"), "--tasks", str(tasks))
    assert two.returncode == 2 and "exactly one env folder" in two.stderr
    other = envforge("check", str(ENVS / "gym"), "--tasks", str(tasks))
    assert other.returncode == 2 and "holds tasks of retail_orders, not only gym" in other.stderr
    tasks.write_text("{not json\n")
    broken = envforge("check", str(ENVS / "gym"), "--tasks", str(tasks))
    assert broken.returncode == 2 and f"{tasks}:1: not a task" in broken.stderr
    assert "Traceback" not in broken.stderr
