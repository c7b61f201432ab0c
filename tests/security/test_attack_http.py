"""Attacks on the HTTP surface of `envforge serve`, run as a real subprocess on 127.0.0.1.

Each test is the attack: a rebinding `Host`, a cross-origin form post, oversized, stalled and
over-deep bodies, a malformed credential, a wildcard bind without a token, and a socket flood
that exhausts file descriptors. Socket counts and waits are bounded so the suite stays quick.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from envforge.server import Fleet, build_app

from support.bank_server import TOKEN, serve_bank
from support.paths import BANK_DIR
from support.serving import MCP_INITIALIZE, free_port

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`envforge serve` as an operator starts it: default limits, a token."""
    with serve_bank(log=tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


@pytest.fixture(scope="module")
def impatient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`envforge serve` with one-second header and body timeouts, so stalls are cut off quickly."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_bank("--header-timeout", "1", "--body-timeout", "1", log=log) as url:
        yield url


def _raw(url: str, request: bytes, *, wait: float = 5.0) -> bytes:
    """Send raw bytes and return everything the server answers before closing (or `wait` passing)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(request)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and b"connection: close" not in b"".join(chunks).lower():
                    break
        except TimeoutError:
            pass
        return b"".join(chunks)


def _open_episodes(url: str) -> int:
    return int(httpx.get(url + "/control/stats", headers=AUTH).json()["open_episodes"])


def test_rebinding_host_is_refused(served):
    for path in ("/control/envs", "/control/episodes", "/healthz"):
        answer = httpx.get(served + path, headers={**AUTH, "Host": "evil.example"})
        assert answer.status_code == 421, (path, answer.status_code)
    created = httpx.post(
        served + "/control/episodes", json={"env": "bank"}, headers={**AUTH, "Host": "evil.example:80"}
    )
    assert created.status_code == 421
    assert httpx.get(served + "/control/envs", headers=AUTH).status_code == 200  # a loopback Host is fine


def test_cross_origin_text_plain_post_is_refused(served):
    before = _open_episodes(served)
    # what a page on evil.example can send without a CORS preflight
    form = {**AUTH, "Origin": "http://evil.example", "Content-Type": "text/plain"}
    answer = httpx.post(served + "/control/episodes", content=b'{"env": "bank"}', headers=form)
    assert answer.status_code == 403
    # the same body without an Origin (a non-browser) still is not JSON by its Content-Type
    text_plain = {**AUTH, "Content-Type": "text/plain"}
    plain = httpx.post(served + "/control/episodes", content=b'{"env": "bank"}', headers=text_plain)
    assert plain.status_code == 415
    assert _open_episodes(served) == before


def test_fifty_megabyte_body_is_refused_with_413(served):
    head = (
        "POST /control/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {50 * 1024 * 1024}\r\n\r\n"
    ).encode()
    answer = _raw(served, head + b'{"env": "bank", "state": {"accounts": [')
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_stalled_body_is_cut_off(impatient):
    head = (
        "POST /control/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    started = time.monotonic()
    answer = _raw(impatient, head + b'{"env": ', wait=10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 5


def test_stalled_headers_are_cut_off(impatient):
    host, port = impatient.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never finishes
        started = time.monotonic()
        assert sock.recv(1024) == b""  # the server hangs up
        assert time.monotonic() - started < 5


def test_deeply_nested_json_is_a_400(served):
    depth = 100_000
    for nested in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
        body = f'{{"env": "bank", "state": {{"accounts": {nested}}}}}'
        answer = httpx.post(
            served + "/control/episodes", content=body, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert answer.status_code == 400, answer.text[:200]
    assert httpx.get(served + "/healthz").status_code == 200


# (raw JSON of `state`, what the one-line 400 must name); the bank's seed is a valid start
BAD_STATES = [
    ('{"accounts": 5}', "'accounts'"),
    ('{"accounts": null}', "'accounts'"),
    ('{"accounts": true}', "'accounts'"),
    ('{"accounts": "A-1"}', "'accounts'"),
    ('{"accounts": {"account_id": "A-1"}}', "'accounts'"),
    ('{"accounts": [5]}', "accounts[0]"),
    ('{"customers": [{"customer_id": "C-9", "name": "x"}, {}]}', "customers[1]"),
    ('{"transfers": [{"transfer_id": 1000000000000000000000000000000}]}', "'transfer_id'"),
    ('{"customers": [{"customer_id": "\\ud800", "name": "x"}]}', "'customer_id'"),
    ('{"customers": [{"\\ud800": "C-9"}]}', "customers[0]"),
    ('{"customers": [{"customer_id\\u0000": "C-9"}]}', "customers[0]"),
    ('{"customers": [{"customer_id": "C-9", "nickname": "x"}]}', "nickname"),
]


def test_malformed_state_is_a_one_line_400_naming_the_fault(tmp_path):
    log = tmp_path / "serve.log"
    with serve_bank(log=log) as url:
        for state, names in BAD_STATES:
            body = f'{{"env": "bank", "state": {state}}}'
            answer = httpx.post(
                url + "/control/episodes", content=body, headers={**AUTH, "Content-Type": "application/json"}
            )
            assert answer.status_code == 400, (state, answer.status_code, answer.text[:300])
            error = answer.json()["error"]
            assert names in error and "\n" not in error, (state, error)
        assert _open_episodes(url) == 0
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


MALFORMED = [
    "Bearer sécret".encode(),  # non-ASCII
    b"Bearer \xff\xfe",
    b"Basic abc",
    b"Bearer",
    b"Bearer  " + TOKEN.encode(),  # the right token, malformed
]


def test_malformed_credentials_are_a_401(served):
    for credential in MALFORMED:
        answer = httpx.get(served + "/control/envs", headers={"Authorization": credential})
        assert answer.status_code == 401, (credential, answer.status_code)


def test_wildcard_bind_without_token_is_refused(bank_env):
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("ENVFORGE_TOKEN", None)
    for host in ("", "0.0.0.0", "::"):  # each binds every interface
        with pytest.raises(ValueError, match="bearer token"):
            build_app(Fleet([bank_env]), host=host)
        port = str(free_port())
        cli = [sys.executable, "-m", "envforge.cli", "serve", str(BANK_DIR), "--host", host, "--port", port]
        try:
            done = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"envforge serve --host {host!r} without a token started serving")
        assert done.returncode != 0 and "bearer token" in done.stdout + done.stderr
        assert "Traceback" not in done.stderr


def test_idle_socket_flood_leaves_healthz_answering_and_the_log_small(tmp_path):
    log = tmp_path / "serve.log"
    with serve_bank(log=log, nofile=256) as url:
        host, port = url.removeprefix("http://").split(":")
        idle = []
        try:
            for _ in range(400):  # more sockets than the server has file descriptors
                sock = socket.socket()
                sock.settimeout(2)
                try:
                    sock.connect((host, int(port)))
                except OSError:
                    sock.close()
                    continue
                idle.append(sock)
            time.sleep(2)
            answer = httpx.get(url + "/healthz", timeout=5)
            assert answer.status_code == 200
            time.sleep(2)
        finally:
            for sock in idle:
                sock.close()
        assert log.stat().st_size < 20_000, log.read_text()[-2000:]


def test_accept_failure_storm_logs_one_line(caplog):
    """What asyncio logs when accept() hits EMFILE: a traceback per failure, and one per retry."""
    import errno
    import logging

    from envforge.server import install_log_limiter

    limiter = install_log_limiter(interval=60)
    asyncio_log = logging.getLogger("asyncio")
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for _ in range(2000):
                failure = OSError(errno.EMFILE, "Too many open files")
                asyncio_log.error("socket.accept() out of system resource", exc_info=(OSError, failure, None))
                retry = ValueError("Invalid file descriptor: -1")
                asyncio_log.error(
                    "Exception in callback BaseSelectorEventLoop._start_serving(...)",
                    exc_info=(ValueError, retry, None),
                )
            asyncio_log.error("an unrelated error")
    finally:
        for name in ("asyncio", "uvicorn.error"):
            logging.getLogger(name).removeFilter(limiter)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "Too many open files" in lines[0] and lines[1] == "an unrelated error"
    assert caplog.records[0].exc_info is None


def _busy_sockets(url: str, count: int, kind: str) -> list[socket.socket]:
    """`count` connections from 127.0.0.1, each with a request in flight that never ends on its own:
    a body trickled in under the stall limit, or a legacy MCP session's SSE stream."""
    host, port = url.removeprefix("http://").split(":")
    session_ids = []
    if kind == "sse stream":
        init = MCP_INITIALIZE
        with httpx.Client(timeout=10) as http:
            for _ in range(count):
                answer = http.post(
                    url + "/envs/bank/mcp",
                    json=init,
                    headers={"Accept": "application/json, text/event-stream"},
                )
                session_ids.append(answer.headers.get("mcp-session-id", "none"))
    socks = []
    opened: list[bool] = []
    for i in range(count):
        sock = socket.create_connection((host, int(port)), timeout=2)
        socks.append(sock)
        if kind == "sse stream":
            sock.sendall(
                f"GET /envs/bank/mcp HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n"
                f"Mcp-Session-Id: {session_ids[i]}\r\nMcp-Protocol-Version: 2025-11-25\r\n\r\n".encode()
            )
            try:  # wait for the stream to open (its response starts and never completes)
                opened.append(sock.recv(64).startswith(b"HTTP/1.1 200"))
            except OSError:
                opened.append(False)  # dropped: this client holds all the connections it may
        else:
            sock.sendall(
                "POST /control/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Length: 1000000\r\n\r\n{{".encode()
            )
    if kind == "sse stream":
        assert sum(opened) >= 5, opened
    return socks


@pytest.mark.parametrize("kind", ["trickled body", "sse stream"])
def test_busy_connections_of_one_client_cannot_fill_the_connection_cap(tmp_path, kind):
    log = tmp_path / "serve.log"
    options = ("--max-connections", "20", "--body-timeout", "2", "--body-deadline", "4")
    with serve_bank(*options, log=log) as url:
        socks = _busy_sockets(url, 25, kind)
        try:
            started = time.monotonic()
            for _ in range(5):  # keep every trickling body alive, a byte a second
                other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=5)
                with other:
                    assert other.get(url + "/healthz").status_code == 200
                for sock in socks:
                    try:
                        sock.sendall(b" ")
                    except OSError:
                        pass
                time.sleep(1)
            if kind == "trickled body":  # the whole-body deadline cut off the ones that were served
                answers = []
                for sock in socks:
                    sock.settimeout(max(0.1, 8 - (time.monotonic() - started)))
                    try:
                        answers.append(sock.recv(64))
                    except OSError:
                        answers.append(b"")
                assert any(a.startswith(b"HTTP/1.1 408") for a in answers), answers
        finally:
            for sock in socks:
                sock.close()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def test_a_forwarded_for_header_does_not_make_a_new_client(tmp_path):
    """The attack on every per-client cap: one local process, one connection, a different
    X-Forwarded-For on each request (uvicorn's default trusts it from loopback). The client is
    the peer address however the header varies: the cap still answers 429."""
    log = tmp_path / "serve.log"
    with serve_bank("--max-episodes-per-client", "3", log=log, token=None) as url:
        codes = [
            httpx.post(
                url + "/control/episodes", json={"env": "bank"}, headers={"X-Forwarded-For": f"10.0.0.{i}"}
            ).status_code
            for i in range(6)
        ]
        assert codes == [201, 201, 201, 429, 429, 429], codes
        owners = {e["owner"] for e in httpx.get(url + "/control/episodes").json()["episodes"]}
        assert owners == {"addr:127.0.0.1"}, owners


def test_a_response_in_pieces_is_not_held_back_by_nagle(tmp_path):
    """`envforge serve` binds its own socket, whose accepted connections asyncio leaves with
    Nagle's algorithm on: a response written in pieces then waited for the client's delayed ACK,
    ~40 ms a call (22 calls a second on one episode, where a bare server did 800). Forty calls on
    one connection must take well under that."""
    with serve_bank(log=tmp_path / "serve.log", token=None) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            episode = client.post("/control/episodes", json={"env": "bank"}).json()["episode_id"]
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
            path = f"/envs/bank/episodes/{episode}/mcp"
            client.post(path, json=call, headers=headers)
            started = time.perf_counter()
            for _ in range(40):
                client.post(path, json=call, headers=headers)
            took = time.perf_counter() - started
    assert took < 0.8, f"40 calls took {took:.2f}s"
