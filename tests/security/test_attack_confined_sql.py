"""Attacks by a confined tool's SQL on the process that runs it.

A confined tool's statements run in the serving (or synthesizing) process, on the episode's
connection: the worker's own limits (its kill, its CPU and memory bounds) do not reach them. Each
test loads a confined env straight through `load_env` (the static gate skipped) and calls it
through a real fleet, a real worker under bubblewrap and real SQLite. A statement that never ends
must be stopped at the call's time limit, its episode rolled back, and no other episode (of any
env: they share the SQLite thread) kept waiting past that limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from envforge.server import Environment, Fleet, ScratchPool, execute, load_env, run_inline
from envforge.server.core.dbthreads import WorkerPool
from envforge.server.sandbox import confined_tools as confined_tools_module

from support.confined import make_confined_env
from support.probes import peak_growth_mb_since_reset, reset_peak

CALL_LIMIT_S = 1.5
"""The call time limit in these tests (30 s when serving)."""
WATCHDOG_S = 10.0
"""When a test interrupts the attack itself: code without a bound fails the test instead of hanging."""
ENDLESS = 10**15
"""Rows of a recursive count that SQLite needs days for."""

SQL_TOOLS = textwrap.dedent(
    '''
    """Tools whose SQL is the attack."""

    from __future__ import annotations

    from envforge.server import Db, tool


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")


    @tool(writes=["notes"])
    async def add_then_count(db: Db, body: str, n: int) -> int:
        """Add a note, then count to n the slow way.

        Args:
            body: Text of the note.
            n: How far to count.
        """
        await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
        return await db.fetch_value(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?) "
            "SELECT COUNT(*) FROM c",
            (n,),
        )


    @tool
    async def tidy(db: Db, n: int) -> int:
        """Strip n letters b (and one a) from the left of n letters a.

        Args:
            n: How many letters.
        """
        return await db.fetch_value(
            "SELECT length(ltrim(printf('%.*c', ?, 'a'), printf('%.*c', ?, 'b') || 'a'))", (n, n)
        )


    @tool
    async def find(db: Db, n: int) -> int:
        """Where n/2 letters a and a b start in n letters a.

        Args:
            n: How many letters.
        """
        return await db.fetch_value(
            "SELECT instr(replace(hex(zeroblob(?)), '0', 'a'), replace(hex(zeroblob(?)), '0', 'a') || 'b')",
            (n // 2, n // 4),
        )


    @tool
    async def amplify(db: Db, k: int) -> int:
        """The length of k letters, each made a mebibyte.

        Args:
            k: How many letters.
        """
        return await db.fetch_value(
            "SELECT length(replace(printf('%.*c', ?, 'a'), 'a', printf('%.*c', 1048576, 'b')))", (k,)
        )


    @tool
    async def merge(db: Db, n: int) -> str:
        """Two objects of n keys, merged.

        Args:
            n: How many keys.
        """
        return await db.fetch_value(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?) "
            "SELECT length(json_patch((SELECT json_group_object('a' || x, x) FROM c), "
            "(SELECT json_group_object('b' || x, x) FROM c)))",
            (n,),
        )


    @tool
    async def widen(db: Db, columns: int) -> int:
        """One row of that many columns, each the length of a 16 MiB text.

        Args:
            columns: How many columns.
        """
        heavy = ", ".join(f"length(hex(zeroblob(8000000 + (random() & 0)))) AS c{i}" for i in range(columns))
        row = await db.fetch_all("SELECT " + heavy)
        return len(row[0])


    @tool
    async def matches(db: Db, n: int, pattern: str) -> int:
        """Whether n letters match a pattern.

        Args:
            n: How many letters.
            pattern: A LIKE pattern.
        """
        return await db.fetch_value("SELECT printf('%.*c', ?, 'a') LIKE ?", (n, pattern))


    @tool
    async def export_padded(db: Db, rows: int, size: int) -> int:
        """Export rows padded to a size.

        Args:
            rows: How many rows.
            size: Bytes of padding per row.
        """
        found = await db.fetch_all(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?) "
            "SELECT x, zeroblob(?) AS pad FROM c",
            (rows, size),
        )
        return len(found)
    '''
)


@pytest.fixture
def sql_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Environment:
    limits = dataclasses.replace(confined_tools_module.DEFAULT_LIMITS, call_timeout_s=CALL_LIMIT_S)
    monkeypatch.setattr(confined_tools_module, "DEFAULT_LIMITS", limits)
    return load_env(make_confined_env(tmp_path / "sql", SQL_TOOLS), static_gate=False)


@contextmanager
def watchdog(conn: sqlite3.Connection) -> Iterator[None]:
    """Interrupt `conn`'s statement after `WATCHDOG_S`: without a bound the attack holds the
    SQLite thread (or the event loop) for good, and the test must then fail, not hang."""
    timer = threading.Timer(WATCHDOG_S, conn.interrupt)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


async def test_an_endless_statement_stops_at_the_call_limit_and_holds_up_no_other_env(
    sql_env: Environment, bank_env: Environment
) -> None:
    fleet = Fleet([sql_env, bank_env])
    fleet.store.pool = WorkerPool(1)  # one SQLite thread for every episode, as `default_pool` has
    try:
        attacker = await fleet.create_episode("payloads")
        bystander = await fleet.create_episode("bank")
        assert (await fleet.call(attacker.id, "count_notes", {})).text == "1"  # the worker is up
        with watchdog(attacker.conn.raw):
            start = time.monotonic()
            attack = asyncio.create_task(
                fleet.call(attacker.id, "add_then_count", {"body": "half", "n": ENDLESS})
            )
            await asyncio.sleep(0.3)
            read = await fleet.call(bystander.id, "get_account", {"account_id": "A-1"})
            newcomer = await fleet.create_episode("bank")
            bystander_waited = time.monotonic() - start
            result = await attack
            attack_took = time.monotonic() - start
        assert not read.is_error and "A-1" in read.text, read.text
        assert bystander_waited < CALL_LIMIT_S + 2.5, f"another env's episode waited {bystander_waited:.1f}s"
        assert attack_took < CALL_LIMIT_S + 2.5, f"the call took {attack_took:.1f}s"
        assert result.kind == "env_error", result.text
        assert f"time limit of {CALL_LIMIT_S:g}s" in result.text, result.text
        # rolled back: the note it added is gone, and the episode (and a new one) still serve
        assert (await fleet.call(attacker.id, "count_notes", {})).text == "1"
        assert not (await fleet.call(newcomer.id, "get_account", {"account_id": "A-1"})).is_error
    finally:
        await fleet.aclose()


class Ticker:
    """Notes when the event loop last ran it: the longest gap is how long the loop was frozen."""

    def __init__(self) -> None:
        self.ticks: list[float] = []

    async def run(self) -> None:
        while True:
            self.ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    def longest_gap(self) -> float:
        return max(b - a for a, b in zip(self.ticks, self.ticks[1:], strict=False))


async def test_an_endless_statement_during_synthesis_stops_at_the_call_limit(sql_env: Environment) -> None:
    """Task synthesis runs SQL on the event loop's thread (`run_inline`), where the call's
    `asyncio.timeout` cannot fire while a statement runs: the statement's own deadline must stop it."""
    fleet = Fleet([sql_env])
    run_inline(fleet)
    ticker = Ticker()
    ticking = asyncio.create_task(ticker.run())
    try:
        ep = await fleet.create_episode("payloads")
        assert (await fleet.call(ep.id, "count_notes", {})).text == "1"  # the worker is up
        with watchdog(ep.conn.raw):
            start = time.monotonic()
            result = await fleet.call(ep.id, "add_then_count", {"body": "half", "n": ENDLESS})
            took = time.monotonic() - start
        assert took < CALL_LIMIT_S + 2.5, f"the call (and the event loop) took {took:.1f}s"
        assert ticker.longest_gap() < CALL_LIMIT_S + 2.5, f"the loop froze {ticker.longest_gap():.1f}s"
        assert result.kind == "env_error", result.text
        assert f"time limit of {CALL_LIMIT_S:g}s" in result.text, result.text
        assert (await fleet.call(ep.id, "count_notes", {})).text == "1"  # rolled back
    finally:
        ticking.cancel()
        await fleet.aclose()


