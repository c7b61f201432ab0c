"""States posted on the control plane for a confined env whose schema makes building them endless.

A confined env's model-written `schema.sql` may hold a trigger that fires only on a value its seed
lacks, so it passes the seed's load; a client posting a state with that value
(`POST /control/episodes`) made the server build it in-process with no deadline: two threads spun
on after the clients left, and the server once ignored SIGTERM for ten minutes. The same holds for
any per-row work of the schema that a client's values make long (a CHECK of 1,008 JSON paths:
~24 s for one 8 MB value). Now the schema policy refuses triggers at load, and a confined env's
posted state is built in a confined child under the schema deadline (`ENVFORGE_SCHEMA_TIMEOUT_S`,
here 4 s): the post is refused within it, `/healthz` keeps answering, a clean state still builds,
and SIGTERM mid-build ends the server and its child within 5 s.
"""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from envforge.server import EnvLoadError, Fleet, build_app, load_env

from support.confined import COUNT_NOTES_TOOLS, call_tool, make_confined_env
from support.probes import Health, pid_alive, server_pid
from support.serving import ServerThread, envforge_serve

SCHEMA_TIMEOUT_S = 4.0

PLANTED = textwrap.dedent(
    """
    CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
    CREATE VIEW forever AS
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c;
    CREATE TRIGGER planted AFTER INSERT ON notes WHEN NEW.body = 'boom' BEGIN
        INSERT INTO notes (body) SELECT max(x) FROM forever;
    END;
    """
)
BOOM = {"env": "payloads", "state": {"notes": [{"id": 1, "body": "boom"}]}}
FINE = {"env": "payloads", "state": {"notes": [{"id": 1, "body": "fine"}, {"id": 2, "body": "too"}]}}
ELEMENTS = 4_000_000
"""Elements of the JSON array a client posts as one note's body (8 MB)."""
GROUPS, PATHS = 8, 126
"""json_extract calls of the schema's CHECK, and paths of each: each path walks the array afresh
(~3 s a call here), all inside the one step that checks the row."""
LONG_CHECK = (
    "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL CHECK (body NOT LIKE '[%' OR ("
    + " AND ".join(
        "json_extract(body, "
        + ", ".join(f"'$[#-{g * PATHS + i + 1}]'" for i in range(PATHS))
        + ") IS NOT NULL"
        for g in range(GROUPS)
    )
    + ")));\n"
)
LONG = {"env": "payloads", "state": {"notes": [{"id": 1, "body": "[" + "0," * ELEMENTS + "0]"}]}}


@pytest.fixture
def planted_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ENVFORGE_SCHEMA_TIMEOUT_S", str(SCHEMA_TIMEOUT_S))  # the server inherits it
    root = make_confined_env(tmp_path / "planted", COUNT_NOTES_TOOLS)
    (root / "schema.sql").write_text(PLANTED)
    return root


def test_a_planted_trigger_is_refused_at_load(planted_env: Path) -> None:
    """The schema policy's half: before, the schema loaded and the trigger waited. (Its view of a
    recursive query is refused too; here the trigger alone.)"""
    (planted_env / "schema.sql").write_text(
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n"
        "CREATE TRIGGER planted AFTER INSERT ON notes WHEN NEW.body = 'boom' BEGIN\n"
        "    UPDATE notes SET body = 'planted';\n"
        "END;\n"
    )
    with pytest.raises(EnvLoadError) as refused:
        load_env(planted_env)
    assert "schema.sql" in str(refused.value) and "TRIGGER" in str(refused.value), refused.value


def test_a_planted_trigger_set_off_by_a_posted_state_is_stopped_at_the_build_deadline(
    planted_env: Path,
) -> None:
    """The env loaded past the schema policy (`static_gate=False`, as the sandbox's own tests do):
    the state's build still stops at its deadline. Before, the post never came back."""
    fleet = Fleet([load_env(planted_env, static_gate=False)])
    with ServerThread(build_app(fleet)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        with Health(server.url) as health:
            start = time.monotonic()
            answer = http.post("/control/episodes", json=BOOM)
            took = time.monotonic() - start
        assert answer.status_code == 400 and "took longer than" in answer.text, answer.text
        assert took <= SCHEMA_TIMEOUT_S + 3, f"the post took {took:.1f}s"
        assert not health.failures and len(health.times) >= 5, (health.failures, health.times)
        health_times = sorted(health.times)
        assert health_times[len(health_times) // 2] <= 0.1, health_times
        assert health_times[-1] <= 0.3, health_times
        # a clean state still builds, in the same bounded child, and serves
        answer = http.post("/control/episodes", json=FINE)
        assert answer.status_code == 201, answer.text
        episode = answer.json()["episode_id"]
        assert call_tool(http, "payloads", episode, "count_notes", {}) == (None, "2")


@pytest.fixture
def long_check_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ENVFORGE_SCHEMA_TIMEOUT_S", str(SCHEMA_TIMEOUT_S))
    root = make_confined_env(tmp_path / "long_check", COUNT_NOTES_TOOLS)
    (root / "schema.sql").write_text(LONG_CHECK)
    return root


def test_a_posted_state_the_schema_takes_long_to_check_is_stopped_and_sigterm_ends_it(
    long_check_env: Path,
) -> None:
    """A schema the policy allows (a CHECK, no trigger), served by `envforge serve`: before, the
    post held a thread of the server for ~24 s, and SIGTERM mid-build waited for it."""
    with envforge_serve([str(long_check_env)]) as url, httpx.Client(base_url=url, timeout=60) as http:
        start = time.monotonic()
        answer = http.post("/control/episodes", json=LONG)
        took = time.monotonic() - start
        assert answer.status_code == 400 and "took longer than" in answer.text, answer.text[:300]
        assert took <= SCHEMA_TIMEOUT_S + 3, f"the post took {took:.1f}s"
        server = server_pid(url)

        def post() -> None:
            try:
                httpx.post(url + "/control/episodes", json=LONG, timeout=60)
            except httpx.HTTPError:
                pass  # the server went away mid-build, as it should

        threading.Thread(target=post, daemon=True).start()
        time.sleep(2.0)  # the child is building
        builders = [p for p in psutil.Process(server).children(recursive=True) if p.is_running()]
        assert builders, "no child was building the state"
        start = time.monotonic()
        os.kill(server, signal.SIGTERM)
        while pid_alive(server) and time.monotonic() - start < 20:
            time.sleep(0.05)
        took = time.monotonic() - start
        assert took <= 5.0, f"the server was still running {took:.1f}s after SIGTERM"
        alive = psutil.wait_procs(builders, timeout=5)[1]
        assert not alive, f"the state's builder outlived the server: {alive}"
