"""Real servers for tests: the CLI in a subprocess, `envforge serve` on an ephemeral port, an ASGI app
in a thread, and the raw MCP request that opens a session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from support.paths import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_envforge(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m envforge.cli ARGS` in a fresh process, run from the repository, output as text."""
    return subprocess.run(
        [sys.executable, "-m", "envforge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or os.environ)},
    )


@contextmanager
def envforge_serve(env_dirs: list[str], *, timeout_s: float = 60, args: Sequence[str] = ()) -> Iterator[str]:
    """`envforge serve ENV_DIR... ARGS` as a real subprocess on an ephemeral port: yields its URL
    once `/healthz` answers, fails the test with the server's stderr if it exits first, kills it
    after."""
    import httpx

    port = free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "envforge.cli", "serve", *env_dirs, "--port", str(port), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                stderr = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"envforge serve {' '.join(env_dirs)} exited: {stderr}")
            assert time.monotonic() < deadline, f"envforge serve {' '.join(env_dirs)} did not come up"
            time.sleep(0.2)
        yield url
    finally:
        proc.kill()
        proc.wait(10)


class ServerThread:
    """uvicorn serving an ASGI app on 127.0.0.1 in its own thread and event loop."""

    def __init__(self, app: object) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("HTTP server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


MCP_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "f", "version": "1"},
    },
}
"""A legacy MCP `initialize` request, as raw JSON-RPC: it opens a session (tests that flood them)."""
