"""Every transport for real: in-process, stdio as a subprocess, streamable HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import sys

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from envforge.server import EPISODE_META_KEY, EnvClients, Fleet, build_app, episode_client

from support.paths import BANK_DIR


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_in_process_lists_tools_with_hints_and_policy(bank_env):
    fleet = Fleet([bank_env])
    async with Client(fleet.mcp("bank").server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert client.instructions == bank_env.policy
    assert tools["get_account"].annotations.read_only_hint is True
    assert tools["transfer"].annotations.destructive_hint is True
    assert tools["transfer"].input_schema == bank_env.tools["transfer"].input_schema
    await fleet.aclose()


async def test_in_process_meta_routes_to_episodes(bank_env):
    fleet = Fleet([bank_env])
    a = await fleet.create_episode("bank")
    b = await fleet.create_episode("bank")
    async with episode_client(fleet, "bank", a.id) as ca, episode_client(fleet, "bank", b.id) as cb:
        assert not (await ca.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 40})).is_error
        assert json.loads((await ca.call_tool("get_account", {"account_id": "A-1"})).text)["balance"] == 60.0
        assert json.loads((await cb.call_tool("get_account", {"account_id": "A-1"})).text)["balance"] == 100.0
    async with Client(fleet.mcp("bank").server) as client:
        unbound_write = await client.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 1})
        assert unbound_write.is_error and "not bound to an episode" in _text(unbound_write)
        unbound_read = await client.call_tool("get_account", {"account_id": "A-1"})
        assert json.loads(_text(unbound_read))["balance"] == 100.0  # the seed state, read-only
        gone = await client.call_tool("get_account", {"account_id": "A-1"}, meta={EPISODE_META_KEY: "nope"})
        assert gone.is_error and "episode 'nope' does not exist" in _text(gone)
    await fleet.aclose()


async def test_shared_env_client_keeps_concurrent_episodes_apart(bank_env):
    """`EnvClients`: one session per env serves many episodes at once, each call in its own."""
    fleet = Fleet([bank_env])
    ids = [(await fleet.create_episode("bank")).id for _ in range(8)]

    async def spend(clients: EnvClients, i: int, episode_id: str) -> None:
        async with clients.episode("bank", episode_id) as client:
            assert {t.name for t in await client.list_tools()} >= {"transfer", "get_account"}
            for _ in range(i):
                assert not (
                    await client.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 1})
                ).is_error

    async with EnvClients(fleet) as clients:
        async with anyio.create_task_group() as tg:
            for i, episode_id in enumerate(ids):
                tg.start_soon(spend, clients, i, episode_id)
        for i, episode_id in enumerate(ids):
            async with clients.episode("bank", episode_id) as client:
                got = json.loads((await client.call_tool("get_account", {"account_id": "A-1"})).text)
                assert got["balance"] == 100.0 - i
    await fleet.aclose()


async def test_stdio_subprocess_serves_one_episode(tmp_path):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "envforge.cli", "serve", str(BANK_DIR), "--transport", "stdio"],
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"},
    )
    async with Client(params) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "transfer" in names
        r = await client.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 10})
        assert not r.is_error, _text(r)
        again = await client.call_tool("get_account", {"account_id": "A-2"})
        assert json.loads(_text(again))["balance"] == 60.0  # same episode across calls
        bad = await client.call_tool("transfer", {"src": "A-1"})
        assert bad.is_error and "missing required argument 'dst'" in _text(bad)
        still = await client.call_tool("get_account", {"account_id": "A-1"})
        assert json.loads(_text(still))["balance"] == 90.0


async def test_http_control_plane_and_episode_urls(http_fleet):
    server, fleet = http_fleet
    async with httpx.AsyncClient(base_url=server.url) as http:
        envs = (await http.get("/control/envs")).json()["envs"]
        assert envs[0]["name"] == "bank" and "transfer" in envs[0]["tools"]
        created = await http.post("/control/episodes", json={"env": "bank"})
        assert created.status_code == 201
        ep = created.json()
        other = (await http.post("/control/episodes", json={"env": "bank"})).json()
        async with Client(server.url + ep["mcp_path"]) as client:  # a stock client: the URL alone
            r = await client.call_tool("transfer", {"src": "A-1", "dst": "A-4", "amount": 25})
            assert not r.is_error, _text(r)
        state = (await http.get(f"/control/episodes/{ep['episode_id']}/state")).json()
        assert {a["account_id"]: a["balance"] for a in state["state"]["accounts"]}["A-4"] == 25.0
        untouched = (await http.get(f"/control/episodes/{other['episode_id']}/state")).json()
        assert untouched["state_hash"] == fleet.envs["bank"].seed_hash()
        # _meta also routes over HTTP, on the plain env URL
        async with Client(server.url + "/envs/bank/mcp") as client:
            r = await client.call_tool(
                "get_account", {"account_id": "A-4"}, meta={EPISODE_META_KEY: ep["episode_id"]}
            )
            assert json.loads(_text(r))["balance"] == 25.0
        assert (await http.delete(f"/control/episodes/{ep['episode_id']}")).json() == {"closed": True}
        assert (await http.get(f"/control/episodes/{ep['episode_id']}/state")).status_code == 404
        assert (await http.post(f"{ep['mcp_path']}", json={})).status_code == 404
        assert (await http.post("/control/episodes", json={"env": "nope"})).status_code == 404
        assert (await http.post("/control/episodes", content=b"not json")).status_code == 400
        bad_state = await http.post("/control/episodes", json={"env": "bank", "state": {"nope": []}})
        assert bad_state.status_code == 400 and "unknown table" in bad_state.json()["error"]


async def test_http_legacy_sessions_get_private_episodes_and_stateless_writes_are_refused(http_fleet):
    server, _ = http_fleet
    url = server.url + "/envs/bank/mcp"
    async with Client(url, mode="legacy") as one, Client(url, mode="legacy") as two:
        assert not (await one.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 7})).is_error
        mine = json.loads(_text(await one.call_tool("get_account", {"account_id": "A-1"})))
        theirs = json.loads(_text(await two.call_tool("get_account", {"account_id": "A-1"})))
        assert (mine["balance"], theirs["balance"]) == (93.0, 100.0)
    async with Client(url) as stateless:  # 2026-era protocol: no session id on the wire
        refused = await stateless.call_tool("transfer", {"src": "A-1", "dst": "A-2", "amount": 7})
        assert refused.is_error and "writes are refused" in _text(refused)


async def test_control_plane_requires_token_off_loopback(bank_env):
    from support.serving import ServerThread

    with pytest.raises(ValueError, match="bearer token"):
        build_app(Fleet([bank_env]), host="0.0.0.0")
    # bound for the test on loopback, but configured as if public: the token is enforced
    app = build_app(Fleet([bank_env]), host="0.0.0.0", token="s3cret")
    with ServerThread(app) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.post("/control/episodes", json={"env": "bank"})).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await http.get("/control/envs", headers=wrong)).status_code == 401
            ok = await http.post(
                "/control/episodes", json={"env": "bank"}, headers={"Authorization": "Bearer s3cret"}
            )
            assert ok.status_code == 201
