"""The smallest packaged model as simulated user (and judge) through the real local server.

`envforge eval ... --agent oracle --user local/smollm2 --judge local/smollm2` serves SmolLM2-135M on
127.0.0.1 for the user and the judge — one server per role, or one for both with
`--local-servers shared` — plays a retail_orders task, and stops every server. The user's lines in
the trial are the model's own words (not the scripted user's request), its tokens are counted, and
no server outlives the run. Skipped only when the `local` extra is not installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from envforge.harness import request_text
from envforge.synth import load_tasks

from support.paths import REPO
from support.skips import LOCAL_MODEL_MISSING, local_model_missing

pytestmark = pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)

TASK = "retail_orders-0-00001"
SERVER_LINE = re.compile(r"local ([a-z, ]+): smollm2 \(pid (\d+)\) at http://127\.0\.0\.1:\d+/v1")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize(
    ("local_servers", "servers"), [("per-role", {"user": 1, "judge": 1}), ("shared", {"user, judge": 1})]
)
def test_eval_with_a_local_user_and_judge(
    tmp_path: Path, local_servers: str, servers: dict[str, int]
) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envforge.cli",
            "eval",
            str(REPO / "envs" / "retail_orders"),
            "--agent",
            "oracle",
            "--user",
            "local/smollm2",
            "--judge",
            "local/smollm2",
            "--local-servers",
            local_servers,
            "--tasks",
            TASK,
            "--out",
            str(out),
            "--max-turns",
            "2",
            "--concurrency",
            "1",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "COLUMNS": "200"},
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    started = SERVER_LINE.findall(output)
    assert {roles: started.count((roles, pid)) for roles, pid in started} == servers, output[-2000:]
    assert all(_gone(int(pid)) for _, pid in started)
    (record,) = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert record["status"] != "infra_failure", record["error"]
    task = next(t for t in load_tasks(REPO / "envs" / "retail_orders") if t.id == TASK)
    said = [m["content"] for m in record["messages"] if m["role"] == "user"]
    assert said and all(s.strip() for s in said)
    # the model's words, not the scripted user's: its opening, or (where that opening spoke as the
    # agent twice and was replaced by the request, `LLMUser.start`) its replies after it
    assert said[0] != request_text(task) or (len(said) > 1 and said[1] != request_text(task))
    assert record["usage"]["user"]["completion_tokens"] > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["user"], manifest["judge"]) == ("local/smollm2", "local/smollm2")
