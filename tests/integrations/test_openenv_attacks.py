"""Attacks on envforge's OpenEnv server, through OpenEnv's stock client over real HTTP and
WebSocket on 127.0.0.1: each gets a clear error or the confined behaviour, never another
session's state."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openenv.core import GenericEnvClient

from envforge.integrations.openenv import openenv_app
from envforge.synth import load_tasks

from support.confined import check_served_confined, with_file_reading_tool
from support.openenv_server import served
from support.paths import REPO

CAR = REPO / "envs" / "car_rental"
TASK = load_tasks(CAR)[0].id


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with served(openenv_app([CAR])) as base:
        yield base


def _car(result: Any) -> str:
    return str(result.observation["content"])


def test_a_session_cannot_reach_another_sessions_episode(url: str) -> None:
    async def attack() -> None:
        async with GenericEnvClient(base_url=url) as a, GenericEnvClient(base_url=url) as b:
            await a.reset(task_id=TASK, episode_id="shared-label")
            before = _car(await a.step({"tool": "get_car", "arguments": {"car_id": "V-621"}}))
            assert "available" in before
            rented = await a.step(
                {"tool": "rent_car", "arguments": {"customer_id": "C-501", "car_id": "V-621", "days": 2}}
            )
            assert not rented.observation["is_error"], _car(rented)
            assert _car(await a.step({"tool": "get_car", "arguments": {"car_id": "V-621"}})) != before
            # b names a's episode as its own label: a label is all it is, b's episode is fresh
            await b.reset(task_id=TASK, episode_id="shared-label")
            assert _car(await b.step({"tool": "get_car", "arguments": {"car_id": "V-621"}})) == before
            # no argument names an episode: one that tries is refused by envforge's own validation
            refused = await b.step({"tool": "get_car", "arguments": {"car_id": "V-621", "episode_id": "x"}})
            assert refused.observation["is_error"]
            assert "unexpected argument 'episode_id'" in _car(refused)
            # nor does the action: OpenEnv's model refuses a field it does not declare
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                await b.step({"tool": "get_car", "arguments": {"car_id": "V-621"}, "episode": "x"})
            assert (await a.state())["step_count"] == 3 and (await b.state())["step_count"] == 2

    asyncio.run(attack())


def test_the_stateless_http_routes_hold_no_episode(url: str) -> None:
    """OpenEnv's HTTP /reset and /step make a fresh environment per request: a step there reaches
    no episode, its own or anyone's, and says so."""
    with httpx.Client(base_url=url) as http:
        opened = http.post("/reset", json={"task_id": TASK})
        assert opened.status_code == 200 and opened.json()["observation"]["role"] == "user"
        step = http.post("/step", json={"action": {"tool": "get_car", "arguments": {"car_id": "V-621"}}})
        assert step.status_code == 409
        assert "no episode is open: reset(task_id=...) first, in the same session" in step.json()["detail"]
        unknown = http.post("/reset", json={"task_id": "car_rental-9-99999"})
        assert unknown.status_code == 422 and unknown.json()["detail"] == "no task 'car_rental-9-99999' here"


def test_a_reward_before_the_end_is_none_and_a_step_after_it_is_refused(url: str) -> None:
    async def attack() -> None:
        async with GenericEnvClient(base_url=url) as client:
            with pytest.raises(RuntimeError, match="no episode is open"):
                await client.step({"message": "hello"})
            await client.reset(task_id=TASK)
            step = await client.step({"tool": "get_car", "arguments": {"car_id": "V-621"}})
            assert step.reward is None and not step.done
            state = await client.state()
            assert state["reward"] is None and state["done"] is False and state["parts"] == {}
            # a question keeps the user talking: still no reward
            asked = await client.step({"message": "Which car would you like?"})
            assert asked.reward is None and not asked.done
            end = await client.step({"message": "Done."})
            assert end.done and end.reward is not None and end.observation["status"] == "completed"
            with pytest.raises(RuntimeError, match=f"the episode of {TASK} is over: reset"):
                await client.step({"tool": "get_car", "arguments": {"car_id": "V-621"}})
            assert (await client.state())["reward"] == end.reward  # scored once, kept
            await client.reset(task_id=TASK)  # the next episode opens
            assert (await client.state())["done"] is False

    asyncio.run(attack())


