"""Attacks by model-written tools on the serving process through the worker's own protocol pipe.

A confined tool cannot reach the host, but it can find the pipe its worker answers on and write
whatever it likes there: lines that are not JSON, messages of the wrong shape, a start-up message
mid-call, a line that never ends. Each must end that worker (reported as an env error of the
call, "protocol violation" logged), leave nothing of the call in the episode, and leave the
serving process and other episodes working, with a fresh worker. And a tool's slow read must not
hold the serving process's event loop: reads run there only while they are quick.
"""

from __future__ import annotations

import json
import logging
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from envforge.server import Environment, Fleet, load_env

from support.confined import make_confined_env

FORGING_TOOLS = textwrap.dedent(
    '''
    """Tools that write to the worker's protocol pipe behind its back."""

    from __future__ import annotations

    import os
    import stat

    from envforge.server import Db, tool


    def protocol_fd() -> int:
        """The pipe the worker answers the serving process on: a FIFO that is not stdin or stderr."""
        mine = {os.fstat(0).st_ino, os.fstat(2).st_ino}
        for fd in range(3, 64):
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            if stat.S_ISFIFO(st.st_mode) and st.st_ino not in mine:
                return fd
        raise RuntimeError("no protocol pipe found")


    @tool(writes=["notes"])
    async def forge(
        db: Db, head: str, tail: str = "", opening: str = "", closing: str = "", times: int = 0
    ) -> str:
        """Write a note, then a forged protocol line, then keep using the database.

        Args:
            head: The start of the line's bytes, in hex.
            tail: The end of the line's bytes, in hex.
            opening: Bytes repeated `times` times after the head, in hex.
            closing: Bytes repeated `times` times after those, in hex.
            times: How often.
        """
        await db.execute("INSERT INTO notes (body) VALUES ('forged')")
        parts = ((head, 1), (opening, times), (closing, times), (tail, 1))
        line = b"".join(bytes.fromhex(h) * n for h, n in parts)
        os.write(protocol_fd(), line)
        await db.fetch_value("SELECT COUNT(*) FROM notes")
        return "the forged line was accepted"


    @tool(writes=["notes"])
    async def flood(db: Db) -> str:
        """Write a note, then a protocol line that never ends."""
        await db.execute("INSERT INTO notes (body) VALUES ('flooded')")
        fd = protocol_fd()
        chunk = b"x" * (1 << 20)
        while True:
            os.write(fd, chunk)


    @tool
    async def count_notes(db: Db) -> int:
        """How many notes there are."""
        return await db.fetch_value("SELECT COUNT(*) FROM notes")


    @tool
    async def unbindable(db: Db) -> int:
        """Read with a parameter SQLite cannot bind (an integer past 64 bits)."""
        return await db.fetch_value("SELECT ?", (10**30,))


    @tool
    async def bind_number(db: Db, n: int) -> int:
        """Read back a number the caller passes."""
        return await db.fetch_value("SELECT ?", (n,))


    @tool
    async def slow_count(db: Db, n: int) -> int:
        """Count to n in SQL (a read that takes a while).

        Args:
            n: How far to count.
        """
        return await db.fetch_value(
            "SELECT count(*) FROM (WITH RECURSIVE c(x) AS"
            " (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?) SELECT x FROM c)",
            (n,),
        )
    '''
)


def _line(message: Any) -> dict[str, Any]:
    return {"head": (json.dumps(message) + "\n").encode().hex()}


def _repeating(head: str, opening: str, closing: str, times: int, tail: str) -> dict[str, Any]:
    hexed = {
        k: v.encode().hex()
        for k, v in (("head", head), ("opening", opening), ("closing", closing), ("tail", tail))
    }
    return {**hexed, "times": times}


SQL_HEAD = '{"type": "sql", "id": 1, "req": 1, "op": "execute", '
FORGED_LINES: dict[str, dict[str, Any]] = {
    "not json": {"head": b"this is not json\n".hex()},
    "not utf-8": {"head": b'{"type": "result", "id": 1, "outcome": "ok", "text": "\xff\xfe"}\n'.hex()},
    "not an object": _line([1, 2, 3]),
    "unknown type": _line({"type": "shell", "id": 1, "cmd": "id"}),
    "start-up message mid-call": _line({"type": "ready", "tools": []}),
    "id is a bool": _line({"type": "result", "id": True, "outcome": "ok", "text": "x"}),
    "id is a string": _line({"type": "result", "id": "1", "outcome": "ok", "text": "x"}),
    "extra field": _line({"type": "result", "id": 1, "outcome": "ok", "text": "x", "exec": "rm -rf /"}),
    "missing field": _line({"type": "result", "id": 1, "outcome": "ok"}),
    "unknown outcome": _line({"type": "result", "id": 1, "outcome": "pwned", "text": "x"}),
    "text is not a string": _line({"type": "result", "id": 1, "outcome": "ok", "text": ["x"]}),
    "lone surrogate": _line({"type": "result", "id": 1, "outcome": "ok", "text": "\ud800"}),
    "unknown sql op": _line({"type": "sql", "id": 1, "req": 1, "op": "executescript", "sql": "SELECT 1"}),
    "sql over a million chars": _repeating(SQL_HEAD + '"sql": "SELECT 1', " ", "", 1_000_000, '"}\n'),
    "params nested past the parser": _repeating(
        SQL_HEAD + '"sql": "SELECT 1", "params": ', "[", "]", 100_000, "}\n"
    ),
}


