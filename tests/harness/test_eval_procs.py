"""`envforge eval --procs N`: one run spread over N real child processes.

What must hold: the run log does not depend on N (same seed, same records in the same order as a
one-process run), a child that dies is named with its unfinished trials and `--resume` finishes
the run, and Ctrl-C stops every child and keeps what they finished.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from envforge.harness import EvalConfig, RunDir, read_trials, run_eval

from support.fake_llm import FakeOpenAI, completion
from support.paths import REPO
from support.probes import pid_alive
from support.signals import interruptible

ENVS = [REPO / "envs" / "retail_orders", REPO / "envs" / "it_tickets"]
RUN_FIELDS = re.compile(rb'"(run_id|started_at|duration_s)":("[^"]*"|[0-9.e+-]+)')


def comparable(log: Path) -> bytes:
    """The run log's bytes less the run's name and the wall clock (no two runs share those)."""
    return RUN_FIELDS.sub(rb'"\1":_', log.read_bytes())


def test_the_run_log_is_the_same_bytes_whatever_the_number_of_processes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    def run(out: Path, **kw: Any) -> None:
        config = EvalConfig(agent="random", trials=2, limit=4, seed=11, **kw)
        anyio.run(lambda: run_eval(ENVS, config, out))

    run(tmp_path / "one", concurrency=1)
    run(tmp_path / "two", concurrency=5, procs=2)
    one, two = comparable(tmp_path / "one" / "trials.jsonl"), comparable(tmp_path / "two" / "trials.jsonl")
    assert one.count(b"\n") == 16
    assert two == one
    assert not (tmp_path / "two" / "shards").exists()
    assert "Fatal Python error" not in capfd.readouterr().err  # the children end cleanly


def slow_brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    time.sleep(0.1)
    return 200, completion("All done.")


def eval_cli(out: Path, url: str, *more: str, **popen: Any) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "envforge.cli", "eval", *map(str, ENVS), "--limit", "3"]
    command += ["--agent", "openai/fake", "--agent-api-base", url, "--procs", "2", "--concurrency", "2"]
    env = os.environ | {"OPENAI_API_KEY": "x", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.Popen(
        [*command, "--out", str(out), *more],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        **popen,
    )


def children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(p) for p in found]


def wait_for(what: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := what():
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


def shard_records(out: Path) -> int:
    logs = (out / "shards").glob("*/trials.jsonl")
    return sum(log.read_bytes().count(b"\n") for log in logs)


def keys(out: Path) -> list[str]:
    return [r.trial_key for r in RunDir(out).read_records()]


def test_a_killed_process_is_named_with_its_trials_and_resume_finishes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with FakeOpenAI(slow_brain) as fake:
        run = eval_cli(out, fake.url)
        kids = wait_for(lambda: len(children(run.pid)) == 2 and children(run.pid))
        wait_for(lambda: shard_records(out) >= 2)
        os.kill(kids[1], signal.SIGKILL)
        _, err = run.communicate(timeout=120)
        assert run.returncode == 1, err
        named = re.search(r"eval process \d \(pid (\d+)\) exited with status -9 before finishing (\d+)", err)
        assert named and int(named[1]) == kids[1], err
        assert "--resume runs the rest" in err
        assert not (out / "shards").exists()
        done = keys(out)
        assert 0 < len(done) == len(set(done)) <= 6 - int(named[2])

        again = eval_cli(out, fake.url, "--resume")
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
    final = keys(out)
    assert final[: len(done)] == done  # nothing written is rewritten
    assert len(final) == len(set(final)) == 6


def test_ctrl_c_stops_every_process_and_keeps_what_they_finished(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with FakeOpenAI(slow_brain) as fake:
        run = eval_cli(out, fake.url, preexec_fn=interruptible, start_new_session=True)
        kids = wait_for(lambda: len(children(run.pid)) == 2 and children(run.pid))
        wait_for(lambda: shard_records(out) >= 2)
        t0 = time.monotonic()
        os.killpg(run.pid, signal.SIGINT)  # as a terminal does: the whole foreground group
        run.communicate(timeout=60)
        assert time.monotonic() - t0 < 15
        assert run.returncode != 0
        assert not any(pid_alive(k) for k in kids)
        assert not (out / "shards").exists()
        assert len(keys(out)) >= 2
        again = eval_cli(out, fake.url, "--resume")
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
    assert sorted(keys(out)) == sorted(set(keys(out))) and len(keys(out)) == 6


def test_a_killed_parent_leaves_no_process_and_resume_folds_what_they_finished(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with FakeOpenAI(slow_brain) as fake:
        run = eval_cli(out, fake.url)
        kids = wait_for(lambda: len(children(run.pid)) == 2 and children(run.pid))
        wait_for(lambda: shard_records(out) >= 2)
        run.kill()  # SIGKILL: no chance to stop the children or fold their logs
        run.communicate(timeout=60)
        wait_for(lambda: not any(pid_alive(k) for k in kids), timeout=15)
        finished = {
            r.trial_key: r.started_at
            for log in (out / "shards").glob("*/trials.jsonl")
            for r in read_trials(log).records
        }
        assert len(finished) >= 2 and keys(out) == []
        again = eval_cli(out, fake.url, "--resume")
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
    assert not (out / "shards").exists()
    records = RunDir(out).read_records()
    assert len(records) == len({r.trial_key for r in records}) == 6
    assert {r.trial_key: r.started_at for r in records if r.trial_key in finished} == finished  # not re-run


@pytest.mark.parametrize("procs", ["-1", "\u00b2"])  # "²" is a digit to str.isdigit, not to int()
def test_a_bad_process_count_is_one_line(tmp_path: Path, procs: str) -> None:
    arguments = [*f"eval {ENVS[0]} --agent oracle --out {tmp_path / 'run'}".split(), "--procs", procs]
    run = subprocess.run(
        [sys.executable, "-m", "envforge.cli", *arguments], capture_output=True, text=True, cwd=REPO
    )
    assert run.returncode == 2
    assert "--procs must be a number of processes" in run.stderr and "Traceback" not in run.stderr
