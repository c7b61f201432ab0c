"""inspect_ai's score through `envforge.integrations.inspect_tasks` is `envforge score`'s, on every
bundled env.

`inspect_ai.eval` runs each env's task in-process with inspect's stock `mockllm/model`, whose turns
the harness's built-in agents answer (the oracle, the no-op and the adversaries `spray`,
`read_all`, `double_write`, `golden_prefix`; one per run of a task) against envforge's scripted user; the
log is written to a temporary folder and read back with `read_eval_log`. The calls and messages the
log shows are scored by `envforge.score_calls` (what `envforge score` runs). The two rewards must
be equal; the oracle earns 1, the no-op and every adversary whose run is judged (`counts`) less.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

inspect_ai = pytest.importorskip("inspect_ai", reason="inspect_ai is the `inspect` extra")

from inspect_ai.log import read_eval_log  # noqa: E402

from envforge import score_calls_async  # noqa: E402
from envforge.harness import request_text  # noqa: E402
from envforge.integrations.inspect_tasks import envforge_task  # noqa: E402
from envforge.server import load_env  # noqa: E402
from envforge.synth import ToolShape, counts, load_policy_rules, load_tasks  # noqa: E402

from support.inspect_play import AGENT_KEY, actions_of, agents_model  # noqa: E402
from support.paths import bundled_env_dirs  # noqa: E402

BUNDLED = {p.name: p for p in bundled_env_dirs()}
AGENTS = ("oracle", "noop", "spray", "read_all", "double_write", "golden_prefix")
TASKS_PER_ENV = 2


@pytest.mark.parametrize("env_name", sorted(BUNDLED))
def test_inspect_scores_equal_envforge_score(env_name: str, tmp_path: Path) -> None:
    env_dir = BUNDLED[env_name]
    env = load_env(env_dir)
    policy = load_policy_rules(env)
    # the first tasks whose requests differ (the fake model knows a sample by its opening)
    openings = {request_text(t): t for t in reversed(load_tasks(env_dir))}
    tasks = {t.id: t for t in sorted(openings.values(), key=lambda t: t.id)[:TASKS_PER_ENV]}
    task = envforge_task(env_dir, task_ids=list(tasks))
    model = agents_model(env, tasks, AGENTS, policy)
    (log,) = inspect_ai.eval(task, model=model, epochs=len(AGENTS), log_dir=str(tmp_path), display="none")
    log = read_eval_log(log.location)
    assert log.status == "success", log.error
    assert log.samples is not None and len(log.samples) == TASKS_PER_ENV * len(AGENTS)
    shapes = [
        ToolShape(
            name=t.name, read_only=t.read_only, parameters=tuple(t.parameters), required=tuple(t.required)
        )
        for t in env.tools.values()
    ]
    played = sorted(str(s.store[AGENT_KEY]) for s in log.samples)
    assert played == sorted(f"{a}:{t}" for a in AGENTS for t in {str(s.id) for s in log.samples})
    for sample in log.samples:
        name, task_id = str(sample.store[AGENT_KEY]).split(":", 1)
        assert task_id == str(sample.id)
        (score,) = (sample.scores or {}).values()
        assert isinstance(score.value, float)
        assert score.metadata is not None and score.metadata["task_id"] == task_id
        assert not score.metadata["user_error"], (task_id, name)
        calls, said = actions_of(sample.messages)
        replayed = asyncio.run(score_calls_async(env_dir, tasks[task_id], calls, said))
        kept = score.metadata["parts"].get("policy", 1.0) == 1.0
        # `envforge score` replays an action list, which has no conversation to judge the policy
        # by; the inspect sample has one: a broken rule costs the whole reward there
        assert score.value == pytest.approx(replayed.reward if kept else 0.0, abs=1e-9), (task_id, name)
        task = tasks[task_id]
        if name == "oracle":
            assert score.value == 1.0, (task_id, score.explanation)
        elif name == "noop":  # unless doing nothing is the task's answer (τ²'s refusals)
            assert score.value < 1.0 or (replayed.state_match and not task.required_outputs), task_id
        elif replayed.state_match and not task.required_outputs:
            continue  # nothing but the state to earn, and it is the golden one (a refusal)
        elif counts(
            name,
            task,
            shapes,
            reached_golden=replayed.state_match,
            policy=policy,
            message=said[-1] if said else "",
        ):
            assert score.value < 1.0, (task_id, name)
