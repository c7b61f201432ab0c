"""Attacks through SQL: each tool (or schema) below tries to escape the runtime's rules with SQL that
a text filter would miss. SQLite's authorizer must stop it: no file appears on disk, nothing the
attack wrote is committed, and the call is reported as an internal error of the env."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envforge.server import Db, EnvLoadError, Fleet, load_env

from support.paths import BANK_DIR, FIXTURES

ATTACK_SHOP = FIXTURES / "attack_shop"


@pytest.fixture
async def fleet():
    fleet = Fleet([load_env(ATTACK_SHOP)])
    yield fleet
    await fleet.aclose()


async def _state(fleet: Fleet, episode_id: str) -> str:
    return (await fleet.export(episode_id))[0]


@pytest.mark.parametrize("tool", ["attach_in_comment", "attach_concatenated", "vacuum_into"])
async def test_sql_that_would_create_a_file_creates_none(fleet: Fleet, tool: str, tmp_path: Path) -> None:
    payload = tmp_path / f"{tool}.db"
    episode = await fleet.create_episode("attack_shop")
    before = await _state(fleet, episode.id)
    result = await fleet.call(episode.id, tool, {"path": str(payload)})
    assert result.is_error and result.kind == "env_error", result.text
    assert not payload.exists()
    assert not list(tmp_path.iterdir())
    assert await _state(fleet, episode.id) == before


async def test_schema_attach_hidden_in_a_comment_creates_no_file_at_load(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    shutil.copytree(BANK_DIR, env_dir)
    payload = tmp_path / "from_schema.db"
    schema = env_dir / "schema.sql"
    text = schema.read_text()
    schema.write_text(text + f"\n/* -- */ ATTACH DATABASE '{payload}' AS x;\n")
    with pytest.raises(EnvLoadError) as caught:
        load_env(env_dir)
    line = text.count("\n") + 2
    assert f"schema.sql:{line}:" in str(caught.value) and "ATTACH" in str(caught.value)
    assert not payload.exists()


async def test_schema_may_still_create_tables_indexes_views_and_triggers(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    shutil.copytree(BANK_DIR, env_dir)
    schema = env_dir / "schema.sql"
    schema.write_text(
        schema.read_text()
        + "\nCREATE INDEX accounts_by_customer ON accounts (customer_id);\n"
        + "CREATE VIEW open_accounts AS SELECT * FROM accounts WHERE status = 'open';\n"
        + "CREATE TRIGGER no_self_transfer BEFORE INSERT ON transfers WHEN new.src = new.dst\n"
        + "BEGIN SELECT RAISE(ABORT, 'same account'); END;\n"
    )
    env = load_env(env_dir)
    assert {t.name for t in env.tables} == {"customers", "accounts", "transfers"}


async def test_pragma_writes_cannot_switch_off_foreign_keys(fleet: Fleet) -> None:
    episode = await fleet.create_episode("attack_shop")
    before = await _state(fleet, episode.id)
    result = await fleet.call(episode.id, "orphan_item", {"order_id": "O-404"})
    assert result.kind == "env_error" and "PRAGMA foreign_keys is not allowed" in result.text
    assert await _state(fleet, episode.id) == before
    # and the connection still enforces them for the next call
    again = await fleet.call(episode.id, "place_order", {"order_id": "O-2", "items": 1})
    assert not again.is_error, again.text


async def test_writable_schema_cannot_rewrite_sqlite_master(fleet: Fleet) -> None:
    episode = await fleet.create_episode("attack_shop")
    result = await fleet.call(episode.id, "rewrite_schema", {})
    assert result.kind == "env_error"
    sql = await episode.conn.execute_fetchall("SELECT sql FROM sqlite_master WHERE name = 'notes'")
    assert "text TEXT NOT NULL" in sql[0][0]


async def test_load_extension_is_not_an_allowed_function(fleet: Fleet, tmp_path: Path) -> None:
    episode = await fleet.create_episode("attack_shop")
    result = await fleet.call(episode.id, "load_module", {"path": str(tmp_path / "evil.so")})
    assert result.kind == "env_error" and "load_extension() is not allowed" in result.text


@pytest.mark.parametrize("tool", ["commit_then_raise", "savepoint_then_raise", "rollback_then_write"])
async def test_a_tool_cannot_end_the_transaction_itself(fleet: Fleet, tool: str) -> None:
    episode = await fleet.create_episode("attack_shop")
    before = await _state(fleet, episode.id)
    result = await fleet.call(episode.id, tool, {"text": "smuggled"})
    assert result.is_error and result.kind == "env_error", result.text
    assert await _state(fleet, episode.id) == before
    # a later, honest write commits only itself
    assert not (await fleet.call(episode.id, "add_note", {"text": "honest"})).is_error
    notes = await episode.conn.execute_fetchall("SELECT text FROM notes ORDER BY note_id")
    assert [n for (n,) in notes] == ["first", "honest"]


async def test_cached_statement_authorized_for_one_tool_is_not_reused_by_another(fleet: Fleet) -> None:
    """The authorizer runs when a statement is prepared, and Python caches prepared statements by
    their text: `add_note` prepares the INSERT under writes=['notes']; a read tool sending the same
    text must not get it from the cache unchecked."""
    episode = await fleet.create_episode("attack_shop")
    for _ in range(2):
        assert not (await fleet.call(episode.id, "add_note", {"text": "one"})).is_error
        sneaky = await fleet.call(episode.id, "read_tool_reusing_a_write", {"text": "two"})
        assert sneaky.kind == "env_error" and "not among this tool's writes" in sneaky.text
    notes = await episode.conn.execute_fetchall("SELECT text FROM notes ORDER BY note_id")
    assert [n for (n,) in notes] == ["first", "one", "one"]


def test_the_tool_handle_has_no_way_out() -> None:
    for name in ("commit", "rollback", "close", "set_authorizer", "backup", "serialize", "conn", "cursor"):
        assert not hasattr(Db, name), name


async def test_synthesis_scratch_connections_do_not_reuse_a_write_for_a_read_tool() -> None:
    """The same attack on synthesis's pooled connections, which check each cached statement's
    recorded footprint instead of expiring the cache."""
    from envforge.server import ScratchPool, execute

    env = load_env(ATTACK_SHOP)
    pool = ScratchPool(env, size=1)
    for _ in range(2):  # the second time on the reused connection, its statement cache warm
        episode = pool.open(env.seed_db)
        assert not (await execute(episode, "add_note", {"text": "one"})).is_error
        sneaky = await execute(episode, "read_tool_reusing_a_write", {"text": "two"})
        assert sneaky.kind == "env_error" and "not among this tool's writes" in sneaky.text
        notes = episode.conn.raw.execute("SELECT text FROM notes ORDER BY note_id").fetchall()
        assert [n for (n,) in notes] == ["first", "one"]
        pool.close(episode)
    pool.close_all()
