"""Attacks on an episode's user endpoint (dual control) over HTTP, beyond its key.

The user's URL is a capability: it must die with its episode (a key kept from a closed episode,
or a legacy MCP session opened on it, reaches nothing after), no listing of the control plane
may hand the key to whoever reads it, a legacy session ended on the user URL must not close the
agent's episode, and the user's sessions count against the same per-client cap as the agent's.
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from envforge.server import Fleet, HTTPLimits, build_app, load_env

from support.paths import DUAL_PHONE_DIR
from support.serving import MCP_INITIALIZE, ServerThread

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


@pytest.fixture(scope="module")
def served():
    fleet = Fleet([load_env(DUAL_PHONE_DIR)], ttl_seconds=600)
    with ServerThread(build_app(fleet, limits=HTTPLimits(max_sessions_per_client=2))) as server:
        yield server, fleet


async def _episode(http: httpx.AsyncClient) -> dict[str, str]:
    created = await http.post("/control/episodes", json={"env": "dual_phone"})
    assert created.status_code == 201, created.text
    return created.json()


async def _open_session(http: httpx.AsyncClient, path: str) -> httpx.Response:
    return await http.post(path, content=json.dumps(MCP_INITIALIZE), headers=HEADERS)


async def test_a_closed_episodes_user_url_and_session_reach_nothing(served):
    server, _ = served
    async with httpx.AsyncClient(base_url=server.url) as http:
        ep = await _episode(http)
        opened = await _open_session(http, ep["user_mcp_path"])
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        assert (await http.delete(f"/control/episodes/{ep['episode_id']}")).status_code in (200, 204)
        with_session = {**HEADERS, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25"}
        for headers in (HEADERS, with_session):
            answer = await http.post(ep["user_mcp_path"], content=json.dumps(LIST), headers=headers)
            assert answer.status_code == 404, answer.text
        await http.delete(ep["user_mcp_path"], headers=with_session)


async def test_no_listing_of_the_control_plane_carries_the_user_key(served):
    server, _ = served
    async with httpx.AsyncClient(base_url=server.url) as http:
        ep = await _episode(http)
        key = ep["user_mcp_path"].split("/user/")[1].split("/")[0]
        for path in ("/control/episodes", f"/control/episodes/{ep['episode_id']}/state", "/control/envs"):
            answer = await http.get(path)
            assert answer.status_code == 200 and key not in answer.text, path
        await http.delete(f"/control/episodes/{ep['episode_id']}")


async def test_ending_a_user_session_leaves_the_episode_open(served):
    server, fleet = served
    async with httpx.AsyncClient(base_url=server.url) as http:
        ep = await _episode(http)
        opened = await _open_session(http, ep["user_mcp_path"])
        session = opened.headers["mcp-session-id"]
        headers = {**HEADERS, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25"}
        ended = await http.delete(ep["user_mcp_path"], headers=headers)
        assert ended.status_code < 300, ended.text
        assert fleet.store.find(ep["episode_id"]) is not None
        state = await http.get(f"/control/episodes/{ep['episode_id']}/state")
        assert state.status_code == 200
        await http.delete(f"/control/episodes/{ep['episode_id']}")


async def test_user_sessions_count_against_the_clients_cap():
    fleet = Fleet([load_env(DUAL_PHONE_DIR)], ttl_seconds=600)
    with ServerThread(build_app(fleet, limits=HTTPLimits(max_sessions_per_client=2))) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            ep = await _episode(http)
            agent = await _open_session(http, ep["mcp_path"])
            await anyio.sleep(0.3)  # the server is done with the opening request (its slot is kept)
            user = await _open_session(http, ep["user_mcp_path"])
            assert agent.status_code == 200 and user.status_code == 200
            await anyio.sleep(0.3)
            third = await _open_session(http, ep["user_mcp_path"])
            assert third.status_code == 429, third.text
            for path, opened in ((ep["mcp_path"], agent), (ep["user_mcp_path"], user)):
                sid = opened.headers["mcp-session-id"]
                await http.delete(
                    path, headers={**HEADERS, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-11-25"}
                )


@pytest.mark.parametrize("side", ["mcp_path", "user_mcp_path"])
async def test_a_session_outliving_its_episode_can_still_be_ended(side):
    """The episode is closed first (the harness's order is free), then the client ends its legacy
    session: that DELETE must reach the session, else its slot stays taken for the session's idle
    life and a client running one episode after another is locked out at its cap."""
    fleet = Fleet([load_env(DUAL_PHONE_DIR)], ttl_seconds=600)
    with ServerThread(build_app(fleet, limits=HTTPLimits(max_sessions_per_client=1))) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            for _ in range(3):
                ep = await _episode(http)
                opened = await _open_session(http, ep[side])
                assert opened.status_code == 200, opened.text
                sid = opened.headers["mcp-session-id"]
                await http.delete(f"/control/episodes/{ep['episode_id']}")
                headers = {**HEADERS, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-11-25"}
                ended = await http.delete(ep[side], headers=headers)
                assert ended.status_code < 300, ended.text
                wrong = ep[side].replace("/user/", "/user/0") if side == "user_mcp_path" else None
                if wrong:
                    assert (await http.delete(wrong, headers=headers)).status_code == 404
