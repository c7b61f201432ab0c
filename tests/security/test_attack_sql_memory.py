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

import time
from pathlib import Path

import httpx
import psutil

from support.confined import MEMORY_TOOLS, call_tool, make_confined_env, open_episode
from support.paths import FIXTURES
from support.probes import Health, proc_mib, reset_proc_peak, server_pid
from support.serving import envforge_serve

WORK_MIB = 128
"""The statements' working memory the server is started with (`--sqlite-work-mib`)."""
SLACK_MIB = 64
"""RSS the server may grow by besides it: the interpreter's and the allocator's own (the
attack's rows, answers and log lines): 1-7 MiB measured."""


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
            before = proc_mib(server, "VmRSS")
            reset_proc_peak(server)
            with Health(url) as health:
                start = time.monotonic()
                kind, text = call_tool(http, "payloads", attacker, attack, {})
                took = time.monotonic() - start
                time.sleep(0.3)
            growth = proc_mib(server, "VmHWM") - before
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
