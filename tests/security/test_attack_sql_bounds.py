"""Attacks by model-written SQL that one SQLite step makes long, served over real HTTP.

SQLite checks a statement's deadline (the progress handler) only between program steps, and one
step can do seconds of work: `json_extract` with 126 paths over a JSON array of 8M elements is a
single step of ~1.4 s here (~2.5 s on a busier day), and two of them side by side in one SELECT
run with no check between them (~2.8 s): longer than the call limit + `STUCK_GRACE_S`, so the
test always sees a step outlast its call. Such a statement must never run on the event loop's
thread (`/healthz` answers within 100 ms while it runs), never keep another env's call waiting,
and never hold its own call past the call's time limit + 1 s (the call is answered and nothing of
it is kept; the step ran in the env's sandboxed worker, which was killed with it, so the episode
goes on from its committed state).
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from envforge.server import Environment, Fleet, build_app, load_env
from envforge.server.sandbox import confined_tools as confined_tools_module

from support.confined import call_tool, make_confined_env, open_episode
from support.probes import Probe, pid_alive, server_pid
from support.serving import ServerThread

CALL_LIMIT_S = 1.5
"""The call time limit in these tests (30 s when serving)."""
STATELESS = "2026-07-28"
PATHS = 126
"""Paths of one `json_extract` (it takes at most 127 arguments): each walks the array afresh
inside one VM step."""
ELEMENTS = 8_000_000
"""Elements of the JSON array (16 MB of text: under the 16 MiB value limit)."""

JSON_TOOLS = textwrap.dedent(
    f'''
    """A read whose one step is long, bound to short SQL by its parameters."""

    from __future__ import annotations

    from envforge.server import Db, tool


    @tool
    async def deep_paths(db: Db, times: int) -> int:
        """Look far into a long array, several times.

        Args:
            times: How many statements.
        """
        paths = tuple("$[#-%d]" % (i + 1) for i in range({PATHS}))
        one = (
            "length(json_extract('[' || replace(hex(zeroblob({ELEMENTS})), '00', '0,') || '0]', "
            + ", ".join("?" for _ in paths)
            + "))"
        )
        sql = "SELECT " + one + " + " + one
        total = 0
        for _ in range(times):
            total += await db.fetch_value(sql, paths + paths)
        return total


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)


@pytest.fixture
def json_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Environment:
    limits = dataclasses.replace(confined_tools_module.DEFAULT_LIMITS, call_timeout_s=CALL_LIMIT_S)
    monkeypatch.setattr(confined_tools_module, "DEFAULT_LIMITS", limits)
    return load_env(make_confined_env(tmp_path / "json", JSON_TOOLS), static_gate=False)


def test_one_long_sqlite_step_holds_neither_the_server_nor_another_env_nor_its_call(
    json_env: Environment, bank_env: Environment
) -> None:
    """Three statements of ~2.8 s each in one call: before, the first ran on the event loop's
    thread (`/healthz` and the bank read stalled for the whole step) and the call was answered only
    when its step ended, past its limit."""
    fleet = Fleet([json_env, bank_env])
    with ServerThread(build_app(fleet)) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        attacker = open_episode(http, "payloads")
        assert call_tool(http, "payloads", attacker, "count_notes", {}) == (None, "1")  # the worker is up
        probe = Probe(server.url, open_episode(http, "bank"))
        prober = threading.Thread(target=probe.run, daemon=True)
        prober.start()
        try:
            time.sleep(0.3)
            start = time.monotonic()
            kind, text = call_tool(http, "payloads", attacker, "deep_paths", {"times": 3})
            took = time.monotonic() - start
            time.sleep(0.5)  # the probe keeps going while the abandoned step may still run
        finally:
            probe.stop.set()
            prober.join(30)
        assert kind == "env_error" and f"time limit of {CALL_LIMIT_S:g}s" in text, text
        assert took <= CALL_LIMIT_S + 1.0, f"the call took {took:.2f}s against a {CALL_LIMIT_S:g}s limit"
        assert len(probe.health) >= 5, probe.health
        health = sorted(probe.health)
        # the figure is 100 ms; on two cores shared with other jobs one answer may wait for a core
        assert health[len(health) // 2] <= 0.1, f"/healthz took a median {health[len(health) // 2]:.2f}s"
        assert health[-1] <= 0.3, f"/healthz took up to {health[-1]:.2f}s during the attack"
        assert max(probe.reads) <= 0.5, f"another env's read took up to {max(probe.reads):.2f}s"
        # the step ran in the env's worker, which was killed: the episode (its committed copy is
        # the server's) serves at once, unchanged, as does a new one
        start = time.monotonic()
        assert call_tool(http, "payloads", attacker, "count_notes", {}) == (None, "1")
        assert time.monotonic() - start < 5.0  # a fresh worker starts for it
        fresh = open_episode(http, "payloads")
        start = time.monotonic()
        assert call_tool(http, "payloads", fresh, "count_notes", {}) == (None, "1")
        assert time.monotonic() - start < 1.0


POISONED_SCHEMAS = {
    "endless": (
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n"
        "CREATE TABLE spin AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT max(x) AS x FROM c;\n"
    ),
    "memory": (
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n"
        "CREATE TABLE fill AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT x, randomblob(1000000) AS pad FROM c ORDER BY pad;\n"
    ),
}
SCHEMA_TIMEOUT_S = 6.0


@pytest.fixture
def short_schema_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVFORGE_SCHEMA_TIMEOUT_S", str(SCHEMA_TIMEOUT_S))


@pytest.mark.parametrize("kind", sorted(POISONED_SCHEMAS))
def test_a_poisoned_schema_is_stopped_within_the_load_deadline(
    kind: str, tmp_path: Path, short_schema_deadline: None
) -> None:
    """Before, `load_env` (and so `inspect`, `serve` and `synth env`'s load gate) never returned,
    and the memory variant held 1.38 GB after 15 s."""
    root = make_confined_env(tmp_path / kind, JSON_TOOLS)
    (root / "schema.sql").write_text(POISONED_SCHEMAS[kind])
    holder: dict[str, BaseException | None] = {}

    def load() -> None:
        try:
            load_env(root, static_gate=False)
            holder["error"] = None
        except BaseException as exc:
            holder["error"] = exc

    start = time.monotonic()
    loader = threading.Thread(target=load, daemon=True)  # an unbounded load must fail, not hang
    loader.start()
    loader.join(SCHEMA_TIMEOUT_S + 10)
    took = time.monotonic() - start
    assert not loader.is_alive(), f"the load was still running after {took:.0f}s"
    error = holder["error"]
    assert error is not None and "schema.sql" in str(error), error
    assert took <= SCHEMA_TIMEOUT_S + 3, f"the load took {took:.1f}s"


def test_sigterm_stops_the_server_within_5s_mid_attack(tmp_path: Path) -> None:
    """`envforge serve` with a call whose statements hold its SQLite thread (30 s call limit):
    before, the graceful shutdown waited for that call, and SIGTERM was honoured only once it ended."""
    import signal

    from support.serving import envforge_serve

    root = make_confined_env(tmp_path / "json", JSON_TOOLS)
    with envforge_serve([str(root)]) as url, httpx.Client(base_url=url, timeout=120) as http:
        episode = open_episode(http, "payloads")
        assert call_tool(http, "payloads", episode, "count_notes", {}) == (None, "1")
        attack = threading.Thread(
            target=lambda: _call_quietly(url, episode),
            daemon=True,
        )
        attack.start()
        time.sleep(1.5)  # the call is in its statements
        server = server_pid(url)
        start = time.monotonic()
        os.kill(server, signal.SIGTERM)
        while pid_alive(server) and time.monotonic() - start < 20:
            time.sleep(0.05)
        took = time.monotonic() - start
    assert took <= 5.0, f"the server was still running {took:.1f}s after SIGTERM"


def _call_quietly(url: str, episode: str) -> None:
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            call_tool(http, "payloads", episode, "deep_paths", {"times": 40})
    except (httpx.HTTPError, AssertionError):
        pass  # the server went away mid-call, as it should
