"""Attacks on envforge's verifiers env: each gets a clear error or the confined behaviour, never
another rollout's state. Every run is a real verifiers episode with a fake model on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed (docs/integrations.md#verifiers)")

import verifiers.v1 as vf

from envforge.integrations.verifiers import EnvforgeTask, EpisodeStateError, load_environment

from support.confined import check_served_confined, with_file_reading_tool
from support.fake_llm import FakeOpenAI, completion
from support.paths import ENVS
from support.vf_play import KEY_VAR, STOP

CAR = ENVS / "car_rental"
TASK = "car_rental-0-00000"
RENT = {"customer_id": "C-501", "car_id": "V-621", "days": 2}


def _call(name: str, arguments: str | dict[str, Any], n: int) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": raw}}


def _script(steps: list[tuple[str, str | dict[str, Any]] | str]) -> Any:
    """A model that makes one step per turn (a tool call, or a text), then stops."""

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done >= len(steps):
            return 200, completion(STOP)
        step = steps[done]
        if isinstance(step, str):
            return 200, completion(step)
        return 200, completion(tool_calls=[_call(step[0], step[1], done)])

    return brain


def _tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "tool"]


def _ctx(fake: FakeOpenAI, model: str = "fake") -> Any:
    import os

    os.environ.setdefault(KEY_VAR, "unused")
    return vf.ModelContext(model=model, client=vf.EvalClientConfig(base_url=fake.url, api_key_var=KEY_VAR))


def _task(env: Any, task_id: str = TASK) -> Any:
    return next(t for t in env.taskset if t.data.task_id == task_id)


def test_a_rollout_cannot_reach_another_rollouts_episode() -> None:
    """Two rollouts of one task at once: the writer rents the car, the reader (asking after the
    rent went through) still sees it available; an argument naming an episode is refused."""
    rented = threading.Event()

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if body["model"] == "writer":
            steps = [("rent_car", RENT), ("get_car", {"car_id": "V-621"})]
            if done == 1:
                rented.set()
        else:
            assert rented.wait(30), "the writer never rented"
            steps = [("get_car", {"car_id": "V-621"}), ("get_car", {"car_id": "V-621", "episode_id": "x"})]
        if done < len(steps):
            return 200, completion(tool_calls=[_call(*steps[done], done)])
        return 200, completion("Done.")

    env = load_environment([CAR], limit=1)
    with FakeOpenAI(brain) as fake:

        async def both() -> list[Any]:
            async with env.serving():
                task = _task(env)
                return list(
                    await asyncio.gather(
                        env.run_episode(task, _ctx(fake, "writer")),
                        env.run_episode(task, _ctx(fake, "reader")),
                    )
                )

        writer, reader = asyncio.run(both())
        assert writer.ok and reader.ok, (writer.errors, reader.errors)
        last = {b["model"]: _tool_results(b) for b in fake.requests}
    assert not last["writer"][0].startswith("Error"), last["writer"]
    assert "rented" in last["writer"][1]
    assert "available" in last["reader"][0]  # the writer's rent is not in the reader's episode
    assert "unexpected argument 'episode_id'" in last["reader"][1]


def test_a_reward_before_the_episode_ends_is_refused() -> None:
    """A task's reward (verifiers' own `Task.score`) asked of a task whose envforge episode has not
    ended, here one never played, is refused with the reason; a played one keeps its reward."""
    env = load_environment([CAR], limit=1)
    with FakeOpenAI(_script(["Hello."])) as fake:

        async def run() -> Any:
            async with env.serving():
                return await env.run_episode(_task(env), _ctx(fake))

        episode = asyncio.run(run())
    (trace,) = episode.traces
    assert trace.rewards["envforge"].score is not None
    fresh = _task(env)
    assert isinstance(fresh, EnvforgeTask)
    with pytest.raises(Exception, match=r"reward asked of car_rental/\S+ before its episode ended") as caught:
        asyncio.run(fresh.score(trace))
    assert isinstance(caught.value, EpisodeStateError) or isinstance(
        caught.value.__cause__, EpisodeStateError
    )


def test_a_harness_outside_its_rollout_reaches_no_episode() -> None:
    """verifiers' harness launched on a trace no rollout is bound to (a finished one) is refused:
    no model call, no tool call."""
    env = load_environment([CAR], limit=1)
    with FakeOpenAI(_script([("rent_car", RENT), "Rented."])) as fake:

        async def run() -> Any:
            async with env.serving():
                return await env.run_episode(_task(env), _ctx(fake))

        episode = asyncio.run(run())
        before = len(fake.requests)
        (trace,) = episode.traces
        harness = env._harnesses["agent"]
        result = asyncio.run(harness.launch(_ctx(fake), trace, None, fake.url, "secret", {}, _task(env).data))
        assert result.exit_code == 1 and "no envforge episode is bound" in result.stderr
        assert len(fake.requests) == before


@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        ("rent_car", "{not json", "are not JSON"),
        ("rent_car", "[1, 2]", "must be a JSON object"),
        ("rent_car", {"customer_id": "C-501", "car_id": "V-621", "days": "many"}, "Error"),
        ("rent_car", {"car": "V-621"}, "Error"),
        ("rent_a_spaceship", {}, "Error"),
    ],
)
def test_a_malformed_tool_call_gets_a_clear_error_and_changes_nothing(
    name: str, arguments: str | dict[str, Any], error: str
) -> None:
    env = load_environment([CAR], limit=1)
    steps: list[tuple[str, str | dict[str, Any]] | str] = [
        (name, arguments),
        ("get_car", {"car_id": "V-621"}),
        "Sorry.",
    ]
    with FakeOpenAI(_script(steps)) as fake:

        async def run() -> Any:
            async with env.serving():
                return await env.run_episode(_task(env), _ctx(fake))

        episode = asyncio.run(run())
        results = _tool_results(fake.requests[2])
    assert episode.ok, episode.errors
    assert error in results[0] and results[0].startswith("Error"), results[0]
    assert "available" in results[1]  # nothing was rented
    assert episode.traces[0].rewards["envforge"].score is not None


def test_a_confined_env_is_served_confined(tmp_path: Path) -> None:
    """car_rental is model-written and confined: through verifiers its tools run in the sandboxed
    worker, so this process never imports them; a trusted copy (the same code) is imported here."""
    get = [("get_car", {"car_id": "V-621"}), "Here it is."]

    def play(env_dir: Path) -> str:
        env = load_environment([env_dir], limit=1)
        with FakeOpenAI(_script(get)) as fake:

            async def run() -> Any:
                async with env.serving():
                    return await env.run_episode(_task(env), _ctx(fake))

            assert asyncio.run(run()).ok
            return _tool_results(fake.requests[1])[0]

    check_served_confined(CAR, tmp_path, play)


def test_a_model_written_payload_is_refused_before_it_runs(tmp_path: Path) -> None:
    payload = with_file_reading_tool(CAR, tmp_path)
    with pytest.raises(Exception, match="open"):
        load_environment([payload], limit=1)


def test_bad_env_folders_get_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no env folders given"):
        load_environment([])
    with pytest.raises(ValueError, match="is not an env folder"):
        load_environment([tmp_path])
    with pytest.raises(ValueError, match="no task in split 'nope'"):
        load_environment([CAR], split="nope")
    with pytest.raises(ValueError, match="two env folders hold an env named 'car_rental'"):
        load_environment([CAR, CAR])


def test_a_conversation_that_never_ends_is_cut_and_scores_0() -> None:
    """A model that only asks questions keeps the scripted user answering; after `max_user_turns`
    the conversation is cut and scored as envforge scores a trial cut by its limit: 0."""
    env = load_environment([CAR], limit=1, max_user_turns=3)

    def brain(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, completion("Which car would you like, and for how many days?")

    with FakeOpenAI(brain) as fake:

        async def run() -> Any:
            async with env.serving():
                return await env.run_episode(_task(env), _ctx(fake))

        episode = asyncio.run(run())
        asked = len(fake.requests)
    assert episode.ok, episode.errors
    assert asked == 3  # one model turn per user turn, then the cap
    assert episode.traces[0].rewards["envforge"].score == 0.0
