"""Both sides of a dual-control episode served over MCP: two stock clients, one per side.

Over streamable HTTP on 127.0.0.1: the control plane gives the episode's creator its agent URL
and its user URL; the user client toggles the phone, the agent client sees the effect; the user
URL reaches only the user's tools of its own episode. Attacks: the agent's URL (which holds the
episode id) turned into a user URL without the key; a user key used on another episode; the user
endpoint naming another episode in `_meta`; setup and check tools called on either side.
"""

from __future__ import annotations

import json

import httpx
import mcp_types as types
import pytest
from mcp import Client

from envforge.server import EPISODE_META_KEY, Fleet, build_app, load_env, user_episode_client

from support.paths import BANK_DIR, DUAL_PHONE_DIR
from support.serving import ServerThread

USER_TOOLS = ["check_status_bar", "toggle_airplane_mode", "toggle_data"]


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.fixture(scope="module")
def served():
    fleet = Fleet([load_env(DUAL_PHONE_DIR), load_env(BANK_DIR)], ttl_seconds=600)
    with ServerThread(build_app(fleet)) as server:
        yield server, fleet


async def _episode(http: httpx.AsyncClient, env: str = "dual_phone") -> dict[str, str]:
    created = await http.post("/control/episodes", json={"env": env})
    assert created.status_code == 201, created.text
    return created.json()


async def test_two_outside_clients_drive_one_dual_control_episode(served):
    server, _ = served
    async with httpx.AsyncClient(base_url=server.url) as http:
        listed = {e["name"]: e for e in (await http.get("/control/envs")).json()["envs"]}
        assert listed["dual_phone"]["user_tools"] == [
            "check_status_bar",
            "toggle_airplane_mode",
            "toggle_data",
        ]
        assert "user_tools" not in listed["bank"]
        ep, other = await _episode(http), await _episode(http)
        assert ep["user_mcp_path"].startswith(f"/envs/dual_phone/episodes/{ep['episode_id']}/user/")
        assert "user_mcp_path" not in await _episode(http, "bank")
        async with (
            Client(server.url + ep["mcp_path"]) as agent,
            Client(server.url + ep["user_mcp_path"]) as user,
        ):
            assert [t.name for t in (await agent.list_tools()).tools] == ["get_line", "resume_line"]
            listed_user = (await user.list_tools()).tools
            assert [t.name for t in listed_user] == [
                "check_status_bar",
                "toggle_airplane_mode",
                "toggle_data",
            ]
            assert {t.name: t.annotations.read_only_hint for t in listed_user if t.annotations} == {
                "check_status_bar": True,
                "toggle_airplane_mode": False,
                "toggle_data": False,
            }
            assert _text(await user.call_tool("toggle_airplane_mode", {})) == "Airplane mode is now on."
            assert _text(await user.call_tool("check_status_bar", {})) == "Airplane mode is on. No signal."
            # each side reaches only its own tools, and neither reaches setup or check tools
            for client, name, args in [
                (user, "resume_line", {"line_id": "L-100"}),
                (user, "suspend_line", {"line_id": "L-100"}),
                (user, "assert_service_status", {"expected": "connected"}),
                (agent, "toggle_data", {}),
                (agent, "turn_airplane_mode_on", {}),
                (agent, "assert_mobile_data", {"expected": True}),
            ]:
                r = await client.call_tool(name, args)
                assert r.is_error and _text(r) == f"Error: Tool '{name}' not found."
            # the agent sees the user's change through the episode's shared state
            state = (await http.get(f"/control/episodes/{ep['episode_id']}/state")).json()["state"]
            assert state["device"][0]["airplane_mode"] == 1
            # the user endpoint is bound to its episode: naming another one is refused
            r = await user.call_tool("toggle_data", {}, meta={EPISODE_META_KEY: other["episode_id"]})
            assert r.is_error and "bound to episode" in _text(r)
        untouched = (await http.get(f"/control/episodes/{other['episode_id']}/state")).json()["state"]
        assert untouched["device"][0] == {
            "device_id": 1,
            "line_id": "L-100",
            "airplane_mode": 0,
            "mobile_data": 1,
            "line_active": 1,
        }


async def test_the_user_side_needs_its_own_key(served):
    """The agent holds its episode id; that alone, or another episode's key, reaches no user side."""
    server, _ = served
    async with httpx.AsyncClient(base_url=server.url) as http:
        ep, other = await _episode(http), await _episode(http)
        key = ep["user_mcp_path"].split("/user/")[1].split("/")[0]
        other_key = other["user_mcp_path"].split("/user/")[1].split("/")[0]
        guesses = [
            f"/envs/dual_phone/episodes/{ep['episode_id']}/user/mcp",
            f"/envs/dual_phone/episodes/{ep['episode_id']}/user/{'0' * 32}/mcp",
            f"/envs/dual_phone/episodes/{ep['episode_id']}/user/{other_key}/mcp",
            f"/envs/dual_phone/episodes/{other['episode_id']}/user/{key}/mcp",
            f"/envs/bank/episodes/{ep['episode_id']}/user/{key}/mcp",
        ]
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        for path in guesses:
            answer = await http.post(path, content=json.dumps(body), headers=headers)
            assert answer.status_code == 404, (path, answer.status_code)
        state = (await http.get(f"/control/episodes/{ep['episode_id']}/state")).json()["state"]
        assert state["device"][0]["airplane_mode"] == 0


async def test_in_process_user_client_is_bound_to_its_episode():
    fleet = Fleet([load_env(DUAL_PHONE_DIR)])
    a = await fleet.create_episode("dual_phone")
    b = await fleet.create_episode("dual_phone")
    async with user_episode_client(fleet, "dual_phone", a.id) as user:
        assert [t.name for t in await user.list_tools()] == USER_TOOLS
        assert (await user.call_tool("toggle_data")).text == "Mobile data is now off."
        assert (
            await user.call_tool("get_line", {"line_id": "L-100"})
        ).text == "Error: Tool 'get_line' not found."
    assert (await fleet.export(a.id)).state["device"][0]["mobile_data"] == 0
    assert (await fleet.export(b.id)).state["device"][0]["mobile_data"] == 1
    await fleet.aclose()
