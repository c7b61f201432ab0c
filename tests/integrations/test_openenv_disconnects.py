"""Attacks on the OpenEnv app's per-client session cap by clients that vanish instead of closing.

A client that drops its TCP connection (no WebSocket close frame), even mid-reset or mid-step,
must give back its cap slot and its episode: else a few such disconnects lock the client (and,
at OpenEnv's own cap, everyone) out for good, and the fleet fills with episodes nobody can reach.
Real uvicorn on 127.0.0.1, real WebSockets; the connection is cut with `transport.abort()` (RST).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from websockets.asyncio.client import connect

from envforge.integrations.openenv import EnvforgeAction, EnvforgeEnv, openenv_app

from support.fake_llm import FakeOpenAI, completion
from support.openenv_server import served
from support.paths import REPO

CAR = REPO / "envs" / "car_rental"
TASK = "car_rental-0-00000"
PER_CLIENT = 2


@pytest.fixture(scope="module")
def app_url() -> Iterator[tuple[object, str]]:
    app = openenv_app([CAR], max_concurrent_envs=8, max_sessions_per_client=PER_CLIENT)
    with served(app) as base:
        yield app, base


def _open_episodes(app: object) -> int:
    return len(app.state.envforge_runtime.fleet.store)  # type: ignore[attr-defined]


async def _vanish(url: str, message: dict[str, object], wait_reply: bool) -> None:
    """Open a session, send `message`, and cut the TCP connection (before or after its reply)."""
    ws = await connect(url.replace("http://", "ws://") + "/ws")
    await ws.send(json.dumps(message))
    if wait_reply:
        await ws.recv()
    ws.transport.abort()


def _wait_until(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("wait_reply", [True, False], ids=["after-reply", "mid-reset"])
def test_a_client_that_cuts_its_connection_frees_its_slot_and_episode(app_url, wait_reply: bool) -> None:
    app, url = app_url
    reset = {"type": "reset", "data": {"task_id": TASK}}

    async def attack() -> None:
        for _ in range(3 * PER_CLIENT):  # more vanished sessions than the cap
            await _vanish(url, reset, wait_reply)
        await asyncio.sleep(0.2)

    asyncio.run(attack())
    _wait_until(lambda: _open_episodes(app) == 0)

    async def still_mine() -> None:  # the client still gets its whole cap
        envs = [EnvforgeEnv(base_url=url) for _ in range(PER_CLIENT)]
        try:
            for env in envs:
                await env.connect()
                await env.reset(task_id=TASK)
                step = await env.step(EnvforgeAction(tool="get_car", arguments={"car_id": "V-621"}))
                assert "available" in step.observation.content
        finally:
            for env in envs:
                await env.close()

    asyncio.run(still_mine())
    _wait_until(lambda: _open_episodes(app) == 0)


def test_a_client_that_cuts_its_connection_mid_step_frees_its_slot_and_episode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cut comes while the step waits on the simulated user's model (a slow one here)."""

    def slow_user(body: dict[str, object]) -> tuple[int, dict[str, object]]:
        time.sleep(0.6)
        return 200, completion("Thanks, that is all.")

    monkeypatch.setenv("OPENAI_API_KEY", "x")
    with FakeOpenAI(slow_user) as fake:
        app = openenv_app(
            [CAR],
            user="openai/fake",
            user_api_base=fake.url,
            max_concurrent_envs=8,
            max_sessions_per_client=PER_CLIENT,
        )
        with served(app) as url:

            async def attack() -> None:
                for _ in range(PER_CLIENT + 1):
                    ws = await connect(url.replace("http://", "ws://") + "/ws")
                    await ws.send(json.dumps({"type": "reset", "data": {"task_id": TASK}}))
                    await ws.recv()
                    asked = len(fake.requests)
                    await ws.send(json.dumps({"type": "step", "data": {"message": "Anything else?"}}))
                    await asyncio.sleep(0.3)
                    assert len(fake.requests) == asked + 1  # the step is waiting on the user's model
                    ws.transport.abort()

            asyncio.run(attack())
            _wait_until(lambda: _open_episodes(app) == 0)

            async def still_mine() -> None:
                envs = [EnvforgeEnv(base_url=url) for _ in range(PER_CLIENT)]
                try:
                    for env in envs:
                        await env.connect()
                        await env.reset(task_id=TASK)
                finally:
                    for env in envs:
                        await env.close()

            asyncio.run(still_mine())
