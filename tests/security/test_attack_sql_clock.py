"""A tool's SQL reading the wall clock: an end state must not depend on when a call ran.

A task's golden end state is stored when it is made and compared byte for byte when an agent is
scored. Qwen2.5-Coder-1.5B wrote `created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP` on every table
of every schema it wrote; each row a tool inserted carried the second it ran, and every task
synthesized for its Slack env failed `check`'s golden replay minutes later. Here a confined env,
served by a real worker over real SQLite, reads the clock every way SQLite offers, once, then again
after the wall clock has moved on.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
import time
from pathlib import Path

from envforge.server import ScratchPool, execute, load_env

CLOCK_TOOLS = textwrap.dedent(
    '''
    """Tools whose SQL reads the clock."""

    from __future__ import annotations

    from envforge.server import Db, tool


    @tool(writes=["notes"])
    async def add_note(db: Db, body: str) -> dict:
        """Add a note, stamped by the column's default and by the statement itself.

        Args:
            body: Text of the note.
        """
        await db.execute(
            "INSERT INTO notes (body, due) VALUES (?, datetime('now', '+1 day'))", (body,)
        )
        return await db.fetch_one("SELECT * FROM notes WHERE body = ?", (body,))


    @tool
    async def what_time(db: Db) -> list:
        """Every way SQL reads the clock."""
        row = await db.execute_fetchall(
            "SELECT CURRENT_TIMESTAMP, CURRENT_DATE, CURRENT_TIME, datetime('now'), date(), time('NOW'),"
            " julianday('now'), unixepoch('now'), strftime('%s', 'now'), strftime('%Y-%m-%d')"
        )
        return list(row[0])
    '''
)

NOW = "2025-06-01 12:00:00"
"""What the project's SQL reads as now (`server/core/sqlclock.py`)."""


def _clock_env(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "env.toml").write_text(
        'name = "clock"\ndescription = "d"\nversion = "0.1.0"\nseed = "seed.json"\ntrust = "confined"\n'
    )
    (root / "schema.sql").write_text(
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL,"
        " created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, due TEXT);\n"
    )
    (root / "seed.json").write_text(json.dumps({"notes": [{"id": 1, "body": "seeded"}]}))
    (root / "policy.md").write_text("# Policy\n\nBe helpful.\n")
    (root / "tools.py").write_text(CLOCK_TOOLS)
    return root


async def test_a_state_written_later_is_the_same_state(tmp_path: Path) -> None:
    env = load_env(_clock_env(tmp_path / "clock"))
    pool = ScratchPool(env, size=1)
    states, times = [], []
    for _ in range(2):
        episode = pool.open(env.seed_db)
        added = await execute(episode, "add_note", {"body": "hello"})
        assert not added.is_error, added.text
        read = await execute(episode, "what_time", {})
        assert not read.is_error, read.text
        states.append(episode.conn.raw.execute("SELECT * FROM notes ORDER BY id").fetchall())
        times.append(json.loads(read.text))
        time.sleep(1.1)  # past a second's boundary: the wall clock now reads otherwise
    assert states[0] == states[1]
    assert times[0] == times[1]
    assert times[0] == [
        NOW,
        "2025-06-01",
        "12:00:00",
        NOW,
        "2025-06-01",
        "12:00:00",
        2460828.0,
        1748779200,
        "1748779200",
        "2025-06-01",
    ]
    # the seed's row stamped by the default as it was loaded, the added one by the same clock
    assert states[0] == [(1, "seeded", NOW, None), (2, "hello", NOW, "2025-06-02 12:00:00")]


async def test_every_other_date_call_is_sqlites_own_answer(tmp_path: Path) -> None:
    env = load_env(_clock_env(tmp_path / "clock"))
    episode = ScratchPool(env, size=1).open(env.seed_db)
    plain = sqlite3.connect(":memory:")
    for expression in (
        "datetime('2024-02-29', '+1 year')",
        "date('2024-01-31', '+1 month', 'start of month')",
        "strftime('%Y-%m-%dT%H:%M', '2024-02-29 23:59:59', '+1 minute')",
        "julianday('2000-01-01')",
        "unixepoch('1970-01-02')",
        "datetime(1700000000, 'unixepoch')",
        "date(NULL)",
        "date('not a date')",
        "time('12:34:56.789')",
        "date(2460828.5)",
    ):
        sql = f"SELECT {expression}"
        assert episode.conn.raw.execute(sql).fetchone() == plain.execute(sql).fetchone(), expression
