"""Tool calls are validated, atomic, and rendered the same way every time."""

from __future__ import annotations

import json
import logging

import pytest

from envforge.server import MAX_STRING_CHARS, Fleet, render_result


@pytest.fixture
async def fleet(bank_env):
    fleet = Fleet([bank_env])
    yield fleet
    await fleet.aclose()


async def test_write_commits_and_returns_json(fleet):
    ep = await fleet.create_episode("bank")
    result = await fleet.call(ep.id, "transfer", {"src": "A-1", "dst": "A-2", "amount": 30})
    assert not result.is_error
    assert json.loads(result.text) == {"transfer_id": 1, "src": "A-1", "dst": "A-2", "amount": 30.0}
    balances = await fleet.call(ep.id, "list_accounts", {"customer_id": "C-2"})
    assert json.loads(balances.text) == [{"account_id": "A-2", "balance": 80.0, "status": "open"}]


async def test_failed_write_rolls_back_partial_changes(fleet):
    ep = await fleet.create_episode("bank")
    _, before = await fleet.export(ep.id)
    # the credit to A-1 succeeds, then the debit violates CHECK(balance >= 0): both must be undone,
    # and the constraint the tool failed to check is the env's bug, not a refusal
    result = await fleet.call(ep.id, "transfer", {"src": "A-4", "dst": "A-1", "amount": 10})
    assert result.is_error and result.kind == "env_error" and "IntegrityError" in result.text
    assert (await fleet.export(ep.id))[1] == before
    refused = await fleet.call(ep.id, "transfer", {"src": "A-3", "dst": "A-1", "amount": 1})
    assert refused.text == "Error: account A-3 is frozen"
    assert (await fleet.export(ep.id))[1] == before


async def test_error_midway_through_a_list_rolls_back_earlier_items(fleet):
    ep = await fleet.create_episode("bank")
    _, before = await fleet.export(ep.id)
    result = await fleet.call(ep.id, "freeze_accounts", {"account_ids": ["A-1", "A-2", "A-404"]})
    assert result.text == "Error: account A-404 not found"
    assert (await fleet.export(ep.id))[1] == before
    ok = await fleet.call(ep.id, "freeze_accounts", {"account_ids": ["A-2", "A-1"]})
    assert ok.text == '["A-1", "A-2"]'


async def test_unexpected_exception_is_short_error_and_rolled_back(fleet, caplog):
    caplog.set_level(logging.ERROR, logger="envforge.server.runtime")  # the CLI's tests quiet it
    ep = await fleet.create_episode("bank")
    _, before = await fleet.export(ep.id)
    result = await fleet.call(ep.id, "crash", {"account_id": "A-1"})
    assert result.is_error and result.kind == "env_error"
    assert result.text.startswith("Error: internal error of the environment in tool 'crash' (TypeError")
    assert "unsupported operand" not in result.text and "Traceback" not in result.text
    assert "raised unexpectedly" in caplog.text  # the traceback goes to the server log
    assert (await fleet.export(ep.id))[1] == before


async def test_read_tool_that_writes_is_refused_and_rolled_back(fleet):
    ep = await fleet.create_episode("bank")
    _, before = await fleet.export(ep.id)
    result = await fleet.call(ep.id, "sneaky_read", {"account_id": "A-1"})
    assert result.kind == "env_error" and "internal error of the environment" in result.text
    assert "not among this tool's writes" in result.text
    assert (await fleet.export(ep.id))[1] == before


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "Error: missing required argument 'account_id' for tool 'get_account'"),
        (
            {"account_id": "A-1", "x": 1},
            "Error: unexpected argument 'x' (tool 'get_account' takes: account_id)",
        ),
        ({"account_id": 7}, "Error: argument 'account_id': Input should be a valid string (got int)"),
        ({"account_id": "a" * (MAX_STRING_CHARS + 1)}, "Error: argument 'account_id' is too long"),
        ([1, 2], "Error: arguments must be a JSON object, got list"),
    ],
)
async def test_argument_validation_names_the_parameter(fleet, arguments, message):
    ep = await fleet.create_episode("bank")
    result = await fleet.call(ep.id, "get_account", arguments)
    assert result.is_error and result.text.startswith(message)


async def test_enum_and_list_types_are_checked(fleet):
    ep = await fleet.create_episode("bank")
    bad_enum = await fleet.call(ep.id, "list_accounts", {"customer_id": "C-1", "status": "closed"})
    assert bad_enum.is_error and "argument 'status'" in bad_enum.text
    bad_list = await fleet.call(ep.id, "freeze_accounts", {"account_ids": "A-1"})
    assert bad_list.is_error and "argument 'account_ids'" in bad_list.text
    unknown = await fleet.call(ep.id, "drop_tables", {})
    assert unknown.text == "Error: Tool 'drop_tables' not found."


async def test_sql_metacharacters_are_plain_data(fleet):
    ep = await fleet.create_episode("bank")
    _, before = await fleet.export(ep.id)
    result = await fleet.call(ep.id, "get_account", {"account_id": "A-1' OR '1'='1"})
    assert result.text == "Error: account A-1' OR '1'='1 not found"
    assert (await fleet.export(ep.id))[1] == before


async def test_python_style_argument_errors(bank_env, tmp_path):
    import shutil

    from envforge.server import load_env

    dst = tmp_path / "bank"
    shutil.copytree(bank_env.root, dst)
    toml = (
        (dst / "env.toml")
        .read_text()
        .replace(
            'version = "0.1.0"', 'version = "0.1.0"\nargument_errors = "python"\npython_owner = "BankTools"'
        )
    )
    (dst / "env.toml").write_text(toml)
    fleet = Fleet([load_env(dst)])
    ep = await fleet.create_episode("bank")
    missing = await fleet.call(ep.id, "transfer", {"src": "A-1"})
    assert (
        missing.text
        == "Error: BankTools.transfer() missing 2 required positional arguments: 'dst' and 'amount'"
    )
    extra = await fleet.call(ep.id, "get_account", {"account_id": "A-1", "extra": 1})
    assert extra.text == "Error: BankTools.get_account() got an unexpected keyword argument 'extra'"
    untyped = await fleet.call(ep.id, "get_account", {"account_id": 1})  # passed through, simply not found
    assert untyped.text == "Error: account 1 not found"
    await fleet.aclose()


def test_render_rules():
    assert render_result("plain text") == "plain text"
    assert render_result(4.0) == "4.0" and render_result(True) == "True"
    assert render_result({"b": 1, "a": [1.5, None]}) == '{"b": 1, "a": [1.5, null]}'
    assert render_result(None) == "null"