def test_the_turn_limit_ends_the_episode_with_the_harness_verdict() -> None:
    """An agent that never lets the user stop is cut at `max_steps` and scored as the harness
    scores a trial cut by its turn limit: 0, status max_turns."""

    async def attack(base: str) -> None:
        async with GenericEnvClient(base_url=base) as client:
            await client.reset(task_id=TASK)
            for _ in range(2):
                result = await client.step({"tool": "get_car", "arguments": {"car_id": "V-621"}})
                assert not result.done
            result = await client.step({"message": "Which car?"})
            assert result.done and result.reward == 0.0 and result.observation["status"] == "max_turns"

    with served(openenv_app([CAR], max_steps=3)) as base:
        asyncio.run(attack(base))


def test_malformed_actions_get_a_clear_error_and_change_nothing(url: str) -> None:
    async def attack() -> None:
        async with GenericEnvClient(base_url=url) as client:
            await client.reset(task_id=TASK)
            before = _car(await client.step({"tool": "get_car", "arguments": {"car_id": "V-621"}}))
            unknown = await client.step({"tool": "steal_car", "arguments": {"car_id": "V-621"}})
            assert unknown.observation["is_error"] and "steal_car" in _car(unknown)
            bad_json = await client.step({"tool": "rent_car", "arguments": '{"car_id": "V-621", days: 2'})
            assert bad_json.observation["is_error"]
            assert _car(bad_json).startswith("Error: the arguments are not JSON")
            not_object = await client.step({"tool": "rent_car", "arguments": '["V-621"]'})
            assert _car(not_object) == "Error: the arguments are not a JSON object"
            bad_type = await client.step(
                {"tool": "rent_car", "arguments": {"customer_id": "C-501", "car_id": "V-621", "days": "many"}}
            )
            assert bad_type.observation["is_error"]
            as_text = await client.step({"tool": "get_car", "arguments": '{"car_id": "V-621"}'})
            assert _car(as_text) == before  # JSON text is an accepted form, and nothing changed
            for action in ({}, {"tool": "get_car", "message": "hi"}):
                with pytest.raises(RuntimeError, match="an action is one tool call"):
                    await client.step(action)
            with pytest.raises(RuntimeError, match="reset takes task_id, env, seed and episode_id, not ta"):
                await client.reset(taskid=TASK)
            with pytest.raises(RuntimeError, match="no env 'gym' here"):
                await client.reset(task_id=TASK, env="gym")

    asyncio.run(attack())


def test_a_confined_env_is_served_confined(tmp_path: Path) -> None:
    """car_rental is model-written and confined: its tools run in the sandboxed worker, so the
    serving process never imports them; a trusted copy (the same code) is imported in-process."""

    async def rent(base: str) -> str:
        async with GenericEnvClient(base_url=base) as client:
            await client.reset(task_id=TASK)
            return _car(await client.step({"tool": "get_car", "arguments": {"car_id": "V-621"}}))

    def play(env_dir: Path) -> str:
        with served(openenv_app([env_dir])) as base:
            return asyncio.run(rent(base))

    check_served_confined(CAR, tmp_path, play)


def test_a_model_written_payload_is_refused_before_it_serves(tmp_path: Path) -> None:
    payload = with_file_reading_tool(CAR, tmp_path)
    with pytest.raises(Exception, match="open"):
        openenv_app([payload])


def test_concurrent_sessions_on_one_task_each_get_their_own_episode(url: str) -> None:
    """Six sessions open the same task at once and each rents the same car: with one episode per
    session every rental succeeds; a shared episode would refuse all but the first."""

    async def all_at_once() -> list[bool]:
        clients = [GenericEnvClient(base_url=url) for _ in range(6)]
        try:
            await asyncio.gather(*(c.connect() for c in clients))
            await asyncio.gather(*(c.reset(task_id=TASK) for c in clients))
            rent = {"tool": "rent_car", "arguments": {"customer_id": "C-501", "car_id": "V-621", "days": 2}}
            rented = await asyncio.gather(*(c.step(rent) for c in clients))
            return [not r.observation["is_error"] for r in rented]
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    assert asyncio.run(all_at_once()) == [True] * 6
