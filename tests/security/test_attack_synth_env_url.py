"""`envforge synth env URL` against a hostile MCP server: keep-alive bytes forever, an endless body.

The URL is anyone's server. One that answered `initialize` with an event stream and then sent a
keep-alive comment every half second held `synth env` for ever (no read ever timed out, since
bytes kept coming); one that streams an endless body would fill memory. Now the whole exchange is
capped in time (60 s) and bytes (16 MiB), each read in time (30 s), connecting in time (10 s),
and `synth env` ends with one error line and exit status 1.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.paths import REPO

DOCUMENT_TIMEOUT_S = 60  # the bound `synth env` states for a whole tool list


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


def keep_alive_forever(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n")
    while True:
        conn.sendall(b": keep-alive\n\n")
        time.sleep(0.5)


def endless_body(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
    line = b": " + b"x" * 65534 + b"\n"
    while True:
        conn.sendall(line)


@contextmanager
def hostile_server(behaviour: Callable[[socket.socket], None]) -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                _read_request(conn)
                behaviour(conn)
            except OSError:
                pass

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop.set()
        thread.join()
        listener.close()


def _synth_env(url: str, out: Path, limit: float) -> tuple[subprocess.CompletedProcess[str], float]:
    replay = out.parent / "responses.json"
    replay.write_text('{"responses": {}}')
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "synth", "env", url, "-o", str(out), "--replay", str(replay)],
        capture_output=True,
        text=True,
        timeout=limit,
        cwd=REPO,
    )
    return done, time.monotonic() - start


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    said = (done.stdout + done.stderr).strip()
    assert done.returncode != 0, said
    assert "Traceback" not in said, said[-2000:]
    lines = [line for line in said.splitlines() if line.strip()]
    assert len(lines) == 1, said[-2000:]
    return lines[0]


def test_keep_alive_bytes_forever_end_within_the_document_bound(tmp_path: Path) -> None:
    with hostile_server(keep_alive_forever) as url:
        try:
            done, took = _synth_env(url, tmp_path / "env", DOCUMENT_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"synth env was still waiting after {DOCUMENT_TIMEOUT_S + 30} s")
    line = _one_error_line(done)
    assert "cannot read docs" in line and url in line and f"at most {DOCUMENT_TIMEOUT_S} s" in line, line
    assert took <= DOCUMENT_TIMEOUT_S + 15, f"it took {took:.0f} s"


def test_an_endless_body_is_cut_at_the_byte_cap(tmp_path: Path) -> None:
    with hostile_server(endless_body) as url:
        try:
            done, took = _synth_env(url, tmp_path / "env", DOCUMENT_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"synth env was still reading after {DOCUMENT_TIMEOUT_S + 30} s")
    line = _one_error_line(done)
    assert "cannot read docs" in line and "more than 16,777,216 bytes" in line, line
    assert took <= DOCUMENT_TIMEOUT_S, f"it took {took:.0f} s"
