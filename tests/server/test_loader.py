"""Loading validates everything and names file and line for each problem."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envforge.server import EnvLoadError, load_env

from support.paths import BANK_DIR


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "bank"
    shutil.copytree(BANK_DIR, dst)
    return dst


def _problems(path: Path) -> list[str]:
    with pytest.raises(EnvLoadError) as info:
        load_env(path)
    return [str(p) for p in info.value.problems]


def test_bank_loads_with_schemas_and_marks(bank_env):
    assert list(bank_env.tools)[:3] == ["get_account", "list_accounts", "transfer"]
    transfer = bank_env.tools["transfer"]
    assert transfer.writes == ("accounts", "transfers")
    assert not transfer.read_only and bank_env.tools["get_account"].read_only
    schema = transfer.input_schema
    assert schema["required"] == ["src", "dst", "amount"]
    assert schema["properties"]["amount"] == {
        "description": "How much, greater than zero.",
        "title": "Amount",
        "type": "number",
    }
    assert bank_env.tools["list_accounts"].input_schema["properties"]["status"]["anyOf"][0]["enum"] == [
        "open",
        "frozen",
    ]
    assert [t.name for t in bank_env.tables] == ["accounts", "customers", "transfers"]


def test_ddl_error_names_file_and_line(tmp_path):
    env = _copy(tmp_path)
    (env / "schema.sql").write_text(
        "CREATE TABLE a (id TEXT PRIMARY KEY);\n\nCREATE TABLE b (id TEXT PRIMARY KEY,,);\n"
    )
    (env / "seed.json").write_text("{}")
    [problem] = _problems(env)
    assert problem.startswith(f"{env / 'schema.sql'}:3: DDL failed")


def test_statements_sharing_a_line_are_split_and_located(tmp_path):
    """Models write `CREATE TABLE a(...); CREATE TABLE b(...);` on one line: that is two statements
    (SQLite refused the pair as one with "You can only execute one statement at a time"), and an
    error in the second names the line it stands on."""
    env = _copy(tmp_path)
    (env / "seed.json").write_text("{}")
    (env / "schema.sql").write_text(
        "-- two on a line; a ';' in a default and a comment\n"
        "CREATE TABLE a (id TEXT PRIMARY KEY, note TEXT DEFAULT ';'); CREATE TABLE b (id TEXT PRIMARY KEY);\n"
    )
    with pytest.raises(EnvLoadError) as info:  # the bank's tools write tables this schema lacks
        load_env(env)
    assert not any("one statement at a time" in str(p) or "DDL failed" in str(p) for p in info.value.problems)
    (env / "schema.sql").write_text(
        "CREATE TABLE a (id TEXT PRIMARY KEY);\n\n"
        "CREATE TABLE c (x INTEGER PRIMARY KEY); CREATE TABLE b (id TEXT PRIMARY KEY,,);\n"
    )
    [problem] = _problems(env)
    assert problem.startswith(f"{env / 'schema.sql'}:3: DDL failed")


def test_table_without_primary_key_is_rejected(tmp_path):
    env = _copy(tmp_path)
    (env / "schema.sql").write_text("CREATE TABLE a (id TEXT);\n")
    (env / "seed.json").write_text("{}")
    assert "without a primary key: ['a']" in _problems(env)[0]


def test_seed_constraint_violation_names_row_line(tmp_path):
    env = _copy(tmp_path)
    seed = (env / "seed.json").read_text().replace('"balance": 50.0', '"balance": -5')
    (env / "seed.json").write_text(seed)
    line = next(i for i, text in enumerate(seed.splitlines(), 1) if '"A-2"' in text)
    [problem] = _problems(env)
    assert f"seed.json:{line - 1}:" in problem or f"seed.json:{line}:" in problem
    assert "CHECK constraint failed" in problem


def test_seed_foreign_key_violation_is_located(tmp_path):
    env = _copy(tmp_path)
    lines = (env / "seed.json").read_text().splitlines()
    # the second mention of C-4 is account A-4's owner; point it at a customer that does not exist
    idx = [i for i, text in enumerate(lines) if '"C-4"' in text][1]
    lines[idx] = lines[idx].replace("C-4", "C-9")
    (env / "seed.json").write_text("\n".join(lines))
    row_start = max(i for i in range(idx) if lines[i].strip() == "{") + 1
    assert _problems(env) == [
        f"{env / 'seed.json'}:{row_start}: row for 'accounts' references a missing 'customers' row"
    ]


def test_unknown_seed_table_and_bad_json(tmp_path):
    env = _copy(tmp_path)
    (env / "seed.json").write_text('{\n "nope": [\n  {"x": 1}\n ]\n}\n')
    assert _problems(env) == [f"{env / 'seed.json'}:3: unknown table 'nope'"]
    (env / "seed.json").write_text('{\n "customers": [\n  {"x": 1\n ]\n}\n')
    assert "invalid JSON" in _problems(env)[0]


def test_tools_syntax_error_has_line(tmp_path):
    env = _copy(tmp_path)
    (env / "tools.py").write_text("from envforge.server import tool\n\n\nasync def broken(:\n    pass\n")
    assert _problems(env) == [f"{env / 'tools.py'}:4: syntax error: invalid syntax"]


def test_tool_definition_errors_are_listed_with_lines(tmp_path):
    env = _copy(tmp_path)
    (env / "tools.py").write_text(
        "from envforge.server import tool\n\n"
        "@tool\nasync def no_doc(db, x: str):\n    return x\n\n"
        "@tool\nasync def no_db(x: str):\n    '''Doc.'''\n\n"
        "@tool\nasync def untyped(db, x):\n    '''Doc.'''\n"
    )
    problems = _problems(env)
    assert len(problems) == 3
    assert problems[0].startswith(f"{env / 'tools.py'}:4:") and "docstring is required" in problems[0]
    assert ":8:" in problems[1] and "first parameter must be 'db'" in problems[1]
    assert ":12:" in problems[2] and "no type annotation" in problems[2]


def test_duplicate_tool_names(tmp_path):
    env = _copy(tmp_path)
    (env / "tools.py").write_text(
        "from envforge.server import tool\n\n"
        "@tool(name='same')\nasync def a(db):\n    '''A.'''\n\n"
        "@tool(name='same')\nasync def b(db):\n    '''B.'''\n"
    )
    assert "duplicate tool name 'same'" in _problems(env)[0]


def test_import_error_in_tools_is_located(tmp_path):
    env = _copy(tmp_path)
    (env / "tools.py").write_text("x = 1\nimport not_a_module_anywhere\n")
    assert _problems(env)[0].startswith(f"{env / 'tools.py'}:2: importing failed: ModuleNotFoundError")


def test_manifest_and_policy_problems(tmp_path):
    env = _copy(tmp_path)
    (env / "env.toml").write_text('name = "Bad Name"\ndescription = "x"\ncolour = "red"\n')
    problems = _problems(env)
    assert any("name:" in p for p in problems) and any("colour" in p for p in problems)
    env2 = _copy(tmp_path / "two")
    (env2 / "policy.md").write_text("  \n")
    assert "policy.md is missing or empty" in _problems(env2)[0]
    env3 = _copy(tmp_path / "three")
    (env3 / "env.toml").write_text(
        'name = "bank"\ndescription = "x"\n[volatile_columns]\naccounts = ["nope"]\n'
    )
    assert "unknown column accounts.nope" in _problems(env3)[0]


def test_not_a_directory(tmp_path):
    assert "not a directory" in _problems(tmp_path / "missing")[0]
