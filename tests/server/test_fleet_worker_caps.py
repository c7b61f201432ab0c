"""Per-client caps of `envforge serve --workers 2` hold for the fleet, not per worker.

One client spread over every worker gets each cap once in all, never N times; and one whose
requests all land on one worker (another client's take turns with its own) still gets the whole
of its cap, not a worker's share. Real processes on 127.0.0.1; the second client is another
loopback address (a client is its bearer token, else its address).
"""

from __future__ import annotations

import httpx

from support.paths import BANK_DIR
from support.serving import MCP_INITIALIZE, envforge_serve

HANDSHAKE = {"Accept": "application/json, text/event-stream"}
LEGACY = {"Mcp-Protocol-Version": "2025-11-25"}
STATELESS = "2026-07-28"
CAP = 4


async def test_one_client_gets_its_mcp_session_cap_once_over_every_worker() -> None:
    args = ["--workers", "2", "--max-sessions-per-client", str(CAP)]
    with envforge_serve([str(BANK_DIR)], args=args) as url:
        endpoint = url + "/envs/bank/mcp"
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with (
            httpx.AsyncClient(timeout=30) as one,
            httpx.AsyncClient(timeout=30, transport=other) as two,
        ):

            async def open_session(client: httpx.AsyncClient) -> httpx.Response:
                return await client.post(endpoint, json=MCP_INITIALIZE, headers=HANDSHAKE)

            # alone: its sessions go round robin over both workers, and it gets CAP of them in all
            answers = [await open_session(one) for _ in range(2 * CAP)]
            assert [a.status_code for a in answers] == [200] * CAP + [429] * CAP, [a.text for a in answers]
            opened = [a.headers["mcp-session-id"] for a in answers[:CAP]]
            assert {s[:5] for s in opened} == {"w0g0-", "w1g0-"}
            assert f"limit {CAP} per client, across every worker" in answers[-1].json()["error"]["message"]

            # at its cap it still makes stateless calls (they open no session)
            listed = await one.post(
                endpoint,
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
                headers={**HANDSHAKE, "Mcp-Protocol-Version": STATELESS},
            )
            assert listed.status_code != 429, listed.text

            # ending a session frees its slot, on whichever worker it was
            for session in opened:
                ended = await one.delete(endpoint, headers={"Mcp-Session-Id": session, **LEGACY})
                assert ended.status_code == 200, ended.text

            # taking turns with another client, every one of its sessions lands on one worker
            mine, theirs = [], []
            for _ in range(CAP + 2):
                mine.append(await open_session(one))
                theirs.append(await open_session(two))
            assert [a.status_code for a in mine] == [200] * CAP + [429] * 2, [a.text for a in mine]
            assert len({a.headers["mcp-session-id"][:5] for a in mine[:CAP]}) == 1
            assert [a.status_code for a in theirs] == [200] * CAP + [429] * 2, [a.text for a in theirs]


async def test_one_client_over_every_worker_never_holds_more_than_its_mib_budget() -> None:
    """The MiB budget is split over the workers: spread over both, a client fits no more episodes
    than one server with the whole budget gives it (fewer is allowed, more never)."""

    async def fits(args: list[str]) -> list[str]:
        with envforge_serve([str(BANK_DIR)], args=["--max-episode-mib-per-client", "8", *args]) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                made = []
                for _ in range(40):
                    answer = await http.post("/control/episodes", json={"env": "bank"})
                    if answer.status_code != 201:
                        assert answer.status_code == 429 and "MiB" in answer.json()["error"], answer.text
                        return made
                    made.append(answer.json()["episode_id"])
        raise AssertionError("no MiB budget was reached")

    alone = await fits([])
    spread = await fits(["--workers", "2"])
    assert {e[:5] for e in spread} == {"w0g0-", "w1g0-"}
    assert 0 < len(spread) <= len(alone), (len(spread), len(alone))