async def test_an_endless_statement_in_a_scratch_episode_stops_at_the_call_limit(
    sql_env: Environment,
) -> None:
    """Synthesis's walks and replays run on `ScratchPool` episodes, inline too."""
    pool = ScratchPool(sql_env)
    ep = pool.open(sql_env.seed_db)
    try:
        assert (await execute(ep, "count_notes", {})).text == "1"  # the worker is up
        with watchdog(ep.conn.raw):
            start = time.monotonic()
            result = await execute(ep, "add_then_count", {"body": "half", "n": ENDLESS})
            took = time.monotonic() - start
        assert took < CALL_LIMIT_S + 2.5, f"the call (and the event loop) took {took:.1f}s"
        assert result.kind == "env_error", result.text
        assert f"time limit of {CALL_LIMIT_S:g}s" in result.text, result.text
        assert (await execute(ep, "count_notes", {})).text == "1"  # rolled back
    finally:
        pool.close(ep)
        pool.close_all()


@pytest.mark.parametrize("inline", [False, True], ids=["serving", "synthesis"])
async def test_a_result_too_large_to_send_is_never_held_whole(sql_env: Environment, inline: bool) -> None:
    """The tool picks the row count and the size of each value: 150 rows of 1 MB (~750 MB here
    before rows were counted as fetched), or one value of 200 MB."""
    fleet = Fleet([sql_env])
    if inline:
        run_inline(fleet)
    try:
        ep = await fleet.create_episode("payloads")
        assert (await fleet.call(ep.id, "count_notes", {})).text == "1"  # the worker is up
        for rows, size in ((150, 1_000_000), (1, 200_000_000)):
            reset_peak()
            result = await fleet.call(ep.id, "export_padded", {"rows": rows, "size": size})
            grew = peak_growth_mb_since_reset()
            assert result.kind == "env_error", result.text  # the tool got an SQL error and raised
            assert grew < 150, f"{rows} rows of {size} bytes: peak RSS rose {grew:.0f} MB"
        small = await fleet.call(ep.id, "export_padded", {"rows": 3, "size": 1000})
        assert small.text == "3", small.text
    finally:
        await fleet.aclose()


