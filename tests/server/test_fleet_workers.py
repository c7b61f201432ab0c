"""`envforge serve --workers 2`: one URL, episodes on two worker processes, each request at its owner.

Real processes on 127.0.0.1 (the front and its workers), the stock MCP client over streamable HTTP."""

from __future__ import annotations

import json
import os
import signal
import time

import anyio
import httpx
import pytest
from mcp import Client

from envforge.server import EPISODE_META_KEY

from support.paths import BANK_DIR, DUAL_PHONE_DIR
from support.serving import envforge_serve

EPISODES = 1000  # the figure: a thousand episodes through one URL, 0 errors


def _text(result: object) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)  # type: ignore[attr-defined]


def _balances(state: dict) -> dict[str, float]:
    return {a["account_id"]: a["balance"] for a in state["state"]["accounts"]}


@pytest.fixture(scope="module")
def front() -> object:
    with envforge_serve([str(BANK_DIR), str(DUAL_PHONE_DIR)], args=["--workers", "2"]) as url:
        yield url


async def test_episodes_spread_over_workers_and_every_call_reaches_its_owner(front):
    async with httpx.AsyncClient(base_url=front, timeout=30) as http:
        limiter = anyio.Semaphore(16)
        made: list[dict] = []

        async def create() -> None:
            async with limiter:
                answer = await http.post("/control/episodes", json={"env": "bank"})
                assert answer.status_code == 201, answer.text
                made.append(answer.json())

        async with anyio.create_task_group() as tg:
            for _ in range(EPISODES):
                tg.start_soon(create)
        owners = {ep["episode_id"][:5] for ep in made}
        assert owners == {"w0g0-", "w1g0-"}, owners
        assert min(sum(ep["episode_id"].startswith(p) for ep in made) for p in owners) >= EPISODES // 3

        async def play(i: int, ep: dict) -> None:
            async with limiter, Client(front + ep["mcp_path"]) as client:
                moved = await client.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 1 + i % 7})
                assert not moved.is_error, _text(moved)

        async with anyio.create_task_group() as tg:
            for i, ep in enumerate(made):
                if i % 10 == 0:  # MCP on every tenth: a hundred sessions over both workers
                    tg.start_soon(play, i, ep)
        for i, ep in enumerate(made):
            state = (await http.get(f"/control/episodes/{ep['episode_id']}/state")).json()
            assert _balances(state)["A-2"] == (50.0 + 1 + i % 7 if i % 10 == 0 else 50.0), ep["episode_id"]
        # the env-wide URL routes by the episode in `_meta`, and by the (prefixed) legacy session
        ep = made[-1]
        async with Client(front + "/envs/bank/mcp") as client:
            got = await client.call_tool(
                "get_account", {"account_id": "A-2"}, meta={EPISODE_META_KEY: ep["episode_id"]}
            )
            assert json.loads(_text(got))["balance"] == 50.0
        async with Client(front + "/envs/bank/mcp", mode="legacy") as one:
            for _ in range(4):
                assert not (
                    await one.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 1})
                ).is_error
            assert (
                json.loads(_text(await one.call_tool("get_account", {"account_id": "A-1"})))["balance"]
                == 96.0
            )
        listed = (await http.get("/control/episodes")).json()["episodes"]
        assert {e["episode_id"] for e in made} <= {e["episode_id"] for e in listed}
        stats = (await http.get("/control/stats")).json()
        assert stats["workers"] == 2 and stats["open_episodes"] >= EPISODES
        for ep in made:
            assert (await http.delete(f"/control/episodes/{ep['episode_id']}")).json() == {"closed": True}


async def test_user_side_url_reaches_its_owner(front):
    async with httpx.AsyncClient(base_url=front, timeout=30) as http:
        eps = [(await http.post("/control/episodes", json={"env": "dual_phone"})).json() for _ in range(2)]
        assert {ep["episode_id"][:5] for ep in eps} == {"w0g0-", "w1g0-"}
        for ep in eps:
            async with Client(front + ep["user_mcp_path"]) as client:
                assert (await client.list_tools()).tools
            assert (await http.delete(f"/control/episodes/{ep['episode_id']}")).status_code == 200


async def test_forged_episode_ids_are_refused_like_unknown_ones(front):
    async with httpx.AsyncClient(base_url=front, timeout=30) as http:
        real = (await http.post("/control/episodes", json={"env": "bank"})).json()["episode_id"]
        other = ("w1g0-" if real.startswith("w0g0-") else "w0g0-") + real[5:]  # the other worker's prefix
        answers = []
        for forged in (other, "w9g0-" + real[5:], "w0g7-" + real[5:], "nonsense"):
            got = await http.get(f"/control/episodes/{forged}/state")
            answers.append(got.status_code)
            assert (
                got.json()["error"]
                == f"episode {forged!r} does not exist (never created, closed, or expired)"
            )
            mcp = await http.post(f"/envs/bank/episodes/{forged}/mcp", json={})
            assert mcp.status_code == 404 and "does not exist" in mcp.json()["error"]
        assert answers == [404] * 4
        await http.delete(f"/control/episodes/{real}")