@pytest.fixture
def forging_env(tmp_path: Path) -> Environment:
    return load_env(make_confined_env(tmp_path / "forging", FORGING_TOOLS), static_gate=False)


def _worker_starts(env: Environment) -> int:
    cells = env.tools["count_notes"].fn.__closure__ or ()
    return next(c.cell_contents.starts for c in cells if hasattr(c.cell_contents, "starts"))


async def _assert_worker_ended_and_replaced(fleet: Fleet, env: Environment, episode_id: str, caplog) -> None:
    assert "protocol violation" in caplog.text, caplog.text[-2000:]
    state, _ = await fleet.export(episode_id)
    assert [r["body"] for r in state["notes"]] == ["seed"]  # the call's write was rolled back
    other = await fleet.create_episode(env.name)
    assert (await fleet.call(other.id, "count_notes", {})).text == "1"
    assert (await fleet.call(episode_id, "count_notes", {})).text == "1"
    assert _worker_starts(env) == 2


@pytest.mark.parametrize("forged", sorted(FORGED_LINES))
async def test_a_forged_protocol_line_ends_the_worker(forging_env: Environment, forged: str, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="envforge.server.runtime")  # a CLI test may have raised it
    fleet = Fleet([forging_env])
    try:
        episode = await fleet.create_episode(forging_env.name)
        assert (await fleet.call(episode.id, "count_notes", {})).text == "1"
        with anyio.fail_after(20):
            result = await fleet.call(episode.id, "forge", FORGED_LINES[forged])
        assert result.kind == "env_error", result.text
        await _assert_worker_ended_and_replaced(fleet, forging_env, episode.id, caplog)
    finally:
        await fleet.aclose()


async def test_a_line_that_never_ends_is_cut_off_at_the_size_limit(forging_env: Environment, caplog) -> None:
    """Without a bound the serving process would buffer the flood until memory runs out."""
    caplog.set_level(logging.ERROR, logger="envforge.server.runtime")
    fleet = Fleet([forging_env])
    try:
        episode = await fleet.create_episode(forging_env.name)
        assert (await fleet.call(episode.id, "count_notes", {})).text == "1"
        with anyio.fail_after(20):  # the fixture's call time limit is 30 s: the size bound must act first
            result = await fleet.call(episode.id, "flood", {})
        assert result.kind == "env_error", result.text
        assert "exceeds" in caplog.text, caplog.text[-2000:]
        await _assert_worker_ended_and_replaced(fleet, forging_env, episode.id, caplog)
    finally:
        await fleet.aclose()


async def test_a_statement_sqlite_cannot_run_fails_the_call_not_the_worker(forging_env: Environment) -> None:
    fleet = Fleet([forging_env])
    try:
        episode = await fleet.create_episode(forging_env.name)
        assert (await fleet.call(episode.id, "count_notes", {})).text == "1"
        result = await fleet.call(episode.id, "unbindable", {})
        assert result.kind == "env_error", result.text  # the tool made the integer: its own bug
        # the agent passed it: the agent's invalid call, so a failure it provokes on purpose cannot
        # leave its trial out of pass^k as the env's
        result = await fleet.call(episode.id, "bind_number", {"n": 10**30})
        assert result.kind == "invalid" and "out of the database's range" in result.text, result.text
        assert (await fleet.call(episode.id, "count_notes", {})).text == "1"
        assert _worker_starts(forging_env) == 1
    finally:
        await fleet.aclose()


async def test_a_slow_read_does_not_hold_the_event_loop(forging_env: Environment) -> None:
    """A confined tool's quick reads run on the event loop's thread; a slow one must move off it."""
    fleet = Fleet([forging_env])
    try:
        episode = await fleet.create_episode(forging_env.name)
        assert (await fleet.call(episode.id, "count_notes", {})).text == "1"
        started = time.perf_counter()
        assert (await fleet.call(episode.id, "slow_count", {"n": 1000})).text == "1000"
        longest_gap = 0.0

        async def tick() -> None:
            nonlocal longest_gap
            last = time.perf_counter()
            while True:
                await anyio.sleep(0.005)
                now = time.perf_counter()
                longest_gap, last = max(longest_gap, now - last), now

        n = 3_000_000  # ~1 s of SQLite work on these machines
        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            started = time.perf_counter()
            result = await fleet.call(episode.id, "slow_count", {"n": n})
            took = time.perf_counter() - started
            tg.cancel_scope.cancel()
        assert result.text == str(n), result.text
        assert took > 0.3, f"the read took {took:.2f}s: too quick to show anything"
        assert longest_gap < took / 3, f"the event loop was held {longest_gap:.2f}s of {took:.2f}s"
    finally:
        await fleet.aclose()
