"""The per-client MCP session cap counts each session once, from the moment its answer goes out.

A slot is reserved while an opening request is served; once the answer names the session, the
session holds the slot. Counting the reservation too until the request's handler returned made a
client that opens its next session as soon as an answer arrives look one over: a 429 at the cap
with a slot still free.
"""

from __future__ import annotations

import httpx

from envforge.server import Environment, Fleet, HTTPLimits, build_app

from support.serving import MCP_INITIALIZE, ServerThread

HANDSHAKE = {"Accept": "application/json, text/event-stream"}
LEGACY = {"Mcp-Protocol-Version": "2025-11-25"}


async def test_opening_the_last_free_session_right_after_an_answer_is_not_refused(
    bank_env: Environment,
) -> None:
    fleet = Fleet([bank_env])
    with ServerThread(build_app(fleet, limits=HTTPLimits(max_sessions_per_client=2))) as server:
        endpoint = server.url + "/envs/bank/mcp"
        async with httpx.AsyncClient(timeout=30) as client:
            refused = []
            for _ in range(30):
                first = await client.post(endpoint, json=MCP_INITIALIZE, headers=HANDSHAKE)
                second = await client.post(endpoint, json=MCP_INITIALIZE, headers=HANDSHAKE)
                assert first.status_code == 200, first.text
                if second.status_code != 200:
                    refused.append(second.text)
                opened = [a.headers.get("mcp-session-id") for a in (first, second)]
                third = await client.post(endpoint, json=MCP_INITIALIZE, headers=HANDSHAKE)
                assert third.status_code == 429 or refused, third.text  # the cap still holds
                for session in filter(None, opened):
                    ended = await client.delete(endpoint, headers={"Mcp-Session-Id": session, **LEGACY})
                    assert ended.status_code == 200, ended.text
            assert refused == []
