"""`EnvforgeEnv`, OpenEnv's `EnvClient` typed with envforge's action, observation and state, over
the real transport: OpenEnv's app served by uvicorn on 127.0.0.1, its WebSocket session, its
sync wrapper. Its episodes earn what `envforge score` gives the same actions, its answers are
the server's own types, and a malformed action is a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from openenv.core import EnvClient
from pydantic import ValidationError

from envforge import score_calls_async
from envforge.harness import build_agent
from envforge.integrations.openenv import (
    EnvforgeAction,
    EnvforgeEnv,
    EnvforgeObservation,
    EnvforgeState,
    openenv_app,
)
from envforge.integrations.openenv_play import play
from envforge.server import load_env
from envforge.synth import load_policy_rules, load_tasks

from support.openenv_server import served
from support.paths import REPO

ENVS = {name: REPO / "envs" / name for name in ("car_rental", "library")}
CAR_TASK = load_tasks(ENVS["car_rental"])[0].id


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with served(openenv_app(list(ENVS.values()))) as base:
        yield base


def test_it_is_openenvs_own_client_typed_with_the_servers_types() -> None:
    assert issubclass(EnvforgeEnv, EnvClient)
    assert EnvforgeEnv.__orig_bases__[0].__args__ == (EnvforgeAction, EnvforgeObservation, EnvforgeState)  # type: ignore[attr-defined]


@pytest.mark.parametrize("env_name", sorted(ENVS))
def test_oracle_earns_1_noop_less_and_both_equal_envforge_score(url: str, env_name: str) -> None:
    env_dir = ENVS[env_name]
    env = load_env(env_dir)
    rules = load_policy_rules(env)
    read_only = [s.name for s in env.tools.values() if s.read_only]

    async def run() -> list[tuple[str, float | None, float, str | None]]:
        out = []
        for task in load_tasks(env_dir)[:2]:
            for name in ("oracle", "noop"):
                agent = build_agent(name, task, seed=0, policy=env.policy, rules=rules)
                async with EnvforgeEnv(base_url=url) as client:
                    played = await play(client, agent, task_id=task.id, read_only=read_only)
                    state = await client.state()
                assert isinstance(state, EnvforgeState)
                assert state.done and state.reward == played.reward and state.task_id == task.id
                score = await score_calls_async(env_dir, task, played.calls, played.said)
                out.append((name, played.reward, score.reward, played.status))
        return out

    for name, reward, score, status in asyncio.run(run()):
        assert status == "completed", name
        assert reward == pytest.approx(score, abs=1e-9), name
        assert reward == 1.0 if name == "oracle" else reward is not None and reward < 1.0


def test_reset_step_and_state_answer_in_the_servers_types(url: str) -> None:
    async def run() -> None:
        async with EnvforgeEnv(base_url=url) as env:
            first = await env.reset(task_id=CAR_TASK, episode_id="mine")
            assert isinstance(first.observation, EnvforgeObservation)
            assert first.observation.role == "user" and first.observation.content
            assert first.observation.env == "car_rental" and first.observation.tools
            assert first.reward is None and not first.done
            step = await env.step(EnvforgeAction(tool="get_car", arguments={"car_id": "V-621"}))
            assert step.observation.role == "tool" and step.observation.tool == "get_car"
            assert "available" in step.observation.content and not step.observation.is_error
            as_mapping = await env.step({"tool": "get_car", "arguments": '{"car_id": "V-621"}'})
            assert as_mapping.observation.content == step.observation.content
            state = await env.state()
            assert isinstance(state, EnvforgeState)
            assert (state.episode_id, state.step_count, state.done, state.reward) == ("mine", 2, False, None)
            end = await env.step(EnvforgeAction(message="Done."))
            assert end.done and end.reward == end.observation.reward and end.observation.status == "completed"
            assert set(end.observation.parts) and (await env.state()).reward == end.reward

    asyncio.run(run())


def test_the_sync_wrapper_plays_typed_too(url: str) -> None:
    with EnvforgeEnv(base_url=url).sync() as env:
        first = env.reset(task_id=CAR_TASK)
        assert isinstance(first.observation, EnvforgeObservation)
        step = env.step(EnvforgeAction(tool="get_car", arguments={"car_id": "V-621"}))
        assert isinstance(step.observation, EnvforgeObservation) and step.observation.role == "tool"
        assert env.state().step_count == 1


def test_a_malformed_action_is_a_clear_error_and_the_episode_goes_on(url: str) -> None:
    async def run() -> None:
        async with EnvforgeEnv(base_url=url) as env:
            await env.reset(task_id=CAR_TASK)
            # caught by the types before anything is sent
            with pytest.raises(ValidationError, match="tol"):
                EnvforgeAction(tol="get_car")  # type: ignore[call-arg]
            with pytest.raises(ValidationError, match="episode"):
                await env.step({"tool": "get_car", "arguments": {"car_id": "V-621"}, "episode": "x"})
            with pytest.raises(TypeError, match=r"an action is an EnvforgeAction .* not str"):
                await env.step("get_car V-621")  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="taskid"):
                await env.reset(taskid=CAR_TASK)  # type: ignore[call-arg]
            # refused by the server, one line, as OpenEnv's client raises it
            for action in (EnvforgeAction(), EnvforgeAction(tool="get_car", message="hi")):
                with pytest.raises(RuntimeError, match="an action is one tool call"):
                    await env.step(action)
            with pytest.raises(RuntimeError, match="no task 'car_rental-9-99999' here"):
                await env.reset(task_id="car_rental-9-99999")
            # a tool the env does not have, or arguments that are not JSON: a tool error, no change
            unknown = await env.step(EnvforgeAction(tool="steal_car", arguments={"car_id": "V-621"}))
            assert unknown.observation.is_error and "steal_car" in unknown.observation.content
            bad = await env.step(EnvforgeAction(tool="rent_car", arguments='{"car_id": "V-621", days'))
            assert bad.observation.content.startswith("Error: the arguments are not JSON")
            # none of it counted as an episode's action but the two the server ran
            assert (await env.state()).step_count == 2
            ok = await env.step(EnvforgeAction(tool="get_car", arguments={"car_id": "V-621"}))
            assert "available" in ok.observation.content

    asyncio.run(run())
