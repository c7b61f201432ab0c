"""A new user without an API key: `envforge synth env DOCS -o DIR --model local`, offline.

The packaged Qwen2.5-Coder-0.5B is served by the real local server for the run. What it writes is
not under test (a 0.5B model is usually rejected at a gate); what the user gets is: an accepted
env whose synthesis.json names the real model, or exit 1 with one line per gate saying where it
stopped and why; either way the server is gone afterwards, also when the run is interrupted.
Slow (minutes on two busy cores; docs/benchmarks/local-models.md has the timings). Skipped
only when the `local` extra is not installed (`make setup` installs it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from envforge.synth.envsynth import GATES

from support.paths import REPO
from support.signals import interruptible
from support.skips import LOCAL_MODEL_MISSING, local_model_missing

pytestmark = pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)

ENVFORGE = [sys.executable, "-m", "envforge.cli"]
DOCS = REPO / "envs" / "gym" / "docs"  # 6 tools
PID_LINE = re.compile(r"local synth: qwen2\.5-coder-0\.5b \(pid (\d+)\) at http://127\.0\.0\.1:\d+/v1")
MODEL = "local/qwen2.5-coder-0.5b"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "200"}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _gone(pid)


def test_synth_env_with_the_packaged_model_ends_accepted_or_says_why_per_gate(tmp_path: Path) -> None:
    out = tmp_path / "envs" / "gym"
    result = subprocess.run(
        [*ENVFORGE, "synth", "env", str(DOCS), "-o", str(out), "--model", "local", "--max-rounds", "0"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=1500,
    )
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text[-3000:]
    match = PID_LINE.search(text)
    assert match is not None, text[-3000:]
    assert _wait_gone(int(match.group(1)))
    if result.returncode == 0:
        report = json.loads((out / "synthesis.json").read_text())
        assert report["status"] == "accepted" and report["model"] == MODEL
        return
    assert result.returncode == 1, text[-3000:]
    assert not out.exists()
    report = json.loads((tmp_path / "envs" / ".rejected" / "gym" / "synthesis.json").read_text())
    assert report["model"] == MODEL and report["llm_calls"] >= 5
    lines = [line.strip() for line in text.splitlines()]
    for gate in GATES:  # one line per gate: passed, FAILED with its first problem, or not reached
        (line,) = [x for x in lines if x.startswith(f"{gate}: ")]
        assert re.match(rf"{gate}: (passed|FAILED \d+/\d+ checks: .+|not reached)", line), line
    assert sum("FAILED" in x for x in lines) == 1
    assert re.search(r"^error: gym rejected \(.+\); nothing written to ", text, re.M), text[-2000:]


def test_ctrl_c_during_synthesis_stops_the_local_server(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*ENVFORGE, "synth", "env", str(DOCS), "-o", str(tmp_path / "gym"), "--model", "local"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        preexec_fn=interruptible,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    pid = None
    deadline = time.monotonic() + 180
    while pid is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if match := PID_LINE.search(line):
            pid = int(match.group(1))
    assert pid is not None, "".join(lines)[-2000:]
    assert psutil.pid_exists(pid)
    time.sleep(2)  # inside the first model call
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=60)  # read on: a child blocked on a full pipe could not exit
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert _wait_gone(pid)
    assert not (tmp_path / "gym").exists()


def test_synth_tasks_rewrites_through_the_packaged_model(tmp_path: Path) -> None:
    # `--llm local` was handed to litellm as a model name ("LLM Provider NOT provided").
    out = tmp_path / "tasks.jsonl"
    result = subprocess.run(
        [
            *ENVFORGE,
            "synth",
            "tasks",
            str(REPO / "envs" / "gym"),
            "--n",
            "2",
            "--out",
            str(out),
            "--llm",
            "local",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    assert re.search(r"rewrites kept \d+, rejected \d+", text), text[-2000:]
    assert len(out.read_text().splitlines()) == 2
    match = re.search(r"local rewrite: qwen2\.5-coder-0\.5b \(pid (\d+)\)", text)
    assert match is not None, text[-2000:]
    assert _wait_gone(int(match.group(1)))
