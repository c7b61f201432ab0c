"""A small posted state whose schema makes each row large: the built database is capped.

A confined env's posted state is built in a confined child (`server/sandbox/schema_host.py`), but what the
child built came back whole: a 4.6 KB state under a schema column `pad BLOB AS (zeroblob(1000000))
STORED` builds a 180 MB database, and the serving process read the child's whole answer, then
`json.loads` and `b64decode` copied it again: +459 MiB peak for one post (2.5-3.8x the database),
before the client's byte budget refused the episode. Now the database a posted state builds may be
at most `STATE_DATABASE_MAX_BYTES`, and no more than the client's remaining budget allows; the
child refuses past it without sending the database, and the serving process reads the child's
answer with the same cap, so the post is refused with a 400 naming the cap while the server's
memory stays within `RSS_GROWTH_BOUND_MIB`. A state under the cap still builds.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from envforge.server import Fleet, build_app, load_env

from support.confined import COUNT_NOTES_TOOLS, call_tool, make_confined_env
from support.probes import Health
from support.serving import ServerThread

ROWS = 180
PADDED = (
    "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL,"
    " pad BLOB AS (zeroblob(1000000)) STORED);\n"
)
BIG = {"env": "payloads", "state": {"notes": [{"id": i, "body": f"n{i}"} for i in range(1, ROWS + 1)]}}
"""~4.6 KB of JSON; 180 MB of database once each row's generated column is stored."""
SMALL = {"env": "payloads", "state": {"notes": [{"id": 1, "body": "a"}, {"id": 2, "body": "b"}]}}
RSS_GROWTH_BOUND_MIB = 64
"""What one refused post may add to the serving process at its peak (the database is 180 MB)."""


class PeakRss:
    """The highest resident size of this process (the server runs in it) while a block runs."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join(10)

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.start) / 2**20


@pytest.fixture
def padded_env(tmp_path: Path) -> Path:
    root = make_confined_env(tmp_path / "padded", COUNT_NOTES_TOOLS)
    (root / "schema.sql").write_text(PADDED)
    return root


def test_a_small_state_that_builds_a_huge_database_is_refused_at_the_cap(padded_env: Path) -> None:
    """Before: 201 after +459 MiB peak with no per-client budget, or the same peak then a refusal."""
    fleet = Fleet([load_env(padded_env)])
    with ServerThread(build_app(fleet)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        http.get("/healthz")  # the server's own start is not the attack's cost
        with Health(server.url) as health, PeakRss() as rss:
            answer = http.post("/control/episodes", json=BIG)
        assert answer.status_code == 400, answer.text[:300]
        assert "MiB" in answer.text and "at most" in answer.text, answer.text[:300]
        assert rss.growth_mib <= RSS_GROWTH_BOUND_MIB, f"the server grew {rss.growth_mib:.0f} MiB"
        assert not health.failures, health.failures
        # a state under the cap builds, in the same child, and serves
        answer = http.post("/control/episodes", json=SMALL)
        assert answer.status_code == 201, answer.text
        episode = answer.json()["episode_id"]
        assert call_tool(http, "payloads", episode, "count_notes", {}) == (None, "2")


def test_a_state_past_the_clients_remaining_budget_is_refused_before_it_is_sent(padded_env: Path) -> None:
    """The cap is the smaller of the fixed cap and what the client's budget still allows: with
    a 24 MiB budget per client, a 20-row state (20 MB of database, counted twice) is refused with
    the budget's own 429, and the database is never sent (before: sent, decoded, then refused)."""
    fleet = Fleet([load_env(padded_env)], max_episode_bytes_per_client=24 * 2**20)
    twenty = {"env": "payloads", "state": {"notes": [{"id": i, "body": "x"} for i in range(1, 21)]}}
    with ServerThread(build_app(fleet)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        with PeakRss() as rss:
            answer = http.post("/control/episodes", json=twenty)
        assert answer.status_code == 429, answer.text[:300]
        assert "per client" in answer.text and "MiB" in answer.text, answer.text[:300]
        assert rss.growth_mib <= RSS_GROWTH_BOUND_MIB / 2, f"the server grew {rss.growth_mib:.0f} MiB"
        answer = http.post("/control/episodes", json=SMALL)
        assert answer.status_code == 201, answer.text