async def test_tokens_are_checked_at_the_front():
    with envforge_serve([str(BANK_DIR)], args=["--workers", "2", "--token", "front-secret"]) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            assert (await http.post("/control/episodes", json={"env": "bank"})).status_code == 401
            wrong = {"authorization": "Bearer nope"}
            assert (await http.get("/control/episodes", headers=wrong)).status_code == 401
            good = {"authorization": "Bearer front-secret"}
            made = await http.post("/control/episodes", json={"env": "bank"}, headers=good)
            assert made.status_code == 201
            # a client cannot pose as another by naming it: the front overwrites the header
            posed = {**good, "x-envforge-client": "addr:10.0.0.9"}
            again = await http.post("/control/episodes", json={"env": "bank"}, headers=posed)
            owners = {
                e["owner"] for e in (await http.get("/control/episodes", headers=good)).json()["episodes"]
            }
            assert again.status_code == 201 and len(owners) == 1 and not owners & {"addr:10.0.0.9"}


async def test_one_client_over_every_worker_gets_its_cap_once():
    cap = 6
    with envforge_serve(
        [str(BANK_DIR)], args=["--workers", "2", "--max-episodes-per-client", str(cap)]
    ) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            answers = [await http.post("/control/episodes", json={"env": "bank"}) for _ in range(2 * cap)]
            codes = [a.status_code for a in answers]
            assert codes == [201] * cap + [429] * cap, codes
            made = [a.json()["episode_id"] for a in answers[:cap]]
            assert {m[:5] for m in made} == {"w0g0-", "w1g0-"}  # spread over both, capped once in all
            assert "across every worker" in answers[-1].json()["error"]
            await http.delete(f"/control/episodes/{made[0]}")
            assert (await http.post("/control/episodes", json={"env": "bank"})).status_code == 201
            assert (await http.post("/control/episodes", json={"env": "bank"})).status_code == 429


async def test_a_killed_worker_loses_only_its_episodes_and_comes_back():
    with envforge_serve([str(BANK_DIR)], args=["--workers", "2"]) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            made = [(await http.post("/control/episodes", json={"env": "bank"})).json() for _ in range(6)]
            pids = (await http.get("/control/stats")).json()["worker_pids"]
            os.kill(pids[0], signal.SIGKILL)
            lost = [ep for ep in made if ep["episode_id"].startswith("w0g0-")]
            kept = [ep for ep in made if ep["episode_id"].startswith("w1g0-")]
            assert lost and kept
            deadline = time.monotonic() + 60
            while True:  # restarts first: `up` read after it counts the new process, not the dead one
                restarted = (await http.get("/control/stats")).json()["worker_restarts"] >= 1
                if restarted and (await http.get("/healthz")).json()["up"] == 2:
                    break
                assert time.monotonic() < deadline, "the worker did not come back"
                await anyio.sleep(0.2)
            for ep in lost:
                gone = await http.get(f"/control/episodes/{ep['episode_id']}/state")
                assert gone.status_code == 410 and "episode lost: its worker exited" in gone.json()["error"]
                mcp = await http.post(ep["mcp_path"], json={})
                assert mcp.status_code == 410
            for ep in kept:
                assert (await http.get(f"/control/episodes/{ep['episode_id']}/state")).status_code == 200
                async with Client(url + ep["mcp_path"]) as client:
                    assert not (await client.call_tool("get_account", {"account_id": "A-1"})).is_error
            fresh = [(await http.post("/control/episodes", json={"env": "bank"})).json() for _ in range(2)]
            assert {ep["episode_id"][:5] for ep in fresh} == {"w0g1-", "w1g0-"}
            async with Client(url + fresh[0]["mcp_path"]) as client:
                assert not (await client.call_tool("get_account", {"account_id": "A-1"})).is_error


def test_bad_worker_counts_are_one_line_errors():
    from support.serving import run_envforge

    zero = run_envforge("serve", str(BANK_DIR), "--workers", "0", "--port", "0")
    assert zero.returncode != 0 and "--workers must be >= 1" in zero.stderr + zero.stdout
    assert "Traceback" not in zero.stderr
    stdio = run_envforge("serve", str(BANK_DIR), "--workers", "2", "--transport", "stdio")
    assert stdio.returncode != 0 and "--workers is for HTTP" in stdio.stderr + stdio.stdout


async def test_an_sse_stream_passes_through_the_front_as_it_opens(front):
    """A buffering front would answer a session's server-to-client stream only once it ended."""
    from support.serving import MCP_INITIALIZE

    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=front, timeout=30) as http:
        opened = await http.post("/envs/bank/mcp", json=MCP_INITIALIZE, headers=headers)
        session = opened.headers["mcp-session-id"]
        assert opened.status_code == 200 and session[:5] in ("w0g0-", "w1g0-")
        listen = {
            "accept": "text/event-stream",
            "mcp-session-id": session,
            "mcp-protocol-version": "2025-11-25",
        }
        with anyio.fail_after(5):
            async with http.stream("GET", "/envs/bank/mcp", headers=listen) as stream:
                assert stream.status_code == 200, await stream.aread()
                assert stream.headers["content-type"].startswith("text/event-stream")
        closed = await http.delete("/envs/bank/mcp", headers={"mcp-session-id": session})
        assert closed.status_code == 200
