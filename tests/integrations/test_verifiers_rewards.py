"""verifiers' reward through `envforge.integrations.verifiers` is `envforge score`'s, on every bundled env.

Each run is a real verifiers episode (`Env.run_episode` inside `Env.serving()`, as `vf-eval`
runs it): verifiers' agent, interception server and trace, envforge's episode, scripted user and
composed reward. Only the model is a fake, an OpenAI-compatible server on 127.0.0.1 that replays
the turns of envforge's own agents (`build_agent`): the oracle, the no-op, the adversaries. The
same calls and texts are scored by `envforge.score_calls` (what `envforge score` runs): the rewards
are equal, the oracle earns 1, the no-op and every adversary whose run is judged (`counts`) less.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed (docs/integrations.md#verifiers)")

from envforge import Score, score_calls_async
from envforge.harness import build_agent
from envforge.integrations.verifiers import load_environment
from envforge.server import load_env
from envforge.synth import (
    ToolShape,
    adversary_calls,
    counts,
    load_policy_rules,
    load_tasks,
)

from support.fake_llm import FakeOpenAI
from support.paths import bundled_env_dirs
from support.vf_play import Played, play_served

ADVERSARIES = ("spray", "read_all", "double_write", "golden_prefix")
TASKS_PER_ENV = 1


@pytest.mark.parametrize("env_dir", bundled_env_dirs(), ids=lambda p: p.name)
def test_verifiers_rewards_equal_envforge_score(env_dir: Path) -> None:
    env = load_env(env_dir)
    shapes = [
        ToolShape(
            name=t.name, read_only=t.read_only, parameters=tuple(t.parameters), required=tuple(t.required)
        )
        for t in env.tools.values()
    ]
    policy = load_policy_rules(env)
    vf_env = load_environment([env_dir], limit=TASKS_PER_ENV)
    tasks = {t.id: t for t in load_tasks(env_dir)}
    played = [t.data.task_id for t in vf_env.taskset]
    assert len(played) == TASKS_PER_ENV

    async def run_all() -> list[tuple[str, str, Played, Score]]:
        out = []
        with FakeOpenAI(lambda body: (500, {})) as fake:
            async with vf_env.serving():
                for task_id in played:
                    task = tasks[task_id]
                    for name in ("oracle", "noop", *ADVERSARIES):
                        agent = build_agent(name, task, seed=0, policy=env.policy, rules=policy)
                        if name in ADVERSARIES:  # planned here: over MCP it reads the tool list first
                            agent.calls = adversary_calls(name, task, shapes, policy)  # type: ignore[attr-defined]
                        out.append((task_id, name, await play_served(vf_env, task_id, agent, fake)))
        # envforge's own score of the same calls and texts (each opens a fleet of its own)
        return [
            (t, name, got, await score_calls_async(env_dir, tasks[t], got.calls, got.texts))
            for t, name, got in out
        ]

    for task_id, name, got, score in asyncio.run(run_all()):
        task = tasks[task_id]
        assert got.episode.ok, (task_id, name, got.episode.errors)
        assert got.reward is not None, (task_id, name)
        # `envforge score` replays an action list, which has no conversation to judge the declared
        # policy by; the verifiers rollout has one: a broken rule costs the whole reward there
        assert got.reward == pytest.approx(score.reward if got.policy_kept else 0.0, abs=1e-9), (
            task_id,
            name,
        )
        assert got.parts["envforge/user_error"] == 0.0, (task_id, name)
        if name == "oracle":
            assert got.reward == 1.0, (task_id, got.parts)
        elif name == "noop":  # unless doing nothing is the task's answer (τ²'s refusals)
            assert got.calls == [] and (
                got.reward < 1.0 or (score.state_match and not task.required_outputs)
            ), task_id
        elif score.state_match and not task.required_outputs:
            continue  # nothing but the state to earn, and it is the golden one (a refusal)
        elif counts(name, task, shapes, reached_golden=score.state_match, policy=policy, message=got.message):
            assert got.reward < 1.0, (task_id, name)
