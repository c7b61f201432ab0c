"""The tau2_retail env against τ²-bench's own recorded behaviour.

Everything is checked against reference data produced by running τ²'s code (shared/tau2/retail,
beside the repository, never copied into it): the 16 tool schemas, the initial DB hash, every
call of the 74 train-split gold replays (output text, error flag, changed records, final hash),
and 22 edge-case calls. The env is imported and loaded once per session; each task replays in a
fresh episode of it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from envforge.server import Environment, Fleet, load_env
from envforge.synth import (
    INITIAL_DB_HASH,
    ORDER_OPTIONAL_FIELDS,
    Tau2ImportError,
    import_tau2_env,
    port_tools,
    state_to_tau2_db,
    tau2_db_hash,
    tau2_db_to_seed,
    tools_json_mismatches,
)

from support.paths import TAU2_RETAIL
from support.skips import TAU2_NO_DATA, tau2_data_missing

PORT_CODE = ("env.toml", "schema.sql", "tools.py")
RETAIL = TAU2_RETAIL

pytestmark = pytest.mark.skipif(tau2_data_missing("db.json"), reason=TAU2_NO_DATA)


def _jsonl(name: str) -> list[dict[str, Any]]:
    path = RETAIL / name
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


GOLD = _jsonl("gold_replays_train.jsonl")
EDGE_CASES = _jsonl("edge_case_outputs.jsonl")


def _params(rows: list[dict[str, Any]], key: str) -> list[Any]:
    if not rows:
        if tau2_data_missing("db.json"):
            return [pytest.param(None, marks=pytest.mark.skip(reason=TAU2_NO_DATA))]
        raise FileNotFoundError(f"{RETAIL} has no rows to parametrize by {key!r}")
    return [pytest.param(row, id=str(row[key])) for row in rows]


@pytest.fixture(scope="session")
def tau2_env(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """The env imported from τ²'s data into a temporary folder (without tasks), and loaded."""
    env_dir = tmp_path_factory.mktemp("tau2") / "tau2_retail"
    import_tau2_env(RETAIL, env_dir, tasks=False)
    return load_env(env_dir)


@pytest.fixture(scope="session")
def initial_db(tau2_env: Environment) -> dict[str, Any]:
    return state_to_tau2_db(tau2_env.seed_state())


def _round_floats(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: _round_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_round_floats(v) for v in value]
    return value


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def assert_same_output(ours: str, theirs: str, where: str) -> None:
    """Equal as JSON (floats to 2 decimals) when τ²'s output is JSON, else as exact strings; and
    then, stricter than needed, byte for byte (τ²'s JSON round-trips through json.dumps)."""
    theirs_json = _json_or_none(theirs)
    if theirs_json is not None and not isinstance(theirs_json, str):
        ours_json = _json_or_none(ours)
        assert _round_floats(ours_json) == _round_floats(theirs_json), (
            f"{where}: output differs\n{ours}\n{theirs}"
        )
    assert ours == theirs, f"{where}: output differs as text\n{ours}\n{theirs}"


