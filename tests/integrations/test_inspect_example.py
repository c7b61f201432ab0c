"""`examples/inspect_eval.py --smoke` runs offline and exits 0 (what CI runs): one sample played by
inspect's react agent against envforge's scripted user, scored 1, its log written where asked and
read back with inspect's `read_eval_log`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="inspect_ai is the `inspect` extra")

from inspect_ai.log import read_eval_log

from support.paths import REPO

EXAMPLE = REPO / "examples" / "inspect_eval.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )


def test_the_smoke_run_scores_one_sample_and_writes_its_log(tmp_path: Path) -> None:
    done = _run("--smoke", "--log-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "car_rental-0-00000: 1.0 (envforge reward 1" in done.stdout
    assert f"view: inspect view --log-dir {tmp_path}" in done.stdout
    (path,) = tmp_path.glob("*.eval")
    log = read_eval_log(str(path))
    assert log.status == "success" and log.samples is not None and len(log.samples) == 1
    (score,) = (log.samples[0].scores or {}).values()
    assert score.value == 1.0


def test_an_env_folder_with_nothing_to_play_is_one_line(tmp_path: Path) -> None:
    done = _run("--smoke", "--env", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {tmp_path} is not an env folder (no env.toml)"
