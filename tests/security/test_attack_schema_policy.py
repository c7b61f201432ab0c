"""Attacks through a model-written schema.sql: statements that run at load, and triggers planted
for later.

Before, a confined env's schema was applied as it came: `CREATE TABLE ... AS WITH RECURSIVE ...`
passed the text check and `inspect`, `serve` and `synth env`'s load gate never finished (or
finished at the load deadline), and a trigger that fires only on a value the seed lacks passed
load, to run later with no bound when a client posted a state holding that value. Now each
statement is prepared on a throwaway connection (never run) and judged by what SQLite's
authorizer is asked: a confined schema may create tables, indexes and views, nothing else.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from envforge.server import EnvLoadError, Fleet, load_env, schema_violations

from support.confined import make_confined_env
from support.paths import REPO

CLEAN_TOOLS = '''
from envforge.server import Db, tool


@tool()
async def count_notes(db: Db) -> int:
    """How many notes there are."""
    return int(await db.fetch_value("SELECT count(*) FROM notes"))
'''

NOTES = "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n"
ENDLESS = (
    "CREATE TABLE spin AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "SELECT max(x) AS x FROM c;\n"
)
PLANTED_TRIGGER = (
    "CREATE TABLE log (id INTEGER PRIMARY KEY, n INTEGER);\n"
    "CREATE TRIGGER planted AFTER INSERT ON notes WHEN new.body = 'never-in-the-seed' BEGIN\n"
    "  INSERT INTO log (n) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "SELECT max(x) FROM c;\n"
    "END;\n"
)


def _env(tmp_path: Path, schema: str) -> Path:
    root = make_confined_env(tmp_path / "env", CLEAN_TOOLS)
    (root / "schema.sql").write_text(schema)
    return root


def test_an_endless_create_table_as_select_is_refused_before_it_runs(tmp_path: Path) -> None:
    root = _env(tmp_path, NOTES + ENDLESS)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "envforge.cli", "inspect", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"ENVFORGE_SCHEMA_TIMEOUT_S": "60", **_path_env()},
    )
    took = time.monotonic() - start
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said
    assert "schema.sql:2" in said and "CREATE TABLE ... AS SELECT is not allowed" in said, said
    assert "CREATE TABLE spin AS WITH RECURSIVE" in said  # the statement is named
    assert took < 20, f"refused only after {took:.1f}s: it ran until a deadline"


def _path_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "ENVFORGE_SCHEMA_TIMEOUT_S"}


def test_a_planted_trigger_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(EnvLoadError) as err:
        load_env(_env(tmp_path, NOTES + PLANTED_TRIGGER))
    assert len(err.value.problems) == 1
    problem = err.value.problems[0]
    assert problem.file.name == "schema.sql" and problem.line == 3
    assert "CREATE TRIGGER is not allowed" in problem.message


@pytest.mark.parametrize(
    ("statement", "rule"),
    [
        ("CREATE TABLE copy AS SELECT * FROM notes;", "AS SELECT is not allowed"),
        (
            "CREATE VIEW spin AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
            "SELECT x FROM c;",
            "recursive CTE",
        ),
        ("CREATE VIEW a AS SELECT * FROM notes;\nCREATE VIEW b AS SELECT * FROM a;", "only tables"),
        ("CREATE VIEW w AS WITH n AS (SELECT id FROM notes) SELECT id FROM n;", "only tables"),
        ("CREATE TEMP TABLE scratch (a);", "TEMP"),
        ("CREATE VIRTUAL TABLE fts USING fts5(body);", "VIRTUAL TABLE"),
        ("INSERT INTO notes (id, body) VALUES (9, 'x');", "INSERT is not allowed"),
        ("PRAGMA foreign_keys = OFF;", "PRAGMA is not allowed"),
        ("DROP TABLE notes;", "DROP TABLE is not allowed"),
        ("ALTER TABLE notes ADD COLUMN extra TEXT;", "ALTER TABLE is not allowed"),
        ("CREATE TABLE pad (id INTEGER PRIMARY KEY, b BLOB DEFAULT (json_patch('{}', '{}')));", "json_patch"),
        ("CREATE VIEW leak AS SELECT readfile('/etc/passwd') AS f;", "readfile"),
        ("/* a */ ATTACH /* b */ DATABASE '/tmp/x.db' AS x;", "ATTACH is not allowed"),
    ],
)
def test_what_a_confined_schema_may_not_hold(statement: str, rule: str, tmp_path: Path) -> None:
    found = schema_violations(NOTES + statement + "\n")
    assert [v.line for v in found] == [statement.count("\n") + 2], found
    assert rule in found[0].rule


def test_what_a_confined_schema_may_hold_still_loads(tmp_path: Path) -> None:
    schema = (
        "CREATE TABLE notes (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  body TEXT NOT NULL CHECK (length(body) > 0) DEFAULT ('x'),\n"
        "  shout TEXT GENERATED ALWAYS AS (upper(body)),\n"
        "  tag TEXT UNIQUE\n"
        ");\n"
        "CREATE INDEX notes_by_shout ON notes (lower(shout)) WHERE tag IS NOT NULL;\n"
        "CREATE VIEW long_notes AS SELECT id, body FROM notes WHERE length(body) > 3;\n"
    )
    assert schema_violations(schema) == []
    env = load_env(_env(tmp_path, schema))
    assert {t.name for t in env.tables} == {"notes"}


def test_nested_views_cannot_make_the_check_itself_slow() -> None:
    """Each reference to a view or a WITH table is expanded afresh when a read is prepared: 39
    views each joining the one before took 40 s to check, 20 views of a 16-level WITH 20 s, and
    as many `CREATE TABLE ... AS` of one as long: the check ends at the first refusal."""
    chain = "".join(
        f"CREATE VIEW v{i} AS SELECT a.id FROM v{i - 1} a JOIN v{i - 1} b ON a.id = b.id;\n"
        for i in range(1, 40)
    )
    ctes = ", ".join(
        ["c0 AS (SELECT 1 AS x)"]
        + [f"c{i} AS (SELECT x FROM c{i - 1} UNION ALL SELECT x FROM c{i - 1})" for i in range(1, 17)]
    )
    wide = "".join(f"CREATE VIEW w{j} AS WITH {ctes} SELECT x FROM c16;\n" for j in range(20))
    copies = "".join(f"CREATE TABLE z{j} AS WITH {ctes} SELECT x FROM c16;\n" for j in range(20))
    for schema in (NOTES + "CREATE VIEW v0 AS SELECT id FROM notes;\n" + chain, NOTES + wide, NOTES + copies):
        start = time.monotonic()
        assert schema_violations(schema)
        assert time.monotonic() - start < 5


@pytest.mark.parametrize("name", ["library", "pharmacy", "car_rental", "gym", "helpdesk_lite"])
def test_the_synthesized_envs_schemas_pass(name: str) -> None:
    assert schema_violations((REPO / "envs" / name / "schema.sql").read_text()) == []


ADD_NOTE_TOOLS = '''
from envforge.server import Db, tool


@tool(writes=["notes"])
async def add_note(db: Db, body: str) -> dict:
    """Add a note."""
    await db.execute("INSERT INTO notes (body) VALUES (?)", (body,))
    return await db.fetch_one("SELECT id, body FROM notes ORDER BY id DESC LIMIT 1")
'''


async def test_an_autoincrement_key_is_a_plain_creation_and_its_env_runs(tmp_path: Path) -> None:
    """AUTOINCREMENT makes SQLite create its `sqlite_sequence` beside the table: the check counted
    two creations in one statement and refused the schema (Qwen2.5-Coder-1.5B's Petstore
    `users` table, captured, three repairs running). The counter table is SQLite's bookkeeping; a
    schema still may not create or write it by name."""
    schema = "CREATE TABLE notes (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);\n"
    assert schema_violations(schema) == []
    assert (
        "reserved for internal use"
        in schema_violations(schema + "CREATE TABLE sqlite_sequence (name, seq);")[0].rule
    )
    assert schema_violations(schema + "INSERT INTO sqlite_sequence VALUES ('notes', 99);")
    root = make_confined_env(tmp_path / "env", ADD_NOTE_TOOLS)
    (root / "schema.sql").write_text(schema)
    env = load_env(root)
    assert {t.name for t in env.tables} == {"notes"}
    fleet = Fleet([env])
    try:
        episode = await fleet.create_episode(env.name)
        result = await fleet.call(episode.id, "add_note", {"body": "second"})
        assert not result.is_error, result.text
        assert '"id": 2' in result.text
        state = (await fleet.export(episode.id))[0]
        assert state == {"notes": [{"id": 1, "body": "seed"}, {"id": 2, "body": "second"}]}
    finally:
        await fleet.aclose()