def changed_records(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """τ²'s db_diff: {table: {key: record_after}} for records whose dump changed."""
    diff: dict[str, dict[str, Any]] = {}
    for table in ("products", "users", "orders"):
        keys = before[table].keys() | after[table].keys()
        changed = {
            k: after[table].get(k) for k in sorted(keys) if before[table].get(k) != after[table].get(k)
        }
        if changed:
            diff[table] = changed
    return diff


def test_tool_schemas_equal_tau2(tau2_env: Environment) -> None:
    tools = json.loads((RETAIL / "tools.json").read_text(encoding="utf-8"))
    assert list(tau2_env.tools) == [t["function"]["name"] for t in tools]
    for t in tools:
        f = t["function"]
        spec = tau2_env.tools[f["name"]]
        assert spec.description == f["description"], f["name"]
        assert spec.input_schema == f["parameters"], f["name"]
        assert list(spec.input_schema["properties"]) == list(f["parameters"]["properties"]), f["name"]


def test_write_tools_are_tau2s_write_tools(tau2_env: Environment) -> None:
    writes = {name for name, spec in tau2_env.tools.items() if not spec.read_only}
    assert writes == {
        "cancel_pending_order",
        "exchange_delivered_order_items",
        "modify_pending_order_address",
        "modify_pending_order_items",
        "modify_pending_order_payment",
        "modify_user_address",
        "return_delivered_order_items",
    }


def test_initial_state_has_tau2s_hash(initial_db: dict[str, Any]) -> None:
    assert tau2_db_hash(initial_db) == INITIAL_DB_HASH


def test_initial_state_is_tau2s_model_dump(initial_db: dict[str, Any]) -> None:
    """Independently of the importer: db.json plus the 7 null order fields is what τ² dumps."""
    raw = json.loads((RETAIL / "db.json").read_text(encoding="utf-8"))
    for order in raw["orders"].values():
        for f in ORDER_OPTIONAL_FIELDS:
            order.setdefault(f, None)
    assert initial_db == raw
    # Key order too: it is what the agent sees in every JSON result.
    assert json.dumps(initial_db) == json.dumps(raw)


def test_seed_is_the_loaded_state(tau2_env: Environment) -> None:
    """seed.json holds exactly what the canonical export gives back (no loss in SQLite)."""
    raw = json.loads((RETAIL / "db.json").read_text(encoding="utf-8"))
    seed = tau2_db_to_seed(raw)
    state = tau2_env.seed_state()
    assert set(seed) == set(state)
    for table, rows in seed.items():
        key = next(c for c in tau2_env.tables if c.name == table).primary_key
        assert sorted(rows, key=lambda r: tuple(r[c] for c in key)) == state[table], table


@pytest.mark.parametrize("task", _params(GOLD, "task_id"))
async def test_gold_replay(tau2_env: Environment, initial_db: dict[str, Any], task: dict[str, Any]) -> None:
    fleet = Fleet([tau2_env])
    try:
        episode = await fleet.create_episode(tau2_env.name)
        for i, action in enumerate(task["actions"]):
            result = await fleet.call(episode.id, action["name"], action["arguments"])
            where = f"task {task['task_id']} action {i} {action['name']}"
            assert result.is_error == task["output_is_error"][i], f"{where}: {result.text}"
            assert_same_output(result.text, task["outputs"][i], where)
        state = await episode.export()
    finally:
        await fleet.aclose()
    final = state_to_tau2_db(state)
    assert changed_records(initial_db, final) == task["db_diff"]
    assert tau2_db_hash(final) == task["final_db_hash"]
    assert (tau2_db_hash(final) != INITIAL_DB_HASH) == task["db_changed"]


@pytest.mark.parametrize("case", _params(EDGE_CASES, "case"))
async def test_edge_case(tau2_env: Environment, case: dict[str, Any]) -> None:
    fleet = Fleet([tau2_env])
    try:
        episode = await fleet.create_episode(tau2_env.name)
        result = await fleet.call(episode.id, case["name"], case["arguments"])
        state = await episode.export()
    finally:
        await fleet.aclose()
    assert result.is_error == case["output_is_error"], result.text
    assert_same_output(result.text, case["output"], case["case"])
    assert (state != tau2_env.seed_state()) == case["db_changed"]


async def _call_all(
    env: Environment, calls: list[tuple[str, dict[str, Any]]]
) -> tuple[list[Any], dict[str, Any]]:
    fleet = Fleet([env])
    try:
        episode = await fleet.create_episode(env.name)
        results = [await fleet.call(episode.id, name, args) for name, args in calls]
        state = await episode.export()
    finally:
        await fleet.aclose()
    return results, state_to_tau2_db(state)


def _modifiable_pending_order(db: dict[str, Any]) -> tuple[str, dict[str, Any], str, str, str, str]:
    """A pending order paid by a non-gift-card method, whose user has another method and whose
    first item has another available variant: (order id, order, old item, new item, card, other)."""
    for order_id, order in db["orders"].items():
        card = order["payment_history"][0]["payment_method_id"]
        methods = db["users"][order["user_id"]]["payment_methods"]
        if order["status"] != "pending" or methods[card]["source"] == "gift_card" or len(methods) < 2:
            continue
        old = order["items"][0]["item_id"]
        variants = db["products"][order["items"][0]["product_id"]]["variants"]
        new = next((v for v, d in variants.items() if v != old and d["available"]), None)
        if new is not None:
            return order_id, order, old, new, card, next(m for m in methods if m != card)
    raise AssertionError("db.json has no pending order to modify")


async def test_pending_checks_strict_and_loose(tau2_env: Environment, initial_db: dict[str, Any]) -> None:
    """After an item modification the order is "pending (item modified)": address and payment
    changes still pass τ²'s loose check, a cancel or a second item change fail its strict one."""
    order_id, order, old, new, card, other = _modifiable_pending_order(initial_db)
    address = {
        "address1": "1 A St",
        "address2": "",
        "city": "X",
        "state": "CA",
        "country": "USA",
        "zip": "00001",
    }
    results, final = await _call_all(
        tau2_env,
        [
            (
                "modify_pending_order_items",
                {"order_id": order_id, "item_ids": [old], "new_item_ids": [new], "payment_method_id": card},
            ),
            ("cancel_pending_order", {"order_id": order_id, "reason": "no longer needed"}),
            (
                "modify_pending_order_items",
                {"order_id": order_id, "item_ids": [new], "new_item_ids": [old], "payment_method_id": card},
            ),
            ("modify_pending_order_address", {"order_id": order_id, **address}),
            ("modify_pending_order_payment", {"order_id": order_id, "payment_method_id": other}),
        ],
    )
    assert [r.is_error for r in results] == [False, True, True, False, True]
    assert results[1].text == "Error: Non-pending order cannot be cancelled"
    assert results[2].text == "Error: Non-pending order cannot be modified"
    # past the loose status check, refused by the rule that follows it (2 payments now)
    assert results[4].text == "Error: There should be exactly one payment for a pending order"
    after = final["orders"][order_id]
    assert after["status"] == "pending (item modified)"
    assert list(after["address"]) == ["address1", "address2", "city", "country", "state", "zip"]
    assert after["address"]["city"] == "X"
    diff = (
        initial_db["products"][order["items"][0]["product_id"]]["variants"][new]["price"]
        - order["items"][0]["price"]
    )
    assert after["payment_history"][1] == {
        "transaction_type": "payment" if diff > 0 else "refund",
        "amount": abs(diff),
        "payment_method_id": card,
    }


async def test_empty_exchange_keeps_int_zero(tau2_env: Environment) -> None:
    """τ² stores round(0, 2) unvalidated for an empty exchange: the int 0, not 0.0."""
    results, final = await _call_all(
        tau2_env,
        [
            (
                "exchange_delivered_order_items",
                {
                    "order_id": "#W2378156",
                    "item_ids": [],
                    "new_item_ids": [],
                    "payment_method_id": "credit_card_9513926",
                },
            )
        ],
    )
    assert not results[0].is_error, results[0].text
    assert '"exchange_price_difference": 0,' in results[0].text
    assert final["orders"]["#W2378156"]["exchange_price_difference"] == 0
    assert isinstance(final["orders"]["#W2378156"]["exchange_price_difference"], int)


async def test_failed_write_changes_nothing(tau2_env: Environment) -> None:
    results, final = await _call_all(
        tau2_env,
        [
            ("cancel_pending_order", {"order_id": "#W1006327", "reason": "changed my mind"}),
            ("get_order_details", {"order_id": ["#W1006327"]}),
        ],
    )
    assert results[0].text == "Error: Invalid reason"
    assert results[1].text == "Error: unhashable type: 'list'"
    assert tau2_db_hash(final) == INITIAL_DB_HASH


def test_import_is_idempotent(tau2_env: Environment, tmp_path: Path) -> None:
    env_dir = tau2_env.root
    written = (*PORT_CODE, "seed.json", "policy.md")
    before = {n: (env_dir / n).read_bytes() for n in written}
    import_tau2_env(RETAIL, env_dir, tasks=False)
    assert {n: (env_dir / n).read_bytes() for n in before} == before
    # A fresh import elsewhere (from the folder above retail/) gives the same bytes.
    import_tau2_env(RETAIL.parent, tmp_path, tasks=False)
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    assert before["policy.md"] == (RETAIL / "policy.md").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(written)


@pytest.mark.parametrize("missing", ["db.json", "policy.md"])
def test_import_names_a_missing_file(tmp_path: Path, missing: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("db.json", "policy.md"):
        if name != missing:
            (src / name).symlink_to(RETAIL / name)
    out = tmp_path / "env"
    out.mkdir()
    with pytest.raises(Tau2ImportError, match=rf"{re.escape(missing)}: missing"):
        import_tau2_env(src, out, tasks=False)
    assert list(out.iterdir()) == []


def test_tools_json_is_a_cross_check(tmp_path: Path) -> None:
    """tools.json is optional; one that disagrees with the port is reported (an error when strict),
    and one that is not τ²'s list of function schemas is an error."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("db.json", "policy.md"):
        (src / name).symlink_to(RETAIL / name)
    out = tmp_path / "env"
    assert import_tau2_env(src, out, tasks=False).tools_json is None
    tools = json.loads((RETAIL / "tools.json").read_text(encoding="utf-8"))
    (src / "tools.json").write_text(json.dumps(tools), encoding="utf-8")
    agreed = import_tau2_env(src, out, tasks=False, strict_tools=True)
    assert agreed.tools_json == src / "tools.json" and agreed.tool_mismatches == []
    (src / "tools.json").write_text(json.dumps(tools[:-1]), encoding="utf-8")
    assert import_tau2_env(src, out, tasks=False).tool_mismatches == [
        f"{src / 'tools.json'}: lacks the port's tool 'transfer_to_human_agents'"
    ]
    with pytest.raises(Tau2ImportError, match=r"lacks the port's tool 'transfer_to_human_agents'"):
        import_tau2_env(src, out, tasks=False, strict_tools=True)
    (src / "tools.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(Tau2ImportError, match=r"tools\.json: invalid JSON"):
        import_tau2_env(src, tmp_path, tasks=False)
    (src / "tools.json").write_text(json.dumps({"tools": tools}), encoding="utf-8")
    with pytest.raises(Tau2ImportError, match=r"tools\.json: not a list"):
        import_tau2_env(src, tmp_path, tasks=False)


def test_tools_json_mismatches_name_each_difference(tmp_path: Path) -> None:
    tools = json.loads((RETAIL / "tools.json").read_text(encoding="utf-8"))
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    by_name["get_user_details"]["description"] = "Get a user."
    params = by_name["cancel_pending_order"]["parameters"]
    params["properties"]["why"] = params["properties"].pop("reason")
    params["required"] = ["order_id", "why"]
    by_name["calculate"]["parameters"]["properties"]["expression"]["type"] = "number"
    tools[0], tools[1] = tools[1], tools[0]
    tools.append({"type": "function", "function": {"name": "book_flight", "parameters": {}}})
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools), encoding="utf-8")
    lines = [line.removeprefix(f"{path}: ") for line in tools_json_mismatches(path, port_tools())]
    assert lines[0] == "tool 'book_flight' is not one of the port's tools"
    assert lines[1].startswith(
        "lists the tools in another order than the port (cancel_pending_order, calculate"
    )
    assert lines[2].startswith("tool 'cancel_pending_order': parameter 'why' is not a parameter of the port")
    assert lines[3] == "tool 'cancel_pending_order': lacks the port's parameter 'reason'"
    assert lines[4].startswith("tool 'cancel_pending_order': required parameters differ")
    assert (
        lines[5]
        == "tool 'calculate': parameter 'expression' differs in type (tools.json \"number\", port \"string\")"
    )
    assert lines[6] == "tool 'get_user_details': description differs (\"Get a user.\")"
    assert len(lines) == 7


def test_cli_replay_exports_tau2_shape(tau2_env: Environment, tmp_path: Path) -> None:
    """`envforge replay --export tau2 --json`: outputs as τ² printed them and the final db in τ²'s shape."""
    import subprocess
    import sys

    gold = json.loads((RETAIL / "gold_replays_train.jsonl").read_text().splitlines()[1])
    actions = tmp_path / "actions.json"
    actions.write_text(
        json.dumps([{"name": a["name"], "arguments": a["arguments"]} for a in gold["actions"]])
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "envforge.cli",
            "replay",
            str(tau2_env.root),
            "--actions",
            str(actions),
            "--json",
            "--export",
            "tau2",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        check=True,
    )
    out = json.loads(proc.stdout)
    assert out["outputs"] == gold["outputs"] and out["errors"] == gold["output_is_error"]
    assert tau2_db_hash(out["tau2_db"]) == gold["final_db_hash"]
