"""The CLI is a thin layer over the Python API: it parses options, calls the API, prints. What it
must not do is the work itself, where a script using `import envforge` could not reach it."""

from __future__ import annotations

import ast
import json
import sqlite3
from pathlib import Path

import envforge
from envforge.cli.main import main

from support.paths import REPO

CLI = REPO / "cli"


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_command_opens_a_database_itself() -> None:
    """An env's database is the server's: a command that opens SQLite itself (`inspect` counting
    rows) bypasses the loader's limits and reads what no API caller sees."""
    offenders = {
        p.name: sorted(mods & {"sqlite3", "aiosqlite"})
        for p in CLI.glob("*.py")
        if (mods := _imported_modules(p)) & {"sqlite3", "aiosqlite"}
    }
    assert offenders == {}


def test_inspect_counts_the_rows_the_seed_holds(capsys, monkeypatch) -> None:
    env_dir = REPO / "envs" / "retail_orders"
    monkeypatch.setattr("sys.argv", ["envforge", "inspect", str(env_dir), "--json"])
    try:
        main()
    except SystemExit as exc:
        assert exc.code in (0, None)
    shown = json.loads(capsys.readouterr().out)
    seed = envforge.load_env(env_dir).seed_db
    conn = sqlite3.connect(":memory:")
    conn.deserialize(seed)
    expected = {
        t["name"]: conn.execute(f'SELECT COUNT(*) FROM "{t["name"]}"').fetchone()[0] for t in shown["tables"]
    }
    assert {t["name"]: t["rows"] for t in shown["tables"]} == expected
    assert all(n > 0 for n in expected.values())
