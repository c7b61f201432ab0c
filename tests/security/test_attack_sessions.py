"""Attacks on episode addressing over real streamable HTTP on 127.0.0.1, with stock `mcp` clients.

Each test is the attack: forged or borrowed session ids, `_meta` redirection, reuse of an expired
episode, an abandoned session, and a flood of sessions. The fleet serves the bank fixture env.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from envforge.server import (
    DEFAULT_EPISODE_BYTES_PER_CLIENT,
    EPISODE_META_KEY,
    Environment,
    Fleet,
    HTTPLimits,
    build_app,
)

from support.serving import MCP_INITIALIZE, ServerThread

TRANSFER = {"src": "A-1", "dst": "A-2", "amount": 7}
STATELESS = "2026-07-28"
"""The stateless protocol revision, pinned so the client skips discovery and goes straight to calls."""


def _text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


@contextmanager
def serve(env: Environment, **fleet_kwargs: Any) -> Iterator[tuple[str, Fleet]]:
    fleet = Fleet([env], **fleet_kwargs)
    with ServerThread(build_app(fleet, reap_interval=0.05)) as server:
        yield server.url, fleet


def _client(url: str, *, mode: str = "auto", headers: dict[str, str] | None = None, **http: Any) -> Client:
    """A stock MCP client whose HTTP requests carry `headers` (and go out through `http` options)."""
    transport = httpx2.AsyncHTTPTransport(**http) if http else None
    http_client = httpx2.AsyncClient(headers=headers or {}, transport=transport, timeout=30)
    return Client(streamable_http_client(url, http_client=http_client), mode=mode)  # type: ignore[arg-type]


async def _balances(fleet: Fleet, episode_id: str) -> dict[str, float]:
    state, _ = await fleet.export(episode_id)
    return {a["account_id"]: a["balance"] for a in state["accounts"]}


async def _attempt(
    client: Client, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
) -> str:
    """Call a tool and return what came back, as text: a result, a tool error or a protocol error."""
    try:
        result = await client.call_tool(tool, arguments, meta=meta)
    except Exception as exc:  # a JSON-RPC / HTTP rejection is a refusal too
        return f"rejected: {exc}"
    return ("error: " if result.is_error else "ok: ") + _text(result)


async def test_invented_session_id_gets_no_write(bank_env):
    with serve(bank_env) as (url, fleet):
        async with _client(
            url + "/envs/bank/mcp", mode=STATELESS, headers={"Mcp-Session-Id": uuid.uuid4().hex}
        ) as forger:
            outcome = await _attempt(forger, "transfer", TRANSFER)
        assert not outcome.startswith("ok"), outcome
        # no episode was adopted for the invented id, so nothing anywhere holds the write
        for episode_id in fleet.store.ids():
            assert (await _balances(fleet, episode_id))["A-1"] == 100.0


async def test_known_legacy_session_id_gives_no_access_to_its_episode(bank_env):
    with serve(bank_env) as (url, fleet):
        endpoint = url + "/envs/bank/mcp"
        async with Client(endpoint, mode="legacy") as victim:
            assert not (await victim.call_tool("transfer", TRANSFER)).is_error
            ((victim_session, victim_episode),) = fleet.mcp("bank")._session_episodes.items()
            # the attacker learnt the victim's session id (a log line, a proxy) and speaks 2026
            async with _client(endpoint, mode=STATELESS, headers={"Mcp-Session-Id": victim_session}) as thief:
                peek = await _attempt(thief, "get_account", {"account_id": "A-1"})
                write = await _attempt(thief, "transfer", {"src": "A-1", "dst": "A-3", "amount": 50})
            assert "93" not in peek, f"the victim's balance leaked: {peek}"
            assert not write.startswith("ok"), write
            assert (await _balances(fleet, victim_episode))["A-1"] == 93.0
            mine = json.loads(_text(await victim.call_tool("get_account", {"account_id": "A-1"})))
            assert mine["balance"] == 93.0


async def test_meta_cannot_redirect_a_per_episode_url(bank_env):
    with serve(bank_env) as (url, fleet):
        async with httpx.AsyncClient(base_url=url) as http:
            mine = (await http.post("/control/episodes", json={"env": "bank"})).json()
            other = (await http.post("/control/episodes", json={"env": "bank"})).json()
        async with Client(url + mine["mcp_path"]) as client:
            redirected = await client.call_tool(
                "transfer", TRANSFER, meta={EPISODE_META_KEY: other["episode_id"]}
            )
            assert redirected.is_error and "bound to episode" in _text(redirected)
            same = await client.call_tool("transfer", TRANSFER, meta={EPISODE_META_KEY: mine["episode_id"]})
            assert not same.is_error, _text(same)
        assert (await _balances(fleet, other["episode_id"]))["A-1"] == 100.0
        assert (await _balances(fleet, mine["episode_id"]))["A-1"] == 93.0


async def test_episode_ids_are_unguessable_capabilities(bank_env):
    with serve(bank_env) as (url, _):
        async with httpx.AsyncClient(base_url=url) as http:
            ids = [
                (await http.post("/control/episodes", json={"env": "bank"})).json()["episode_id"]
                for _ in range(3)
            ]
    assert all(len(bytes.fromhex(i)) * 8 >= 128 for i in ids) and len(set(ids)) == 3


async def test_expired_episode_answers_a_clear_error_not_a_fresh_seed(bank_env):
    with serve(bank_env, ttl_seconds=0.4) as (url, fleet):
        endpoint = url + "/envs/bank/mcp"
        async with httpx.AsyncClient(base_url=url) as http:
            pinned = (await http.post("/control/episodes", json={"env": "bank"})).json()
        async with Client(endpoint, mode="legacy") as legacy:
            assert not (await legacy.call_tool("transfer", TRANSFER)).is_error
            await anyio.sleep(1.2)  # idle past the TTL: the reaper closes both episodes
            assert len(fleet.store) == 0
            late = await legacy.call_tool("get_account", {"account_id": "A-1"})
            assert late.is_error and "expired" in _text(late), _text(late)
            assert len(fleet.store) == 0  # nothing restarted from the seed behind the client
        async with Client(endpoint) as by_meta:
            gone = await by_meta.call_tool(
                "get_account", {"account_id": "A-1"}, meta={EPISODE_META_KEY: pinned["episode_id"]}
            )
            assert gone.is_error and "expired" in _text(gone), _text(gone)
        async with httpx.AsyncClient(base_url=url) as http:
            answer = await http.post(pinned["mcp_path"], json={})
            assert answer.status_code == 404 and "expired" in answer.json()["error"]
            state = await http.get(f"/control/episodes/{pinned['episode_id']}/state")
            assert state.status_code == 404 and "expired" in state.json()["error"]


async def test_deleting_the_session_closes_its_episode(bank_env):
    with serve(bank_env) as (url, fleet):
        async with Client(url + "/envs/bank/mcp", mode="legacy") as client:  # exits with HTTP DELETE
            assert not (await client.call_tool("transfer", TRANSFER)).is_error
            (episode_id,) = fleet.store.ids()
        deadline = time.monotonic() + 5
        while fleet.store.find(episode_id) is not None and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        assert fleet.store.find(episode_id) is None
        assert fleet.store.ended(episode_id) == "closed"


async def test_session_flood_is_capped_per_client_and_others_are_still_served(bank_env):
    with serve(bank_env, max_episodes=64, max_episodes_per_client=6) as (url, fleet):
        endpoint = url + "/envs/bank/mcp"

        async def new_forged_id(request: httpx2.Request) -> None:
            request.headers["Mcp-Session-Id"] = uuid.uuid4().hex

        forged = httpx2.AsyncClient(event_hooks={"request": [new_forged_id]}, timeout=30)
        async with Client(streamable_http_client(endpoint, http_client=forged), mode=STATELESS) as flooder:  # type: ignore[arg-type]
            for _ in range(40):
                await _attempt(flooder, "transfer", TRANSFER)
        assert len(fleet.store) <= 6, f"made-up session ids opened {len(fleet.store)} episodes"

        # real sessions from one address: the first six get episodes, the rest are refused
        outcomes = []
        async with anyio.create_task_group() as tg:

            async def one_session() -> None:
                async with Client(endpoint, mode="legacy") as client:
                    outcomes.append(await _attempt(client, "transfer", TRANSFER))
                    await anyio.sleep(1.0)  # hold the session open while the others try

            for _ in range(10):
                tg.start_soon(one_session)
        assert sum(o.startswith("ok") for o in outcomes) <= 6
        assert any("limit" in o for o in outcomes), outcomes
        async with httpx.AsyncClient(base_url=url) as http:
            for _ in range(7):
                await http.post("/control/episodes", json={"env": "bank"})
            capped = await http.post("/control/episodes", json={"env": "bank"})
            assert capped.status_code == 429, capped.text

        # another client (another loopback address) is still served, over MCP and the control plane
        async with _client(endpoint, mode="legacy", local_address="127.0.0.2") as other:
            served = await other.call_tool("transfer", TRANSFER)
            assert not served.is_error, _text(served)
        other_http = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with httpx.AsyncClient(base_url=url, transport=other_http) as http:
            assert (await http.post("/control/episodes", json={"env": "bank"})).status_code == 201
            listing = (await http.get("/control/episodes")).json()["episodes"]
        owners = {e["owner"] for e in listing}
        assert owners == {"addr:127.0.0.1", "addr:127.0.0.2"}
        assert all({"episode_id", "env", "created_at", "last_used_at", "calls"} <= set(e) for e in listing)
        assert sum(e["owner"] == "addr:127.0.0.1" for e in listing) == 6


async def test_shared_seed_view_cannot_be_listed_named_exported_closed_or_written(bank_env):
    """Stateless clients all read one seed view: no client path may reach it to change it."""
    with serve(bank_env) as (url, fleet):
        endpoint = url + "/envs/bank/mcp"
        async with _client(endpoint, mode=STATELESS) as stateless:
            before = await _attempt(stateless, "get_account", {"account_id": "A-1"})
            assert before.startswith("ok") and "100" in before, before
            async with httpx.AsyncClient(base_url=url) as http:
                listing = (await http.get("/control/episodes")).json()["episodes"]
                # the view's id leaked anyway (a log line, a debugger): it still opens nothing
                leaked = {(await fleet.shared_seed_episode("bank")).id} | {e["episode_id"] for e in listing}
                for view_id in leaked:
                    async with _client(endpoint, mode=STATELESS) as attacker:
                        write = await _attempt(
                            attacker,
                            "transfer",
                            {"src": "A-1", "dst": "A-2", "amount": 60},
                            meta={EPISODE_META_KEY: view_id},
                        )
                    assert not write.startswith("ok"), write
                    path = quote(view_id, safe="")
                    assert (await http.post(f"/envs/bank/episodes/{path}/mcp", json={})).status_code == 404
                    assert (await http.get(f"/control/episodes/{path}/state")).status_code == 404
                    assert (await http.delete(f"/control/episodes/{path}")).status_code == 404
            assert listing == [], f"the seed view is listed: {listing}"
            after = await _attempt(stateless, "get_account", {"account_id": "A-1"})
            assert after == before, f"the shared seed changed for every stateless client: {after}"
            refused = await _attempt(stateless, "transfer", TRANSFER)
            assert refused.startswith("error") and "not bound to an episode" in refused, refused


INITIALIZE = MCP_INITIALIZE
HANDSHAKE = {"Accept": "application/json, text/event-stream"}


async def test_one_client_cannot_take_every_mcp_session_slot(bank_env):
    """Bare `initialize`s open sessions without episodes: the per-client cap must bound them."""
    fleet = Fleet([bank_env])
    with ServerThread(build_app(fleet, limits=HTTPLimits(max_sessions_per_client=5))) as server:
        endpoint = server.url + "/envs/bank/mcp"
        async with httpx.AsyncClient(timeout=30) as flooder:
            answers: list[httpx.Response] = []

            async def initialize() -> None:
                answers.append(await flooder.post(endpoint, json=INITIALIZE, headers=HANDSHAKE))

            async with anyio.create_task_group() as tg:  # concurrent: slots are reserved up front
                for _ in range(12):
                    tg.start_soon(initialize)
            opened = [a.headers["mcp-session-id"] for a in answers if a.status_code == 200]
            assert len(opened) == 5, sorted(a.status_code for a in answers)
            refused = next(a for a in answers if a.status_code != 200)
            assert refused.status_code == 429, refused.text
            assert "limit 5 per client" in refused.json()["error"]["message"], refused.text

            # another client still opens a session and gets its own episode
            async with _client(endpoint, mode="legacy", local_address="127.0.0.2") as other:
                served = await other.call_tool("transfer", TRANSFER)
                assert not served.is_error, _text(served)

            # the flooder ends one of its sessions: that slot is free again
            ended = await flooder.delete(
                endpoint, headers={"Mcp-Session-Id": opened[0], "Mcp-Protocol-Version": "2025-11-25"}
            )
            assert ended.status_code == 200, ended.text
            again = await flooder.post(endpoint, json=INITIALIZE, headers=HANDSHAKE)
            assert again.status_code == 200, again.text
            assert (await flooder.post(endpoint, json=INITIALIZE, headers=HANDSHAKE)).status_code == 429


async def test_big_states_fill_a_byte_budget_not_the_server(bank_env):
    """The attack: episodes created with ~10 MiB states each, as many as the per-client count
    allows (1,024 of them would hold ~30 GiB). Each episode counts its state and its room to grow
    against the client's byte budget: past it the client gets a 429 saying so, another client is
    still served, and closing an episode gives its bytes back."""
    names = {"C-1": "x" * (5 * 1024 * 1024), "C-2": "y" * (5 * 1024 * 1024)}
    state = bank_env.seed_state()
    customers = [{**c, "name": names.get(c["customer_id"], c["name"])} for c in state["customers"]]
    big = {"env": "bank", "state": {**state, "customers": customers}}
    budget = 48 * 1024 * 1024  # two such episodes (2 x 10 MiB + 1 MiB to grow each), not three
    with serve(bank_env, max_episodes_per_client=1024, max_episode_bytes_per_client=budget) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            made = [await http.post("/control/episodes", json=big) for _ in range(3)]
            assert [r.status_code for r in made] == [201, 201, 429], [r.text[:200] for r in made]
            error = made[2].json()["error"]
            assert "MiB of episode databases" in error and "limit 48 MiB per client" in error, error
            other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(base_url=url, transport=other, timeout=60) as second:
                assert (await second.post("/control/episodes", json=big)).status_code == 201
            gone = made[0].json()["episode_id"]
            assert (await http.delete(f"/control/episodes/{gone}")).status_code in (200, 204)
            again = await http.post("/control/episodes", json=big)
            assert again.status_code == 201, again.text[:200]


async def test_an_episode_cannot_grow_without_bound(bank_env):
    """The attack: write 10,000-character memos until memory runs out. An episode's database may
    grow 1 MiB past its starting state (DEFAULT_EPISODE_GROWTH); the write past that is an error
    that changes nothing, and the episode goes on answering."""
    async with Fleet([bank_env]) as fleet:
        episode = await fleet.create_episode("bank")
        memo = {**TRANSFER, "amount": 0.01, "memo": "m" * 9_999}
        made = 0
        while not (result := await fleet.call(episode.id, "transfer", memo)).is_error and made < 1000:
            made += 1
        assert result.is_error and 60 < made < 150, (made, result.text)
        assert "full" in result.text, result.text
        state, _ = await fleet.export(episode.id)
        assert len(state["transfers"]) == made
        assert not (await fleet.call(episode.id, "get_account", {"account_id": "A-1"})).is_error


async def test_a_thousand_small_episodes_fit_the_default_budget(bank_env):
    """The well-behaved side of the byte budget: one client opening a thousand episodes of a
    small env under the default limits gets every one."""
    fleet = Fleet(
        [bank_env],
        max_episodes_per_client=1024,
        max_episode_bytes_per_client=DEFAULT_EPISODE_BYTES_PER_CLIENT,
    )
    async with fleet:
        for _ in range(1000):
            await fleet.create_episode("bank", owner="addr:127.0.0.1")
        assert fleet.store.open_for("addr:127.0.0.1") == 1000


async def test_a_client_over_its_cap_is_refused_before_its_state_is_built(bank_env):
    """The attack: a client at its cap keeps posting states of 60,000 rows. Building one costs
    the server far more CPU than reading it, so each refusal must come before that work."""
    state = bank_env.seed_state()
    accounts = [
        {"account_id": f"A-{i}", "customer_id": "C-1", "balance": 1.0, "status": "open"}
        for i in range(100, 60_100)
    ]
    big = {"env": "bank", "state": {**state, "accounts": state["accounts"] + accounts}}
    with serve(bank_env, max_episodes_per_client=1) as (url, _):
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            # the fastest of two builds against the fastest of three refusals: one sample of each
            # was at the mercy of a busy machine's pauses
            builds: list[float] = []
            for attempt in range(2):
                started = time.perf_counter()
                made = await http.post("/control/episodes", json=big)
                builds.append(time.perf_counter() - started)
                assert made.status_code == 201, made.text[:200]
                if attempt == 0:
                    ended = await http.delete(f"/control/episodes/{made.json()['episode_id']}")
                    assert ended.status_code == 200, ended.text[:200]
            refusals: list[float] = []
            for _ in range(3):
                started = time.perf_counter()
                refused = await http.post("/control/episodes", json=big)
                refusals.append(time.perf_counter() - started)
                assert refused.status_code == 429, refused.text[:200]
    assert min(refusals) < min(builds) / 2, (refusals, builds)


async def test_concurrent_big_states_past_the_budget_are_refused_unbuilt(bank_env):
    """The attack: eight ~5 MB states posted at once by one client whose byte budget fits two.
    Each would pass a check that counts only an episode's room to grow, and all eight would be
    built (CPU and memory) before six were refused. The body's size stands for the database it
    makes, so the six are refused unbuilt: the eight requests cost ~5 builds' time (reading the
    bodies included), not 11."""
    state = bank_env.seed_state()
    accounts = [
        {"account_id": f"A-{i}", "customer_id": "C-1", "balance": 1.0, "status": "open"}
        for i in range(100, 60_100)
    ]
    big = {"env": "bank", "state": {**state, "accounts": state["accounts"] + accounts}}
    database = bank_env.database_from_state(big["state"])
    budget = 2 * (2 * len(database) + 2**20) + 2**19  # two episodes, not three
    with serve(bank_env, max_episode_bytes_per_client=budget) as (url, fleet):
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            # one build's time, as the mean of three in a row: a single one swings with whatever
            # else the machine is doing late in a long test run
            started = time.perf_counter()
            for _ in range(3):
                first = await http.post("/control/episodes", json=big)
                assert first.status_code == 201, first.text[:200]
                await http.delete(f"/control/episodes/{first.json()['episode_id']}")
            one_build = (time.perf_counter() - started) / 3
            started = time.perf_counter()
            answers: list[httpx.Response] = []
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(lambda: _post(http, big, answers))
            eight = time.perf_counter() - started
        assert not fleet._builds  # a client with nothing building leaves nothing behind
    codes = sorted(a.status_code for a in answers)
    assert codes == [201, 201, *[429] * 6], codes
    assert eight < 8 * one_build, (eight, one_build)  # eight builds took 11x one


async def _post(http: httpx.AsyncClient, body: dict[str, Any], into: list[httpx.Response]) -> None:
    into.append(await http.post("/control/episodes", json=body))
