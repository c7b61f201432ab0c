"""`--server`: the harness against a real `envforge serve` subprocess, killed mid-run; and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from envforge.harness import EvalConfig, Limits, OracleAgent, RunDir, run_eval
from envforge.server import load_env
from envforge.synth import load_policy_rules, load_tasks

from support.paths import REPO
from support.serving import free_port

RETAIL = REPO / "envs" / "retail_orders"
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


class Serve:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Serve:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envforge.cli", "serve", str(RETAIL), "--port", str(self.port)],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("envforge serve did not come up")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def serve() -> Iterator[Serve]:
    server = Serve(free_port())
    yield server.start()
    server.kill()


class SlowOracle(OracleAgent):
    async def respond(self, messages, tools, client):
        await anyio.sleep(0.05)
        return await super().respond(messages, tools, client)


async def test_server_killed_mid_run_then_resume_runs_each_trial_once(serve: Serve, tmp_path: Path) -> None:
    ids = [t.id for t in load_tasks(RETAIL)[:4]]
    config = EvalConfig(
        agent="oracle",
        task_ids=ids,
        trials=2,
        concurrency=2,
        server=serve.url,
        limits=Limits(trial_timeout_s=20),
    )
    done: list[str] = []

    def on_record(record) -> None:
        done.append(record.status)
        if len(done) == 2:
            serve.kill()

    rules = load_policy_rules(load_env(RETAIL))  # the oracle keeps retail's policy, as eval's does
    await run_eval(
        [RETAIL], config, tmp_path, on_record=on_record, make_agent=lambda t, s: SlowOracle(t, rules)
    )
    first = RunDir(tmp_path).read_records()
    assert len(first) == 8
    assert Counter(r.status for r in first)["infra_failure"] >= 4
    serve.start()
    _, records = await run_eval([RETAIL], config, tmp_path, resume=True)
    assert [r.status for r in records] == ["completed"] * 8 and [r.reward for r in records] == [1.0] * 8
    completed = [r.trial_key for r in RunDir(tmp_path).read_records() if r.status == "completed"]
    assert sorted(completed) == sorted(set(completed)) and len(completed) == 8


def test_cli_eval_json_prints_one_summary_object(tmp_path: Path) -> None:
    ids = ",".join(t.id for t in load_tasks(RETAIL)[:2])
    args = [
        sys.executable,
        "-m",
        "envforge.cli",
        "eval",
        str(RETAIL),
        "--agent",
        "oracle",
        "--user",
        "scripted",
    ]
    args += ["--trials", "2", "--concurrency", "2", "--out", str(tmp_path / "run"), "--tasks", ids, "--json"]
    out = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=120, check=True)
    summary = json.loads(out.stdout)
    assert summary["overall"]["pass_hat_k"] == [1.0, 1.0]
    assert summary["envs"]["retail_orders"]["n_trials"] == 4
    again = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--resume" in again.stderr
