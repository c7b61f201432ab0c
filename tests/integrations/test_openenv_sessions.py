"""Attacks on the OpenEnv app's sessions (`integrations/openenv_sessions.py`) over real WebSockets
and HTTP on 127.0.0.1: one client cannot take every session, and `/mcp` holds none.

The other client connects from 127.0.0.2 (a loopback address of its own), which the server
counts apart from 127.0.0.1, as `envforge serve` counts clients (`envforge.server.client_key`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AsyncExitStack

import httpx
import pytest

from envforge.integrations.openenv import EnvforgeAction, EnvforgeEnv, openenv_app

from support.openenv_server import connected_from, served
from support.paths import REPO

CAR = REPO / "envs" / "car_rental"
TASK = "car_rental-0-00000"
CAP, PER_CLIENT = 4, 2


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with served(openenv_app([CAR], max_concurrent_envs=CAP, max_sessions_per_client=PER_CLIENT)) as base:
        yield base


async def _open(stack: AsyncExitStack, url: str, source: str) -> EnvforgeEnv:
    """A session of the client at `source`, its episode reset (which is where a refusal shows)."""
    env = await stack.enter_async_context(connected_from(EnvforgeEnv(base_url=url), source))
    await env.reset(task_id=TASK)
    return env


async def _reopen(stack: AsyncExitStack, url: str, source: str, within_s: float = 5.0) -> EnvforgeEnv:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        try:
            return await _open(stack, url, source)
        except RuntimeError as exc:
            if "CAPACITY_REACHED" not in str(exc) or loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


def test_one_client_cannot_take_every_session(url: str) -> None:
    async def attack() -> None:
        async with AsyncExitStack() as stack:
            mine = [await _open(stack, url, "127.0.0.1") for _ in range(PER_CLIENT)]
            for _ in range(CAP - PER_CLIENT):  # the greedy client asks for all the others
                with pytest.raises(RuntimeError) as refused:
                    await _open(stack, url, "127.0.0.1")
                assert "this client (127.0.0.1) holds 2 OpenEnv sessions, its cap" in str(refused.value)
                assert "CAPACITY_REACHED" in str(refused.value)
            other = await _open(stack, url, "127.0.0.2")  # another client still gets one
            step = await other.step(EnvforgeAction(tool="get_car", arguments={"car_id": "V-621"}))
            assert "available" in step.observation.content
            for env in mine:  # the client's own sessions are untouched by its refusals
                assert (
                    await env.step(EnvforgeAction(tool="get_car", arguments={"car_id": "V-621"}))
                ).observation
        # closed sessions are the client's again, once the server has seen the closes (it frees a
        # slot when it handles the disconnect, a moment after the client's close returns)
        async with AsyncExitStack() as stack:
            for _ in range(PER_CLIENT):
                await _reopen(stack, url, "127.0.0.1")

    asyncio.run(attack())


def test_mcp_sessions_no_connection_holds_are_refused(url: str) -> None:
    """OpenEnv's HTTP `/mcp` makes a session per `openenv/session/create`, which no connection
    holds and nothing frees: without the refusal, a few posts lock every client out for good."""
    with httpx.Client(base_url=url) as http:
        for _ in range(CAP):
            made = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"})
            assert made.status_code == 404
            assert made.json()["error"].startswith("envforge's OpenEnv environment has no MCP tools")

    async def still_open() -> None:
        async with AsyncExitStack() as stack:
            await _open(stack, url, "127.0.0.2")

    asyncio.run(still_open())


def test_a_cap_under_one_is_refused_before_serving() -> None:
    with pytest.raises(ValueError, match="max_sessions_per_client must be at least 1, not 0"):
        openenv_app([CAR], max_sessions_per_client=0)
    with pytest.raises(ValueError, match="max_concurrent_envs must be at least 1, not 0"):
        openenv_app([CAR], max_concurrent_envs=0)


def test_the_cap_holds_where_the_app_is_mounted_under_a_prefix() -> None:
    """Mounted under `/envforge`, the app's `/ws` is `/envforge/ws`: still capped per client."""
    from fastapi import FastAPI

    outer = FastAPI()
    outer.mount("/envforge", openenv_app([CAR], max_concurrent_envs=2, max_sessions_per_client=1))

    async def attack(base: str) -> None:
        async with AsyncExitStack() as stack:
            await _open(stack, f"{base}/envforge", "127.0.0.1")
            with pytest.raises(RuntimeError, match="holds 1 OpenEnv sessions, its cap"):
                await _open(stack, f"{base}/envforge", "127.0.0.1")
            await _open(stack, f"{base}/envforge", "127.0.0.2")

    with served(outer) as base:
        asyncio.run(attack(base))
