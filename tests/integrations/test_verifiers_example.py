"""`examples/verifiers_eval.py` and verifiers' own `vf-eval` CLI run envforge's env end to end:
against a real OpenAI-compatible server on 127.0.0.1 (a fake model answering as envforge's
oracle), and, with `--smoke`, against the packaged local model (what CI runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed (docs/integrations.md#verifiers)")

from envforge.harness import build_agent
from envforge.server import load_env
from envforge.synth import load_policy_rules, load_tasks

from support.fake_llm import FakeOpenAI
from support.paths import ENVS, REPO
from support.skips import LOCAL_MODEL_MISSING, local_model_missing
from support.vf_play import KEY_VAR, agent_brain

EXAMPLE = REPO / "examples" / "verifiers_eval.py"
CAR = ENVS / "car_rental"
VF_EVAL = Path(sys.executable).parent / "vf-eval"


def _env() -> dict[str, str]:
    return {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", KEY_VAR: "unused"}


def _oracle() -> FakeOpenAI:
    task = load_tasks(CAR)[0]
    env = load_env(CAR)
    agent = build_agent("oracle", task, seed=0, policy=env.policy, rules=load_policy_rules(env))
    return FakeOpenAI(agent_brain(agent, [], []))


def test_the_example_scores_an_episode_of_a_served_model() -> None:
    with _oracle() as fake:
        args = ["--base-url", fake.url, "--model", "oracle", "--api-key-var", KEY_VAR]
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), *args, "--env", str(CAR), "--limit", "1"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=_env(),
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"car_rental/{load_tasks(CAR)[0].id}: reward 1.00" in done.stdout


def test_vf_eval_runs_the_env_by_its_module_name(tmp_path: Path) -> None:
    """verifiers' own CLI finds the taskset, the env and the harness by the id `envforge_verifiers`
    and records envforge's reward in its traces."""
    with _oracle() as fake:
        taskset = ["--env.taskset.env-dirs", json.dumps([str(CAR)]), "--env.taskset.limit", "1"]
        client = ["--client.base-url", fake.url, "--client.api-key-var", KEY_VAR]
        done = subprocess.run(
            [
                str(VF_EVAL),
                "envforge_verifiers",
                *taskset,
                "-m",
                "oracle",
                *client,
                "--push",
                "False",
                "-o",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**_env(), "PYTHONPATH": str(REPO / "examples")},
            timeout=300,
        )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    (traces,) = tmp_path.glob("*/traces.jsonl")
    (line,) = traces.read_text().splitlines()
    assert '"envforge"' in line and '"score":1.0' in line.replace(" ", ""), line[:2000]


@pytest.mark.skipif(local_model_missing(), reason=LOCAL_MODEL_MISSING)
def test_the_smoke_run_scores_one_episode_of_the_packaged_model() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--smoke"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"car_rental/{load_tasks(CAR)[0].id}: reward " in done.stdout
