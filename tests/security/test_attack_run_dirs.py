"""Attacks on run directories: concurrent writers, a forged or missing manifest, corrupt lines.

Each test is the attack as an operator (or a crash) would make it, through the real `envforge`
CLI in separate processes; the run directory must stay owned by one run and readable by every
reader in the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from envforge.synth import load_tasks

from support.paths import REPO
from support.serving import run_envforge

RETAIL = REPO / "envs" / "retail_orders"
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "COLUMNS": "300"}


def envforge(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_envforge(*args, env=ENV, timeout=timeout)


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "envforge.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def ids(n: int) -> str:
    return ",".join(t.id for t in load_tasks(RETAIL)[:n])


def keys_in(run: Path) -> Counter[str]:
    """Trial keys of the whole, well-formed records in trials.jsonl (read independently of the code
    under attack)."""
    keys: Counter[str] = Counter()
    path = run / "trials.jsonl"
    for line in path.read_bytes().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("status") in STATUSES:
            keys[record["trial_key"]] += 1
    return keys


STATUSES = {"completed", "infra_failure", "context_overflow", "timeout", "max_turns", "max_errors"}


class GatedModel:
    """An OpenAI-compatible model on 127.0.0.1 that answers "Done.": the first `free` calls at once,
    later ones only once `gate` is set — so a run using it stays busy for as long as a test needs."""

    def __init__(self, free: int) -> None:
        self.gate = threading.Event()
        calls = {"n": 0}
        gate = self.gate

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                calls["n"] += 1
                if calls["n"] > free:
                    gate.wait(60)
                message = {"role": "assistant", "content": "Done."}
                body = {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "slow",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gated_model() -> Iterator[GatedModel]:
    model = GatedModel(free=2)
    yield model
    model.gate.set()
    model.close()


def wait_for_records(run: Path, n: int, proc: subprocess.Popen[str], limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while sum(keys_in(run).values()) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first run never wrote a record"
        time.sleep(0.1)


def test_second_resume_on_a_run_in_use_refuses_and_no_trial_runs_twice(
    tmp_path: Path, gated_model: GatedModel
) -> None:
    """Found: two `--resume` at once ran 16 of 24 trials twice. The second must refuse (exit 2)."""
    run = tmp_path / "run"
    args = ["eval", str(RETAIL), "--agent", "openai/gated", "--agent-api-base", gated_model.url]
    args += ["--tasks", ids(12), "--trials", "2", "--concurrency", "1", "--out", str(run)]
    first = spawn(*args)
    try:
        wait_for_records(run, 2, first)  # the first run now waits on the model: it holds the directory
        try:
            second = envforge(*args, "--resume", timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the second resume ran trials beside the first: {dict(keys_in(run))}")
        assert second.returncode == 2, f"the second resume ran: {dict(keys_in(run))}"
        assert first.poll() is None
        assert "in use" in " ".join(second.stderr.split())
        assert len(second.stderr.strip().splitlines()) <= 3  # a short message, no traceback
        assert "Traceback" not in second.stderr
        # The owner dies the hard way: the OS drops its lock, and a resume finishes the run.
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        gated_model.gate.set()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    third = envforge(*args, "--resume")
    assert third.returncode == 0, third.stderr
    assert keys_in(run) == Counter({k: 1 for k in keys_in(run)}), "a trial ran twice"
    assert len(keys_in(run)) == 24


def test_resume_without_manifest_refuses_to_adopt_another_agents_records(tmp_path: Path) -> None:
    """Found: with manifest.json deleted, `--resume --agent noop` adopted oracle's records as its own."""
    run = tmp_path / "run"
    done = envforge("eval", str(RETAIL), "--agent", "oracle", "--tasks", ids(2), "--out", str(run))
    assert done.returncode == 0, done.stderr
    before = (run / "trials.jsonl").read_bytes()
    (run / "manifest.json").unlink()
    attack = envforge(
        "eval", str(RETAIL), "--agent", "noop", "--tasks", ids(2), "--out", str(run), "--resume", "--json"
    )
    assert attack.returncode == 2, attack.stdout
    assert "no manifest.json" in " ".join(attack.stderr.split())
    assert attack.stdout == ""  # no summary claiming oracle's rewards for noop
    assert (run / "trials.jsonl").read_bytes() == before
    # Not resuming does not adopt them either.
    fresh = envforge("eval", str(RETAIL), "--agent", "noop", "--tasks", ids(2), "--out", str(run))
    assert fresh.returncode == 2 and (run / "trials.jsonl").read_bytes() == before


def test_torn_line_then_resume_leaves_a_run_that_report_reads(tmp_path: Path) -> None:
    """Found: a torn line plus `--resume` (the documented crash path) broke `envforge report` for good."""
    run = tmp_path / "run"
    args = ["eval", str(RETAIL), "--agent", "oracle", "--tasks", ids(3), "--out", str(run)]
    assert envforge(*args).returncode == 0
    trials = run / "trials.jsonl"
    lines = trials.read_bytes().splitlines(keepends=True)
    trials.write_bytes(b"".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # killed mid-write
    resumed = envforge(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "line 3" in " ".join(resumed.stderr.split())  # the torn line is reported, and re-run
    report = envforge("report", str(run), "--json")
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)["overall"]
    assert summary["n_trials"] == 3 and summary["pass_hat_k"] == [1.0]
    assert "line 3" in " ".join(report.stderr.split())


@pytest.mark.parametrize("damage", ["bad_byte", "not_a_record"])
def test_corrupt_middle_line_resume_and_report_agree(tmp_path: Path, damage: str) -> None:
    """Found: one bad byte made `--resume` crash, and resume and report disagreed about corrupt lines.

    Both must skip the same line, say which, and resume must run that trial again.
    """
    run = tmp_path / "run"
    args = ["eval", str(RETAIL), "--agent", "oracle", "--tasks", ids(3), "--out", str(run)]
    assert envforge(*args).returncode == 0
    trials = run / "trials.jsonl"
    lines = trials.read_bytes().splitlines(keepends=True)
    victim = json.loads(lines[1])["trial_key"]
    if damage == "bad_byte":
        lines[1] = lines[1].replace(b'"reward"', b'"rew\xffrd"', 1)
    else:
        lines[1] = json.dumps({**json.loads(lines[1]), "status": "pwned"}).encode() + b"\n"
    trials.write_bytes(b"".join(lines))

    report = envforge("report", str(run), "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["overall"]["n_trials"] == 2
    assert "at line 2;" in " ".join(report.stderr.split())

    resumed = envforge(*args, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert "at line 2;" in " ".join(resumed.stderr.split())
    assert keys_in(run)[victim] == 1  # the skipped trial ran again, once
    assert json.loads(resumed.stdout)["overall"]["n_trials"] == 3
    again = envforge("report", str(run), "--json")
    assert json.loads(again.stdout)["overall"]["n_trials"] == 3