async def test_work_inside_one_step_of_sqlite_is_bounded_too(sql_env: Environment) -> None:
    """The attack the progress handler cannot see: work done inside a single VM step. SQLite's
    `ltrim(X, Y)` compared each character of X with each of Y there (n^2: 200,000 characters held
    the server for a minute), `instr` and `replace` tried the whole needle at every position (a
    million characters against half a million: 78 s), and a long LIKE pattern against a long text
    is n x m. Those functions are linear now, and a model-written statement's LIKE and GLOB
    patterns are at most 64 characters."""
    fleet = Fleet([sql_env])
    try:
        episode = await fleet.create_episode("payloads")
        n = 200_000
        with watchdog(episode.conn.raw):
            start = time.monotonic()
            tidied = await fleet.call(episode.id, "tidy", {"n": n})
            trimmed_in = time.monotonic() - start
        assert tidied.text == "0" and trimmed_in < 1.0, (tidied.text, trimmed_in)
        with watchdog(episode.conn.raw):
            start = time.monotonic()
            found = await fleet.call(episode.id, "find", {"n": 2_000_000})
            found_in = time.monotonic() - start
        assert found.text == "0" and found_in < 1.0, (found.text, found_in)
        long_pattern = {"n": 16 * 1024 * 1024, "pattern": "%" + "a" * 200 + "b"}
        with watchdog(episode.conn.raw):
            start = time.monotonic()
            matched = await fleet.call(episode.id, "matches", long_pattern)  # SQLite refuses the pattern
            matched_in = time.monotonic() - start
        assert matched.is_error, matched.text
        assert matched_in < CALL_LIMIT_S, matched_in
        fine = await fleet.call(episode.id, "matches", {"n": n, "pattern": "%ab%"})
        assert fine.text == "0", fine.text
    finally:
        await fleet.aclose()


