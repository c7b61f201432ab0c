"""Attacks on `envforge serve --workers N`: ways round the front's token and guard.

The front checks the public bearer token on `/control/*` only and adds the workers' private token to
everything it forwards, so any request the front routes as an MCP call but a worker serves as a
control call would reach the control plane with no public token. And the private token is the
only thing between a local process and a worker's own port. Real processes on 127.0.0.1; requests
go over a raw socket, since httpx removes dot segments from a URL before sending it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import httpx
import pytest

from support.paths import BANK_DIR
from support.serving import MCP_INITIALIZE, envforge_serve

TOKEN = "front-secret-0123456789"
GOOD = {"authorization": f"Bearer {TOKEN}"}
HANDSHAKE = {"Accept": "application/json, text/event-stream", "Mcp-Protocol-Version": "2025-11-25"}


def _raw(url: str, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    """Send `METHOD TARGET` exactly as written (no client-side path cleanup); (status, body)."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head.encode() + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.fixture(scope="module")
def front() -> object:
    with envforge_serve([str(BANK_DIR)], args=["--workers", "2", "--token", TOKEN]) as url:
        yield url


@pytest.mark.parametrize("up", ["..", "%2e%2e", ".%2E"])
async def test_dot_segments_after_an_episode_id_do_not_reach_a_workers_control_plane(front, up):
    """`/envs/bank/episodes/w0g0-x/../../../../control/episodes` is an MCP URL to the front (no
    public token needed) and `/control/episodes` once an HTTP client normalises it on the way to
    the worker, with the worker's token attached: a way to list, create or delete any episode."""
    climb = "/".join([up] * 4)
    for method, body in (("GET", b""), ("POST", b'{"env": "bank"}')):
        status, answer = _raw(front, method, f"/envs/bank/episodes/w0g0-x/{climb}/control/episodes", body)
        assert status == 400, (method, status, answer)
        assert b"episode_id" not in answer and b"episodes" not in answer
    status, _ = _raw(front, "GET", f"/envs/bank/episodes/w1g0-x/{climb}/control/stats")
    assert status == 400
    async with httpx.AsyncClient(base_url=front, timeout=30) as http:
        listed = await http.get("/control/episodes", headers=GOOD)
        assert listed.status_code == 200 and listed.json()["episodes"] == []


async def test_ids_with_a_forged_prefix_of_thousands_of_digits_are_unknown_not_500(front):
    """The front reads the worker and generation out of an id's prefix; Python's int() refuses
    more than 4300 digits, which answered 500 (and logged a traceback) for every such request."""
    huge = "1" * 5000
    async with httpx.AsyncClient(base_url=front, timeout=30, headers=GOOD) as http:
        for forged in (f"w{huge}g0-x", f"w0g{huge}-x"):
            assert (await http.get(f"/control/episodes/{forged}/state")).status_code == 404
            assert (await http.post(f"/envs/bank/episodes/{forged}/mcp", json={})).status_code == 404
            session = {"mcp-session-id": forged, "accept": "application/json, text/event-stream"}
            assert (await http.post("/envs/bank/mcp", json={}, headers=session)).status_code == 404


async def test_an_answer_relayed_from_a_worker_has_one_date_and_one_server(front):
    """The front's own server adds both to every answer; relayed too, each went out twice."""
    async with httpx.AsyncClient(base_url=front, timeout=30, headers=GOOD) as http:
        made = (await http.post("/control/episodes", json={"env": "bank"})).json()
        try:
            state = await http.get(f"/control/episodes/{made['episode_id']}/state")
            assert state.status_code == 200
            assert len(state.headers.get_list("date")) == len(state.headers.get_list("server")) == 1
        finally:
            await http.delete(f"/control/episodes/{made['episode_id']}")


async def test_the_workers_private_token_is_not_on_their_command_lines(front):
    """Any local user reads every process's arguments (`ps`); with the workers' token it could go
    straight to a worker's port, past the front's public token, guard and caps, and name any client."""
    async with httpx.AsyncClient(base_url=front, timeout=30) as http:
        stats = (await http.get("/control/stats", headers=GOOD)).json()
    for pid, address in zip(stats["worker_pids"], stats["worker_addresses"], strict=True):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert not any(b'"token"' in a for a in args), "the worker's token is on its command line"
        refused = httpx.get(f"http://{address}/control/episodes", headers=GOOD)
        assert refused.status_code == 403  # and the public token does not open it either


async def test_concurrent_opens_never_get_a_client_past_its_caps() -> None:
    """A client at its cap is recounted from the workers' listings; an episode (or session) made
    while a worker was being listed was missing from the recount, so a burst of concurrent creates
    got 5 episodes under a cap of 3."""
    cap = 3
    caps = ["--max-episodes-per-client", str(cap), "--max-sessions-per-client", str(cap)]
    with envforge_serve([str(BANK_DIR)], args=["--workers", "2", *caps]) as url:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
            made: list[str] = []
            opened: list[str] = []

            async def create() -> None:
                answer = await http.post("/control/episodes", json={"env": "bank"})
                if answer.status_code == 201:
                    made.append(answer.json()["episode_id"])

            async def open_session() -> None:
                answer = await http.post("/envs/bank/mcp", json=MCP_INITIALIZE, headers=HANDSHAKE)
                if answer.status_code == 200:
                    opened.append(answer.headers["mcp-session-id"])

            for _ in range(3):
                async with anyio.create_task_group() as tg:
                    for _ in range(40):
                        tg.start_soon(create)
                        tg.start_soon(open_session)
            assert len(made) == cap, made
            assert len(opened) == cap, opened
            assert len((await http.get("/control/episodes")).json()["episodes"]) == cap
