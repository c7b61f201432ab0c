"""An oversize request body sent with `Transfer-Encoding: chunked`, so no `Content-Length` warns the
server: it must count what it reads and answer 413 (or hang up) once the limit is passed, not read
(and hold) the whole stream first. Against the control plane and an MCP endpoint of a real
`envforge serve` on 127.0.0.1, with a 1 MiB body limit.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from support.bank_server import TOKEN, serve_bank

LIMIT = 1024 * 1024
STREAM = 64 * LIMIT  # what the attacker is ready to send: far more than the limit
CHUNK = 64 * 1024


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`envforge serve` with a 1 MiB body limit."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_bank("--max-body-bytes", str(LIMIT), log=log) as url:
        yield url


def _stream_chunked(url: str, path: str, content_type: str) -> tuple[int, bytes]:
    """POST an endless chunked body until the server answers or hangs up.

    Returns how many body bytes were sent before that, and what the server answered.
    """
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
        "Accept: application/json, text/event-stream\r\n"
        f"Authorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = f"{CHUNK:x}\r\n".encode() + b"[" * CHUNK + b"\r\n"
    sent = 0
    answer = b""
    deadline = time.monotonic() + 60
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        try:
            while sent < STREAM and time.monotonic() < deadline:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
                sock.sendall(chunk)
                sent += CHUNK
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server hung up mid-stream: also a refusal
        sock.settimeout(5)
        try:
            while part := sock.recv(65536):
                answer += part
                if b"\r\n\r\n" in answer:
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return sent, answer


@pytest.mark.parametrize(
    ("path", "content_type"),
    [("/control/episodes", "application/json"), ("/envs/bank/mcp", "application/json")],
    ids=["control plane", "mcp endpoint"],
)
def test_an_endless_chunked_body_is_cut_off_near_the_limit(strict: str, path: str, content_type: str) -> None:
    sent, answer = _stream_chunked(strict, path, content_type)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413"), answer[:300]
    # the server stopped reading soon after the limit (socket buffers hold a few MiB at most)
    assert sent < 16 * LIMIT, f"{sent} bytes were read before the server refused"


def test_the_server_still_serves_after_the_flood(strict: str) -> None:
    for path in ("/control/episodes", "/envs/bank/mcp"):
        _stream_chunked(strict, path, "application/json")
    assert httpx.get(strict + "/healthz", timeout=5).status_code == 200
