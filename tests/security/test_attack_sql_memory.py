"""Attacks by model-written SQL on the serving process's memory, inside one SQLite step.

SQLite's deadline (the progress handler) stops a statement between program steps only, and one
step can ask for gigabytes: eight distinct 16 MB JSON documents parsed in one statement took
`envforge serve` from 80 to 1,458 MiB; a `GROUP BY` over 1,000 values of 4 MB took it to 3.9 GB.
SQLite's hard heap limit (`server/core/sqlheap.py`) refuses the allocation while it happens: the
server's RSS grows by at most its statements' working memory (`--sqlite-work-mib`, here 128 MiB)
plus the interpreter's own slack, the call is refused with nothing of it kept, and the server,
the episode and another env keep answering. Run against a real `envforge serve`.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import httpx
import psutil

from support.confined import call_tool, make_confined_env, open_episode
from support.paths import FIXTURES
from support.probes import Health, server_pid
from support.serving import envforge_serve

WORK_MIB = 128
"""The statements' working memory the server is started with (`--sqlite-work-mib`)."""
SLACK_MIB = 64
"""RSS the server may grow by besides it: the interpreter's and the allocator's own (the
attack's rows, answers and log lines): 1-7 MiB measured."""

MEMORY_TOOLS = textwrap.dedent(
    '''
    """Statements that ask SQLite for gigabytes inside one step, bound to short SQL."""

    from __future__ import annotations

    from envforge.server import Db, tool

    # a distinct 16 MB JSON array of 8M elements (its last element differs), parsed whole
    DOCUMENT = "json_extract('[' || replace(hex(zeroblob(8000000)), '00', '0,') || '%d]', '$[0]')"


    @tool(writes=["notes"])
    async def eight_documents(db: Db) -> int:
        """Write a note, then parse eight distinct 16 MB JSON documents in one statement."""
        await db.execute("INSERT INTO notes (body) VALUES ('kept only if the call is')")
        columns = ", ".join(DOCUMENT % i for i in range(8))
        row = await db.fetch_one("SELECT " + columns)
        return len(row)


    @tool(writes=["notes"])
    async def group_huge_values(db: Db) -> int:
        """Write a note, then group 1,000 distinct values of 4 MB each."""
        await db.execute("INSERT INTO notes (body) VALUES ('kept only if the call is')")
        return await db.fetch_value(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000) "
            "SELECT count(*) FROM (SELECT zeroblob(4000000) || x AS b FROM c GROUP BY b)"
        )


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)


def _mib(pid: int, field: str) -> float:
    """A `/proc/PID/status` figure (`VmRSS`, `VmHWM`: the peak since the last reset), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def _reset_peak(pid: int) -> None:
    """Make `VmHWM` start again from the current RSS (`clear_refs` 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")


def test_one_statement_cannot_take_the_server_past_its_sqlite_heap_limit(tmp_path: Path) -> None:
    """Before, the eight documents took the server from 80 to 1,458 MiB and the call answered with
    all eight parsed; the GROUP BY peaked at 3.9 GB (its sort spilling to temporary files first)."""
    root = make_confined_env(tmp_path / "memory", MEMORY_TOOLS)
    serving = [str(root), str(FIXTURES / "bank")]
    with (
        envforge_serve(serving, args=["--sqlite-work-mib", str(WORK_MIB)]) as url,
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        server = server_pid(url)
        attacker = open_episode(http, "payloads")
        bank = open_episode(http, "bank")
        assert call_tool(http, "payloads", attacker, "count_notes", {}) == (None, "1")  # the worker is up
        for attack in ("eight_documents", "group_huge_values"):
            before = _mib(server, "VmRSS")
            _reset_peak(server)
            with Health(url) as health:
                start = time.monotonic()
                kind, text = call_tool(http, "payloads", attacker, attack, {})
                took = time.monotonic() - start
                time.sleep(0.3)
            growth = _mib(server, "VmHWM") - before
            assert kind == "refused" and "more memory than the server lets SQL use" in text, (
                attack,
                kind,
                text,
            )
            assert growth <= WORK_MIB + SLACK_MIB, (
                f"{attack}: the server's RSS grew by {growth:.0f} MiB (bound {WORK_MIB} + {SLACK_MIB} MiB)"
            )
            assert took <= 30, f"{attack}: the call took {took:.1f}s"
            assert not health.failures and len(health.times) >= 3, (attack, health.failures, health.times)
            # nothing of the call was kept, and the episode and another env still serve
            assert call_tool(http, "payloads", attacker, "count_notes", {}) == (None, "1"), attack
            kind, text = call_tool(http, "bank", bank, "get_account", {"account_id": "A-1"})
            assert kind is None and "A-1" in text, text
        assert psutil.Process(server).is_running()
