"""Attacks on the trl environment instances: each gets a clear error or the confined behaviour,
never another rollout's state."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import pytest

from envforge.integrations.trl import EnvforgeEpisode, EpisodeStateError, environments

from support.confined import check_served_confined, with_file_reading_tool
from support.paths import REPO

CAR = REPO / "envs" / "car_rental"


def _instance(envs: object, task_id: str) -> EnvforgeEpisode:
    instance = envs.environment_factory["car_rental"]()  # type: ignore[attr-defined]
    instance.reset(task_id=task_id, prompt=[])
    return instance


def test_closing_after_an_instance_was_dropped_mid_rollout_does_not_hang() -> None:
    # trl may drop an instance whose rollout it abandoned; its episode must still be closed, and
    # close() must return (it waited forever on the episode of a garbage-collected instance)
    envs = environments([CAR], limit=1)
    _instance(envs, envs.dataset[0]["task_id"])  # not kept: collected with its episode open
    gc.collect()
    closed = threading.Event()
    threading.Thread(target=lambda: (envs.close(), closed.set()), daemon=True).start()
    assert closed.wait(60), "close() hung on the episode of a dropped instance"


def test_a_rollout_cannot_reach_another_rollouts_episode() -> None:
    with environments([CAR], limit=1) as envs:
        task_id = envs.dataset[0]["task_id"]
        a, b = _instance(envs, task_id), _instance(envs, task_id)
        before = b.get_car(car_id="V-621")
        assert "available" in before
        rented = a.rent_car(customer_id="C-501", car_id="V-621", days=2)
        assert not rented.startswith("Error"), rented
        assert a.get_car(car_id="V-621") != before
        assert b.get_car(car_id="V-621") == before  # a's write is not in b's episode
        # no argument names an episode: one that tries is refused by envforge's own validation
        refused = b.get_car(car_id="V-621", episode_id="anything")
        assert "unexpected argument 'episode_id'" in refused


def test_a_reward_before_the_episode_or_a_call_after_it_is_refused() -> None:
    with environments([CAR], limit=1) as envs:
        fresh = envs.environment_factory["car_rental"]()
        reward = envs.reward_funcs[0]
        with pytest.raises(EpisodeStateError, match="no episode"):
            reward(prompts=[[]], completions=[[]], environments=[fresh])
        with pytest.raises(EpisodeStateError, match="no episode is open"):
            fresh.get_car(car_id="V-621")
        played = _instance(envs, envs.dataset[0]["task_id"])
        first = reward(prompts=[[]], completions=[[]], environments=[played])
        with pytest.raises(EpisodeStateError, match="was scored: reset"):
            played.rent_car(customer_id="C-501", car_id="V-621", days=2)
        assert reward(prompts=[[]], completions=[[]], environments=[played]) == first  # scored once


def test_malformed_calls_get_envforges_error_and_change_nothing() -> None:
    with environments([CAR], limit=1) as envs:
        task_id = envs.dataset[0]["task_id"]
        a = _instance(envs, task_id)
        before = a.get_car(car_id="V-621")
        for args in ({}, {"customer_id": "C-501", "car_id": "V-621", "days": "many"}, {"car": "V-621"}):
            text = a.rent_car(**args)
            assert text.startswith("Error"), (args, text)
        assert a.get_car(car_id="V-621") == before
        with pytest.raises(TypeError):
            a.get_car("V-621")  # positional: not how trl calls a tool (it passes the JSON's keys)


def test_a_confined_env_is_served_confined(tmp_path: Path) -> None:
    """car_rental is model-written and confined: its tools run in the sandboxed worker, so the
    serving process never imports them; a trusted copy (the same code) is imported in-process."""

    def play(env_dir: Path) -> str:
        with environments([env_dir], limit=1) as envs:
            return str(_instance(envs, envs.dataset[0]["task_id"]).get_car(car_id="V-621"))

    check_served_confined(CAR, tmp_path, play)


def test_a_model_written_payload_is_refused_before_it_runs(tmp_path: Path) -> None:
    payload = with_file_reading_tool(CAR, tmp_path)
    with pytest.raises(Exception, match="open"):
        environments([payload], limit=1)
