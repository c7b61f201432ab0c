"""The smallest packaged model as agent through the real local server, end to end.

`envforge eval ... --agent local/smollm2` assembles SmolLM2-135M from its package (hash-checked),
starts llama-cpp-python's OpenAI-compatible server on 127.0.0.1, plays two retail_orders tasks
against the scripted user, and stops the server: the trials hold the model's own text, and the
server's pid is gone afterwards — also when the run is interrupted with Ctrl-C. Skipped only when
the `local` extra is not installed (`make setup` installs it).
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

from support.paths import REPO
from support.signals import interruptible
from support.skips import LOCAL_MODEL_MISSING, local_model_missing

pytestmark = pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)

ENVFORGE = [sys.executable, "-m", "envforge.cli"]
TASKS = "retail_orders-0-00000,retail_orders-0-00001"
PID_LINE = re.compile(r"local agent: smollm2 \(pid (\d+)\) at http://127\.0\.0\.1:(\d+)/v1")


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ENVFORGE_CACHE": str(tmp_path / "cache"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "COLUMNS": "200",
    }


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_eval_with_the_local_agent_records_real_model_text_and_stops_the_server(tmp_path: Path) -> None:
    out = tmp_path / "run"
    started = time.perf_counter()
    proc = subprocess.run(
        [
            *ENVFORGE,
            "eval",
            str(REPO / "envs" / "retail_orders"),
            "--agent",
            "local/smollm2",
            "--user",
            "scripted",
            "--tasks",
            TASKS,
            "--out",
            str(out),
            "--max-turns",
            "2",
            "--concurrency",
            "1",
        ],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=300,
    )
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    output = proc.stdout + proc.stderr  # the console writes to stderr
    match = PID_LINE.search(output)
    assert match, output[-2000:]
    assert _gone(int(match.group(1)))
    records = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == sorted(TASKS.split(","))
    for record in records:
        assert record["status"] != "infra_failure", record["error"]
        said = [m for m in record["messages"] if m["role"] == "assistant"]
        assert said, record
        assert any((m["content"] or "").strip() or m["tool_calls"] for m in said)
        assert record["usage"]["agent"]["completion_tokens"] > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["agent"] == "local/smollm2"
    assert "agent turns with a valid tool call" in output
    assert elapsed < 240, f"took {elapsed:.0f} s"


def test_ctrl_c_stops_the_local_server(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            *ENVFORGE,
            "eval",
            str(REPO / "envs" / "retail_orders"),
            "--agent",
            "local/smollm2",
            "--tasks",
            TASKS,
            "--out",
            str(tmp_path / "run"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(tmp_path),
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
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=60)  # read on: a child blocked on a full pipe could not exit
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid)
