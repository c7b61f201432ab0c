"""Attacks by model-written SQL on the serving process's CPU and memory that outlive their call.

SQLite consults its progress handler only where a program jumps, so a straight run of
`json_extract` calls, each with 126 paths over a JSON array of 8M elements built in the statement
(`STEPS` of them, ~14 s here with no check between them), cannot be stopped by any deadline.
When a served episode's statements ran in the serving process, such a call was answered at its
limit but its thread went on burning a core for the rest of the run, and the episode was given
up. They now run in the env's sandboxed worker, which is killed at the call's limit: within 2 s
of the answer nothing burns CPU for the call, the worker is gone, `/healthz` and another env
answer throughout, and the episode goes on from its committed state. The same holds for memory:
a statement that asks for gigabytes meets the worker's limits, never the server's RSS.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from envforge.server import Environment, Fleet, build_app, load_env
from envforge.server.sandbox import confined_tools as confined_tools_module

from support.confined import MEMORY_TOOLS, call_tool, make_confined_env, open_episode
from support.paths import FIXTURES
from support.probes import Health, Probe, proc_mib, reset_proc_peak, server_pid
from support.serving import ServerThread, envforge_serve

CALL_LIMIT_S = 1.5
STEPS = 6
"""`json_extract` calls in one straight run: 14.1 s with no progress-handler call between them
(measured here on a plain connection with the server's SQL functions; one is 1.5-2.9 s)."""
PATHS = 126
ELEMENTS = 8_000_000
IDLE_CPU_S = 0.3
"""CPU the serving process may use in a 2-s window once the call was answered and 2 s passed,
beyond what it used in such a window before the attack (its idle work: the reaper, the HTTP
server's loop). A step still running uses up to a core: 0.96 CPU-s measured on 2 busy cores."""

LONG_STEP_TOOLS = textwrap.dedent(
    f'''
    """A write, then one statement whose single uninterruptible run lasts ~14 s."""

    from __future__ import annotations

    from envforge.server import Db, tool


    @tool(writes=["notes"])
    async def long_step(db: Db) -> int:
        """Write a note, then look far into a long array, many times over, in one run."""
        await db.execute("INSERT INTO notes (body) VALUES ('kept only if the call is')")
        paths = tuple("$[#-%d]" % (i + 1) for i in range({PATHS}))
        one = (
            "length(json_extract('[' || replace(hex(zeroblob({ELEMENTS})), '00', '0,') || '0]', "
            + ", ".join("?" for _ in paths)
            + "))"
        )
        return await db.fetch_value("SELECT " + " + ".join([one] * {STEPS}), paths * {STEPS})


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid`, all its threads (`/proc/PID/stat`)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _sqlite_threads_cpu_seconds() -> float:
    """CPU time of this process's SQLite threads (`envforge-sqlite*`), where a served episode's
    statements ran before they moved into the worker."""
    total = 0.0
    for thread in threading.enumerate():
        if not thread.name.startswith("envforge-sqlite") or thread.native_id is None:
            continue
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:  # the thread ended
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _workers_of(env: Environment) -> list[Any]:
    """`env`'s confined workers (by its tools file: other tests' envs share its name)."""
    tools = str(env.root / "tools.py")
    return [w for w in list(confined_tools_module._WORKERS) if w.init.filename == tools]


def _worker_tree(env: Environment) -> list[int]:
    """The pids of `env`'s confined worker: bubblewrap and everything under it."""
    for worker in _workers_of(env):
        if worker.pid is not None and worker.alive():
            root = psutil.Process(worker.pid)
            return [worker.pid, *(p.pid for p in root.children(recursive=True))]
    raise AssertionError(f"no live worker for {env}")


@pytest.fixture
def long_step_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Environment:
    limits = dataclasses.replace(confined_tools_module.DEFAULT_LIMITS, call_timeout_s=CALL_LIMIT_S)
    monkeypatch.setattr(confined_tools_module, "DEFAULT_LIMITS", limits)
    return load_env(make_confined_env(tmp_path / "long", LONG_STEP_TOOLS), static_gate=False)


def test_a_step_past_the_call_limit_burns_no_cpu_after_the_answer(
    long_step_env: Environment, bank_env: Environment
) -> None:
    """Before, the call was answered at its limit + 0.5 s, and the serving process's SQLite thread
    then ran the rest of the ~14 s step (a core's worth of CPU in every window after the answer);
    the episode was given up."""
    fleet = Fleet([long_step_env, bank_env])
    with ServerThread(build_app(fleet)) as server, httpx.Client(base_url=server.url, timeout=120) as http:
        attacker = open_episode(http, "payloads")
        assert call_tool(http, "payloads", attacker, "count_notes", {}) == (None, "1")  # the worker is up
        worker = _worker_tree(long_step_env)
        idle = _cpu_seconds(os.getpid())
        time.sleep(2.0)
        idle = _cpu_seconds(os.getpid()) - idle  # the same 2-s window with nothing running
        probe = Probe(server.url, open_episode(http, "bank"))
        prober = threading.Thread(target=probe.run, daemon=True)
        prober.start()
        try:
            time.sleep(0.3)
            start = time.monotonic()
            kind, text = call_tool(http, "payloads", attacker, "long_step", {})
            answered = time.monotonic()
            time.sleep(0.5)
        finally:
            probe.stop.set()
            prober.join(30)
        took = answered - start
        assert kind == "env_error" and f"time limit of {CALL_LIMIT_S:g}s" in text, text
        assert took <= CALL_LIMIT_S + 1.0, f"the call took {took:.2f}s against a {CALL_LIMIT_S:g}s limit"
        health = sorted(probe.health)
        assert len(health) >= 5, health
        assert health[len(health) // 2] <= 0.1, f"/healthz took a median {health[len(health) // 2]:.2f}s"
        assert health[-1] <= 0.3, f"/healthz took up to {health[-1]:.2f}s during the attack"
        assert max(probe.reads) <= 0.5, f"another env's read took up to {max(probe.reads):.2f}s"
        # 2 s after the answer, nothing runs for the call: not the worker, not a thread here
        time.sleep(max(0.0, answered + 2.0 - time.monotonic()))
        alive = [pid for pid in worker if _running(pid)]
        assert not alive, f"the worker's processes {alive} still run after the answer"
        before, threads = _cpu_seconds(os.getpid()), _sqlite_threads_cpu_seconds()
        time.sleep(2.0)
        used = _cpu_seconds(os.getpid()) - before
        threads = _sqlite_threads_cpu_seconds() - threads
        assert threads <= 0.1, f"the SQLite threads used {threads:.2f} CPU-s in 2 s after the call"
        assert used <= idle + IDLE_CPU_S, (
            f"the serving process used {used:.2f} CPU-s in 2 s after the call ({idle:.2f} idle)"
        )
        # nothing of the call was kept, and the episode goes on at once (a fresh worker)
        start = time.monotonic()
        assert call_tool(http, "payloads", attacker, "count_notes", {}) == (None, "1")
        assert time.monotonic() - start < 5.0


SERVER_SLACK_MIB = 32
"""What `envforge serve`'s RSS may grow by while a statement of a served episode asks SQLite for
gigabytes: nothing of the statement runs in it (1-3 MiB measured: the call's own messages)."""


def test_a_statement_that_asks_for_gigabytes_does_not_grow_the_server(tmp_path: Path) -> None:
    """Before, the server's own SQLite heap took the statement's working memory (256 MiB by
    default, the bound `--sqlite-work-mib` sets): its RSS grew by up to that much."""
    root = make_confined_env(tmp_path / "memory", MEMORY_TOOLS)
    with (
        envforge_serve([str(root), str(FIXTURES / "bank")]) as url,
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
                kind, text = call_tool(http, "payloads", attacker, attack, {})
                time.sleep(0.3)
            growth = proc_mib(server, "VmHWM") - before
            assert kind == "refused" and "more memory than the server lets SQL use" in text, (attack, text)
            assert growth <= SERVER_SLACK_MIB, f"{attack}: the server's RSS grew by {growth:.0f} MiB"
            assert not health.failures and len(health.times) >= 3, (attack, health.failures)
            assert max(health.times) <= 0.3, f"{attack}: /healthz took up to {max(health.times):.2f}s"
            assert call_tool(http, "payloads", attacker, "count_notes", {}) == (None, "1"), attack
            kind, text = call_tool(http, "bank", bank, "get_account", {"account_id": "A-1"})
            assert kind is None and "A-1" in text, text
        assert psutil.Process(server).is_running()


TAMPERING_TOOLS = textwrap.dedent(
    '''
    """Tools that reach past their handle to the worker's copy of the episode."""

    from __future__ import annotations

    from envforge.server import Db, tool


    def raw(db: Db):
        conn = db._conn  # the worker's own sqlite3 connection, in its sandbox
        conn.set_authorizer(None)
        return conn


    @tool(writes=["notes"])
    async def plant_view(db: Db) -> str:
        """Write a note, and plant a view the serving process would run."""
        conn = raw(db)
        conn.execute("INSERT INTO notes (body) VALUES ('planted')")
        conn.execute(
            "CREATE VIEW spin AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
            "SELECT max(x) FROM c"
        )
        return "planted"


    @tool(writes=["notes"])
    async def outgrow(db: Db) -> str:
        """Lift the episode's page cap, then write far past it."""
        conn = raw(db)
        conn.execute("PRAGMA max_page_count = 1000000")
        conn.execute("INSERT INTO notes (body) VALUES (hex(zeroblob(4000000)))")
        return "grown"


    @tool(writes=["notes"])
    async def add_note(db: Db, body: str) -> str:
        """Add a note."""
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        return "added"


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)


@pytest.mark.parametrize("attack", ["plant_view", "outgrow"])
async def test_a_worker_that_tampers_with_its_copy_changes_nothing_here(tmp_path: Path, attack: str) -> None:
    """The worker runs model-written code beside its copy of the episode, so the state it sends
    back is checked like any untrusted input: a schema change (a view or trigger would run in the
    serving process) or a database past the episode's page cap is refused, nothing of the call is
    kept, and the episode goes on."""
    env = load_env(make_confined_env(tmp_path / "tamper", TAMPERING_TOOLS), static_gate=False)
    fleet = Fleet([env])
    try:
        episode = await fleet.create_episode(env.name)
        assert (await fleet.call(episode.id, "count_notes", {})).text == "1"
        result = await fleet.call(episode.id, attack, {})
        assert result.kind == "env_error", result.text
        state, _ = await fleet.export(episode.id)
        assert [r["body"] for r in state["notes"]] == ["seed"]
        assert (await fleet.call(episode.id, "add_note", {"body": "after"})).text == "added"
        assert (await fleet.call(episode.id, "count_notes", {})).text == "2"
    finally:
        await fleet.aclose()


SHARED_LIMIT_S = 6.0

SHARING_TOOLS = LONG_STEP_TOOLS + textwrap.dedent(
    '''

    import asyncio


    @tool
    async def spin(db: Db) -> int:
        """Count for ever."""
        return await db.fetch_value(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
        )


    @tool(writes=["notes"])
    async def slow_add(db: Db, body: str) -> str:
        """Add a note, then take a while to answer."""
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        await asyncio.sleep(1.5)
        return "added"
    '''
)


async def test_a_call_whose_worker_is_killed_for_another_runs_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Episodes of one env share its worker, so killing it for one call's time limit ends the
    others it is running. Nothing of those was kept (their state is the serving process's), so
    each is sent again, once, to the new worker: it succeeds, and its write is kept exactly once.
    Before, it failed with the worker's death."""
    limits = dataclasses.replace(confined_tools_module.DEFAULT_LIMITS, call_timeout_s=SHARED_LIMIT_S)
    monkeypatch.setattr(confined_tools_module, "DEFAULT_LIMITS", limits)
    env = load_env(make_confined_env(tmp_path / "shared", SHARING_TOOLS), static_gate=False)
    fleet = Fleet([env])
    try:
        attacker = await fleet.create_episode(env.name)
        bystander = await fleet.create_episode(env.name)
        assert (await fleet.call(attacker.id, "count_notes", {})).text == "1"
        assert (await fleet.call(bystander.id, "count_notes", {})).text == "1"

        async def late_add() -> Any:
            await asyncio.sleep(SHARED_LIMIT_S - 1.0)  # in flight when the attacker's limit comes
            return await fleet.call(bystander.id, "slow_add", {"body": "once"})

        attack, added = await asyncio.gather(fleet.call(attacker.id, "spin", {}), late_add())
        assert attack.kind == "env_error" and "time limit" in attack.text, attack.text
        assert added.kind == "ok" and added.text == "added", added.text
        state, _ = await fleet.export(bystander.id)
        assert [r["body"] for r in state["notes"]] == ["seed", "once"]
        assert (await fleet.call(attacker.id, "count_notes", {})).text == "1"
    finally:
        await fleet.aclose()


HOSTING_TOOLS = textwrap.dedent(
    '''
    """Tools that close their episode's call mid-way, or make the worker let other copies go."""

    from __future__ import annotations

    import asyncio
    import gc

    from envforge.server import Db, tool


    @tool(writes=["notes"])
    async def add_slowly(db: Db, body: str, seconds: float) -> str:
        """Add a note, then take a while to answer."""
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        await asyncio.sleep(seconds)
        return "added"


    @tool
    async def let_go_of_others(db: Db) -> int:
        """Make the worker let go of every idle episode it holds (as it does when it holds too many)."""
        dropped = 0
        for host in [o for o in gc.get_objects() if type(o).__name__ == "Host"]:
            for key in [k for k, copy in host.episodes.items() if not copy.busy]:
                host.forget(key)
                dropped += 1
        return dropped


    @tool(writes=["notes"])
    async def add_note(db: Db, body: str) -> str:
        """Add a note."""
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        return "added"


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")
    '''
)


@pytest.fixture
def hosting_env(tmp_path: Path) -> Environment:
    return load_env(make_confined_env(tmp_path / "hosting", HOSTING_TOOLS), static_gate=False)


async def test_an_episode_closed_mid_call_keeps_nothing_and_the_worker_serves_on(
    hosting_env: Environment,
) -> None:
    """The call's write was committed in the worker's copy; the episode closed before the call
    ended, so the serving process keeps nothing of it, and the worker is not stopped for it."""
    fleet = Fleet([hosting_env])
    try:
        episode = await fleet.create_episode(hosting_env.name)
        assert (await fleet.call(episode.id, "count_notes", {})).text == "1"
        starts = _worker_starts(hosting_env)

        async def close_soon() -> None:
            await asyncio.sleep(0.5)
            await fleet.close_episode(episode.id)

        result, _ = await asyncio.gather(
            fleet.call(episode.id, "add_slowly", {"body": "late", "seconds": 1.5}), close_soon()
        )
        assert result.is_error and "closed during the call; nothing was kept" in result.text, result.text
        other = await fleet.create_episode(hosting_env.name)
        assert (await fleet.call(other.id, "count_notes", {})).text == "1"
        assert _worker_starts(hosting_env) == starts
    finally:
        await fleet.aclose()


async def test_a_worker_that_let_an_episode_go_gets_its_state_again(hosting_env: Environment) -> None:
    """A worker holds a bounded number of episodes; one it let go answers `stale`, and the call is
    sent again with the episode's committed state: the caller sees nothing of it."""
    fleet = Fleet([hosting_env])
    try:
        first = await fleet.create_episode(hosting_env.name)
        second = await fleet.create_episode(hosting_env.name)
        assert (await fleet.call(first.id, "add_note", {"body": "kept"})).text == "added"
        assert (await fleet.call(second.id, "let_go_of_others", {})).text == "1"
        assert (await fleet.call(first.id, "count_notes", {})).text == "2"
        assert (await fleet.call(first.id, "add_note", {"body": "again"})).text == "added"
        state, _ = await fleet.export(first.id)
        assert [r["body"] for r in state["notes"]] == ["seed", "kept", "again"]
    finally:
        await fleet.aclose()


def _worker_starts(env: Environment) -> int:
    return sum(w.starts for w in _workers_of(env))
