"""`examples/openenv_episode.py --smoke` runs offline and exits 0 (what CI runs): one episode
served by OpenEnv's own app and played through its stock client, scored by envforge."""

from __future__ import annotations

import os
import subprocess
import sys

from envforge.server import load_env
from envforge.synth import load_policy_rules, load_tasks

from support.paths import REPO

EXAMPLE = REPO / "examples" / "openenv_episode.py"
LIBRARY = REPO / "envs" / "library"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )


def test_the_smoke_run_plays_one_scored_episode_on_a_tiny_model() -> None:
    done = _run("--smoke")
    assert done.returncode == 0, done.stderr[-2000:]
    first = load_tasks(LIBRARY)[0].id
    assert f"model played {first} through OpenEnv's client: reward " in done.stdout


def test_the_oracle_earns_1_through_the_example() -> None:
    policy = load_policy_rules(load_env(LIBRARY))
    assert policy is not None
    task = next(
        t for t in load_tasks(LIBRARY) if any(policy.needs_confirmation(c.name) for c in t.golden_calls)
    )
    done = _run("--smoke", "--agent", "oracle", "--task", task.id)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"oracle played {task.id} through OpenEnv's client: reward 1.0 (completed" in done.stdout
    assert "Shall I proceed? (yes/no)" in done.stdout  # the simulated user was asked, and said yes


def test_bad_input_is_one_line_and_exit_2() -> None:
    done = _run("--agent", "oracle", "--task", "library-9-99999")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: no task 'library-9-99999' in " + str(REPO / "envs" / "library")
    ]