def test_the_linear_functions_answer_as_sqlites_own_do(bank_env: Environment) -> None:
    """The replaced functions must not change a single answer, nor its type: arguments drawn at
    random from short texts of letters, a space, an accented letter and NUL, and from numbers as
    SQLite writes them (0.1 + 0.2, 1e20, Inf, -0.0), blobs (one not UTF-8), empty values and NULL.
    An error must stay an error."""
    import random

    from envforge.server import open_database

    guarded, plain = open_database(bank_env.seed_db), sqlite3.connect(":memory:")

    def answer(conn: sqlite3.Connection, sql: str, args: tuple[object, ...]) -> tuple[object, ...]:
        try:
            value = conn.execute(sql, args).fetchone()[0]
        except sqlite3.Error:
            return ("error",)
        return (type(value).__name__, value)

    draw = random.Random(7)
    odd: list[object] = [
        0.1 + 0.2,
        1e20,
        float("inf"),
        -0.0,
        5,
        2.5,
        None,
        b"\xff\xfeA",
        b"a\x00b",
        "",
        b"",
        10**18,
    ]

    def value() -> object:
        if draw.random() < 0.25:
            return draw.choice(odd)
        return "".join(draw.choice("ab \u00e9\x00") for _ in range(draw.randint(0, 6)))

    many = "".join(chr(c) for c in range(0x100, 0x100 + 300))  # past MAX_CLASS_CHARACTERS
    for _ in range(200):  # sets too large for a character class are looked up one by one
        text = "".join(draw.choice(many + "ab") for _ in range(draw.randint(0, 12)))
        for name in ("trim", "ltrim", "rtrim"):
            sql = f"SELECT {name}(?, ?)"
            assert answer(guarded, sql, (text, many)) == answer(plain, sql, (text, many)), (name, text)
    for _ in range(3000):
        x, y, z = value(), value(), value()
        for sql, args in (
            ("SELECT trim(?, ?)", (x, y)),
            ("SELECT ltrim(?, ?)", (x, y)),
            ("SELECT rtrim(?, ?)", (x, y)),
            ("SELECT instr(?, ?)", (x, y)),
            ("SELECT replace(?, ?, ?)", (x, y, z)),
        ):
            assert answer(guarded, sql, args) == answer(plain, sql, args), (sql, args)


async def test_a_result_no_value_may_hold_is_never_built(sql_env: Environment) -> None:
    """The attack on a replacement that builds its answer before anything measures it: 200
    letters, each replaced by a mebibyte. SQLite's own `replace` stops at the length limit as its
    result grows; the linear one works the length out first. The call fails, and this process
    (which runs every confined statement) never holds the 200 MiB."""
    import resource

    fleet = Fleet([sql_env])
    try:
        episode = await fleet.create_episode("payloads")
        assert (await fleet.call(episode.id, "amplify", {"k": 16})).text == str(16 * 1024 * 1024)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        refused = await fleet.call(episode.id, "amplify", {"k": 200})
        grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert refused.is_error, refused.text
        assert grew_mib < 64, f"peak memory grew {grew_mib:.0f} MiB"
    finally:
        await fleet.aclose()


async def test_json_patch_is_not_offered_to_model_written_sql(sql_env: Environment) -> None:
    """`json_patch` merges two objects in key x key time inside one VM step (40,000 keys each:
    5 s). The authorizer refuses it, at once."""
    fleet = Fleet([sql_env])
    try:
        episode = await fleet.create_episode("payloads")
        start = time.monotonic()
        merged = await fleet.call(episode.id, "merge", {"n": 40_000})
        assert merged.is_error and time.monotonic() - start < 1.0, merged.text
    finally:
        await fleet.aclose()


async def test_a_straight_run_of_heavy_columns_is_bounded_and_off_the_loop(sql_env: Environment) -> None:
    """SQLite looks at the progress handler only where its program jumps, so one row of columns,
    each a 16 MiB operation, runs to its end whatever the deadline: 100 of them take ~0.9 s. Such a
    statement is too long to run on the event loop's thread (it holds the SQLite thread, not every
    client), and a model-written statement compiles to at most 2,000 instructions, so 400 of them
    are refused before they start."""
    fleet = Fleet([sql_env])
    ticker = Ticker()
    ticking = asyncio.create_task(ticker.run())
    try:
        episode = await fleet.create_episode("payloads")
        assert (await fleet.call(episode.id, "count_notes", {})).text == "1"  # the worker is up
        ticker.ticks[:] = [time.monotonic()]
        wide = await fleet.call(episode.id, "widen", {"columns": 100})
        ticker.ticks.append(time.monotonic())
        assert ticker.longest_gap() < 0.4, f"the loop froze {ticker.longest_gap():.2f}s"
        assert wide.text == "100" or "time limit" in wide.text, wide.text
        start = time.monotonic()
        wider = await fleet.call(episode.id, "widen", {"columns": 400})
        assert wider.is_error and time.monotonic() - start < 0.5, wider.text
    finally:
        ticking.cancel()
        await fleet.aclose()
