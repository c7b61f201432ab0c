"""OpenEnv's reward through `envforge.integrations.openenv` is `envforge score`'s, on every bundled env.

OpenEnv's own app (`create_app`) serves the bundled envs over real HTTP and WebSocket on
127.0.0.1; OpenEnv's stock `GenericEnvClient` plays each agent (the harness's oracle, no-op and the
adversaries `spray`, `read_all`, `double_write`, `golden_prefix`) against envforge's scripted user,
and the same calls and messages are scored by `envforge.score_calls` (what `envforge score` runs).
The rewards must be equal; the oracle earns 1, the no-op and every adversary whose run is judged
(`counts`) less. With a user in the loop, the tasks whose writes need the user's yes (which trl
leaves out) are played too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from openenv.core import GenericEnvClient

from envforge import score_calls_async
from envforge.harness import build_agent
from envforge.integrations.openenv import openenv_app
from envforge.integrations.openenv_play import Played, play
from envforge.server import load_env
from envforge.synth import ToolShape, counts, load_policy_rules, load_tasks

from support.openenv_server import served
from support.paths import bundled_env_dirs

BUNDLED = {p.name: p for p in bundled_env_dirs()}
AGENTS = ("oracle", "noop", "spray", "read_all", "double_write", "golden_prefix")
TASKS_PER_ENV = 2


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with served(openenv_app(list(BUNDLED.values()))) as base:
        yield base


async def _play_and_score(url: str, env_dir: Path) -> list[tuple[str, str, Played, float, bool]]:
    env = load_env(env_dir)
    rules = load_policy_rules(env)
    read_only = [s.name for s in env.tools.values() if s.read_only]
    out = []
    for task in load_tasks(env_dir)[:TASKS_PER_ENV]:
        for name in AGENTS:
            agent = build_agent(name, task, seed=0, policy=env.policy, rules=rules)
            async with GenericEnvClient(base_url=url) as client:
                played = await play(client, agent, task_id=task.id, read_only=read_only)
            score = await score_calls_async(env_dir, task, played.calls, played.said)
            out.append((task.id, name, played, score.reward, score.state_match))
    return out


@pytest.mark.parametrize("env_name", sorted(BUNDLED))
def test_openenv_rewards_equal_envforge_score(url: str, env_name: str) -> None:
    env_dir = BUNDLED[env_name]
    env = load_env(env_dir)
    shapes = [
        ToolShape(
            name=t.name, read_only=t.read_only, parameters=tuple(t.parameters), required=tuple(t.required)
        )
        for t in env.tools.values()
    ]
    policy = load_policy_rules(env)
    tasks = {t.id: t for t in load_tasks(env_dir)}
    for task_id, name, played, score, state_match in asyncio.run(_play_and_score(url, env_dir)):
        task = tasks[task_id]
        assert played.status == "completed", (task_id, name, played.status)  # the user stopped
        kept = played.parts.get("policy", 1.0) == 1.0
        # `envforge score` replays an action list, which has no conversation to judge the policy
        # by; the OpenEnv episode has one: a broken rule costs the whole reward there
        assert played.reward == pytest.approx(score if kept else 0.0, abs=1e-9), (task_id, name)
        if name == "oracle":
            assert played.reward == 1.0, task_id
        elif name == "noop":  # unless doing nothing is the task's answer (τ²'s refusals)
            assert played.reward < 1.0 or (state_match and not task.required_outputs), task_id
        elif state_match and not task.required_outputs:
            continue  # nothing but the state to earn, and it is the golden one (a refusal)
        elif counts(name, task, shapes, reached_golden=state_match, policy=policy, message=played.said[-1]):
            assert played.reward < 1.0, (task_id, name)


def test_the_tools_openenv_lists_are_the_envs_own(url: str) -> None:
    """The reset observation lists the env's tools as chat templates take them (OpenAI function
    schemas: the env's names, descriptions and JSON schemas), with the env's policy and the
    simulated user's opening message."""

    async def reset() -> dict[str, object]:
        async with GenericEnvClient(base_url=url) as client:
            task = load_tasks(BUNDLED["library"])[0]
            result = await client.reset(task_id=task.id)
            assert result.done is False and result.reward is None
            return dict(result.observation)

    first = asyncio.run(reset())
    env = load_env(BUNDLED["library"])
    assert first["role"] == "user" and first["content"]
    assert first["system"] == env.policy.strip()
    listed = {t["function"]["name"]: t["function"] for t in first["tools"]}  # type: ignore[attr-defined]
    assert set(listed) == set(env.tools)
    for spec in env.tools.values():
        assert listed[spec.name]["description"] == spec.description
        assert listed[spec.name]["parameters"] == spec.input_schema
