"""The bundled retail_orders env: it loads, its seed is consistent, and every write tool both
succeeds where its preconditions hold and refuses (changing nothing) where they do not.

Everything runs through `Fleet.call` on real SQLite episodes, so these tests also pin the exact
texts agents see. The ids used below are rows of the deterministic seed.json.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest

from envforge.server import Environment, Fleet, State, load_env

from support.paths import ENVS

ENV_DIR = ENVS / "retail_orders"


@pytest.fixture(scope="module")
def env() -> Environment:
    return load_env(ENV_DIR)


@pytest.fixture
async def fleet(env: Environment) -> AsyncIterator[Fleet]:
    fleet = Fleet([env])
    try:
        yield fleet
    finally:
        await fleet.aclose()


@pytest.fixture
async def ep(fleet: Fleet, env: Environment) -> str:
    return (await fleet.create_episode(env.name)).id


async def succeed(fleet: Fleet, ep: str, tool: str, args: dict[str, Any]) -> Any:
    """Call a tool that must succeed and change the state; return its parsed JSON result."""
    _, before = await fleet.export(ep)
    result = await fleet.call(ep, tool, args)
    assert not result.is_error, result.text
    _, after = await fleet.export(ep)
    assert after != before, f"{tool} succeeded but changed nothing"
    return json.loads(result.text)


async def read(fleet: Fleet, ep: str, tool: str, args: dict[str, Any]) -> Any:
    result = await fleet.call(ep, tool, args)
    assert not result.is_error, result.text
    return json.loads(result.text)


def rows_by_id(state: State, table: str, key: str) -> dict[str, dict[str, Any]]:
    return {r[key]: r for r in state[table]}


def check_invariants(state: State) -> None:
    """Money and statuses agree across tables: what every write tool must preserve."""
    items_by_order: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in state["order_items"]:
        items_by_order[item["order_id"]].append(item)
    paid: dict[str, float] = defaultdict(float)
    refunded_by_return: dict[str, float] = defaultdict(float)
    for p in state["payments"]:
        if p["return_id"] is not None:
            refunded_by_return[p["return_id"]] += p["amount"]
        else:
            paid[p["order_id"]] += p["amount"] if p["kind"] == "charge" else -p["amount"]
    for order in state["orders"]:
        oid = order["order_id"]
        items_total = sum(i["quantity"] * i["unit_price"] for i in items_by_order[oid])
        assert round(items_total, 2) == order["total"], oid
        expected = 0.0 if order["status"] == "cancelled" else order["total"]
        assert round(paid[oid], 2) == expected, oid
    item_status = {i["order_item_id"]: i["status"] for i in state["order_items"]}
    returns = rows_by_id(state, "returns", "return_id")
    open_items: dict[str, str] = {}
    for ri in state["return_items"]:
        status = returns[ri["return_id"]]["status"]
        if status in ("requested", "refunded"):
            assert ri["order_item_id"] not in open_items, "an item is in two live returns"
            open_items[ri["order_item_id"]] = "return_requested" if status == "requested" else "returned"
    for item_id, status in item_status.items():
        assert status == open_items.get(item_id, "ordered"), item_id
    for rid, ret in returns.items():
        refunded = round(refunded_by_return[rid], 2)
        assert refunded == (ret["refund_amount"] if ret["status"] == "refunded" else 0.0), rid


# --- loading and the seed ----------------------------------------------------------------------


def test_env_loads_with_enough_tools_and_rows(env: Environment) -> None:
    writes = [t for t in env.tools.values() if not t.read_only]
    assert len(env.tools) >= 10
    assert len(writes) >= 5
    assert sum(len(rows) for rows in env.seed_state().values()) >= 150
    assert env.policy.count("\n") >= 25
    table_names = {t.name for t in env.tables}
    for spec in writes:
        assert set(spec.writes) <= table_names, spec.name


def test_tool_schemas_expose_list_and_enum_parameters(env: Environment) -> None:
    variant_ids = env.tools["place_order"].input_schema["properties"]["variant_ids"]
    assert variant_ids["type"] == "array" and variant_ids["items"]["type"] == "string"
    reason = env.tools["cancel_order"].input_schema["properties"]["reason"]
    assert reason["enum"] == [
        "no_longer_needed",
        "ordered_by_mistake",
        "found_better_price",
        "delivery_too_slow",
    ]


def test_seed_is_internally_consistent(env: Environment) -> None:
    check_invariants(env.seed_state())


# --- read tools ---------------------------------------------------------------------------------


async def test_read_tools_feed_each_other(fleet: Fleet, ep: str) -> None:
    by_email = await read(fleet, ep, "find_customer_by_email", {"email": " Olivia.Johnson@EXAMPLE.com"})
    assert by_email["customer_id"] == "C-1001"
    by_name = await read(
        fleet,
        ep,
        "find_customer_by_name_zip",
        {"first_name": "olivia", "last_name": "Johnson", "zip": "37203"},
    )
    assert by_name == by_email
    customer = await read(fleet, ep, "get_customer", {"customer_id": "C-1001"})
    assert [a["address_id"] for a in customer["addresses"]] == ["A-2001", "A-2002"]
    assert [p["payment_method_id"] for p in customer["payment_methods"]] == ["PM-3001", "PM-3002"]
    delivered = await read(
        fleet, ep, "list_customer_orders", {"customer_id": "C-1001", "status": "delivered"}
    )
    assert [o["order_id"] for o in delivered] == ["O-5011", "O-5018", "O-5031"]
    order = await read(fleet, ep, "get_order", {"order_id": "O-5011"})
    assert order["return_ids"] == ["R-7004"]
    assert [p["kind"] for p in order["payments"]] == ["charge", "refund"]
    ret = await read(fleet, ep, "get_return", {"return_id": "R-7004"})
    assert ret["order_item_ids"] == ["OI-6022"] and ret["status"] == "refunded"
    products = await read(fleet, ep, "search_products", {"query": "watch", "category": "electronics"})
    assert [p["product_id"] for p in products] == ["P-108"]
    product = await read(fleet, ep, "get_product", {"product_id": "P-108"})
    assert {v["variant_id"]: v["stock"] for v in product["variants"]}["V-4029"] == 0


async def test_read_tool_errors(fleet: Fleet, ep: str) -> None:
    cases = [
        (
            "find_customer_by_email",
            {"email": "nobody@example.com"},
            "no customer has the email 'nobody@example.com'",
        ),
        ("get_order", {"order_id": "O-1"}, "order O-1 not found"),
        ("list_customer_orders", {"customer_id": "C-1", "status": "pending"}, "customer C-1 not found"),
        ("list_customer_orders", {"customer_id": "C-1001", "status": "lost"}, None),
    ]
    for tool, args, message in cases:
        result = await fleet.call(ep, tool, args)
        assert result.is_error, (tool, result.text)
        if message is not None:
            assert result.text == f"Error: {message}"


# --- write tools: success cases ----------------------------------------------------------------


async def test_place_order_with_card(fleet: Fleet, ep: str) -> None:
    args = {
        "customer_id": "C-1001",
        "address_id": "A-2001",
        "payment_method_id": "PM-3001",
        "variant_ids": ["V-4001", "V-4026", "V-4001"],
    }
    order = await succeed(fleet, ep, "place_order", args)
    assert order["order_id"] == "O-5064"
    assert (order["status"], order["placed_on"], order["total"]) == ("pending", "2024-06-15", 335.0)
    assert [(i["order_item_id"], i["variant_id"], i["quantity"]) for i in order["items"]] == [
        ("OI-6112", "V-4001", 2),
        ("OI-6113", "V-4026", 1),
    ]
    assert order["payments"] == [
        {
            "payment_id": "PAY-8076",
            "payment_method_id": "PM-3001",
            "kind": "charge",
            "amount": 335.0,
            "return_id": None,
        }
    ]
    state, _ = await fleet.export(ep)
    variants = rows_by_id(state, "variants", "variant_id")
    assert (variants["V-4001"]["stock"], variants["V-4026"]["stock"]) == (10, 15)
    check_invariants(state)


async def test_place_order_with_gift_card_debits_balance(fleet: Fleet, ep: str) -> None:
    args = {
        "customer_id": "C-1001",
        "address_id": "A-2002",
        "payment_method_id": "PM-3002",
        "variant_ids": ["V-4030"],
    }
    order = await succeed(fleet, ep, "place_order", args)
    assert order["total"] == 24.95
    customer = await read(fleet, ep, "get_customer", {"customer_id": "C-1001"})
    assert customer["payment_methods"][1]["balance"] == 475.05


async def test_cancel_pending_order_refunds_card_and_restocks(fleet: Fleet, ep: str) -> None:
    args = {"customer_id": "C-1030", "order_id": "O-5058", "reason": "ordered_by_mistake"}
    order = await succeed(fleet, ep, "cancel_order", args)
    assert (order["status"], order["cancel_reason"]) == ("cancelled", "ordered_by_mistake")
    assert order["payments"][-1] == {
        "payment_id": "PAY-8076",
        "payment_method_id": "PM-3053",
        "kind": "refund",
        "amount": 18.0,
        "return_id": None,
    }
    state, _ = await fleet.export(ep)
    assert rows_by_id(state, "variants", "variant_id")["V-4004"]["stock"] == 17
    check_invariants(state)


async def test_cancel_processing_order_paid_by_gift_card_credits_it(fleet: Fleet, ep: str) -> None:
    await succeed(
        fleet,
        ep,
        "cancel_order",
        {"customer_id": "C-1025", "order_id": "O-5047", "reason": "found_better_price"},
    )
    state, _ = await fleet.export(ep)
    assert rows_by_id(state, "payment_methods", "payment_method_id")["PM-3043"]["balance"] == 329.0
    order = await succeed(
        fleet,
        ep,
        "cancel_order",
        {"customer_id": "C-1028", "order_id": "O-5048", "reason": "delivery_too_slow"},
    )
    assert order["status"] == "cancelled"
    check_invariants((await fleet.export(ep))[0])


async def test_update_order_address(fleet: Fleet, ep: str) -> None:
    args = {"customer_id": "C-1021", "order_id": "O-5051", "address_id": "A-2037"}
    order = await succeed(fleet, ep, "update_order_address", args)
    assert (order["order_id"], order["address_id"]) == ("O-5051", "A-2037")


async def test_change_order_item_refunds_a_cheaper_variant(fleet: Fleet, ep: str) -> None:
    args = {
        "customer_id": "C-1026",
        "order_id": "O-5057",
        "order_item_id": "OI-6103",
        "variant_id": "V-4026",
        "payment_method_id": "PM-3045",
    }
    order = await succeed(fleet, ep, "change_order_item", args)
    assert order["total"] == 299.0
    assert order["items"][0]["variant_id"] == "V-4026" and order["items"][0]["unit_price"] == 299.0
    assert order["payments"][-1]["kind"] == "refund" and order["payments"][-1]["amount"] == 30.0
    state, _ = await fleet.export(ep)
    assert rows_by_id(state, "payment_methods", "payment_method_id")["PM-3045"]["balance"] == 70.0
    variants = rows_by_id(state, "variants", "variant_id")
    assert (variants["V-4027"]["stock"], variants["V-4026"]["stock"]) == (11, 15)
    check_invariants(state)


async def test_change_order_item_charges_a_dearer_variant(fleet: Fleet, ep: str) -> None:
    args = {
        "customer_id": "C-1022",
        "order_id": "O-5062",
        "order_item_id": "OI-6110",
        "variant_id": "V-4042",
        "payment_method_id": "PM-3038",
    }
    order = await succeed(fleet, ep, "change_order_item", args)
    assert order["total"] == 282.95
    assert order["payments"][-1] == {
        "payment_id": "PAY-8076",
        "payment_method_id": "PM-3038",
        "kind": "charge",
        "amount": 20.0,
        "return_id": None,
    }
    state, _ = await fleet.export(ep)
    assert rows_by_id(state, "payment_methods", "payment_method_id")["PM-3038"]["balance"] == 20.0
    check_invariants(state)


async def test_change_order_item_at_the_same_price_moves_no_money(fleet: Fleet, ep: str) -> None:
    args = {
        "customer_id": "C-1003",
        "order_id": "O-5054",
        "order_item_id": "OI-6095",
        "variant_id": "V-4002",
        "payment_method_id": "PM-3004",
    }
    order = await succeed(fleet, ep, "change_order_item", args)
    assert len(order["payments"]) == 1 and order["total"] == 295.98
    assert order["items"][0]["variant_id"] == "V-4002"
    check_invariants((await fleet.export(ep))[0])


async def test_change_order_item_refuses_an_underfunded_gift_card(fleet: Fleet, ep: str) -> None:
    args = {
        "customer_id": "C-1026",
        "order_id": "O-5057",
        "order_item_id": "OI-6103",
        "variant_id": "V-4028",
        "payment_method_id": "PM-3045",
    }
    _, before = await fleet.export(ep)
    result = await fleet.call(ep, "change_order_item", args)
    assert result.text == "Error: gift card PM-3045 has a balance of 40.00, less than the 70.00 to be charged"
    assert (await fleet.export(ep))[1] == before


async def test_request_return_to_card_and_to_gift_card(fleet: Fleet, ep: str) -> None:
    args = {
        "customer_id": "C-1001",
        "order_id": "O-5031",
        "order_item_ids": ["OI-6056"],
        "reason": "wrong_size",
        "payment_method_id": "PM-3002",
    }
    ret = await succeed(fleet, ep, "request_return", args)
    assert ret == {
        "return_id": "R-7014",
        "order_id": "O-5031",
        "payment_method_id": "PM-3002",
        "reason": "wrong_size",
        "status": "requested",
        "requested_on": "2024-06-15",
        "refund_amount": 798.0,
        "order_item_ids": ["OI-6056"],
    }
    args = {**args, "order_item_ids": ["OI-6055"], "payment_method_id": "PM-3001", "reason": "changed_mind"}
    ret = await succeed(fleet, ep, "request_return", args)
    assert (ret["return_id"], ret["refund_amount"]) == ("R-7015", 18.0)
    order = await read(fleet, ep, "get_order", {"order_id": "O-5031"})
    assert [i["status"] for i in order["items"]] == ["return_requested", "return_requested"]
    check_invariants((await fleet.export(ep))[0])


async def test_cancel_return_then_request_it_again(fleet: Fleet, ep: str) -> None:
    ret = await succeed(fleet, ep, "cancel_return", {"customer_id": "C-1001", "return_id": "R-7007"})
    assert ret["status"] == "cancelled" and ret["order_item_ids"] == ["OI-6035"]
    order = await read(fleet, ep, "get_order", {"order_id": "O-5018"})
    assert order["items"][0]["status"] == "ordered"
    args = {
        "customer_id": "C-1001",
        "order_id": "O-5018",
        "order_item_ids": ["OI-6035"],
        "reason": "defective",
        "payment_method_id": "PM-3001",
    }
    await succeed(fleet, ep, "request_return", args)
    check_invariants((await fleet.export(ep))[0])


async def test_add_address_and_make_it_default(fleet: Fleet, ep: str) -> None:
    args = {
        "customer_id": "C-1008",
        "line1": "77 Willow Way",
        "line2": "Apt 3C",
        "city": "Denver",
        "state": "CO",
        "zip": "80202",
        "make_default": True,
    }
    address = await succeed(fleet, ep, "add_address", args)
    assert address == {
        "address_id": "A-2070",
        "customer_id": "C-1008",
        "line1": "77 Willow Way",
        "line2": "Apt 3C",
        "city": "Denver",
        "state": "CO",
        "zip": "80202",
        "is_default": 1,
    }
    customer = await read(fleet, ep, "get_customer", {"customer_id": "C-1008"})
    assert [(a["address_id"], a["is_default"]) for a in customer["addresses"]] == [
        ("A-2016", 0),
        ("A-2070", 1),
    ]


# --- write tools: refusals change nothing ------------------------------------------------------

REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    (
        "place_order",
        {
            "customer_id": "C-1007",
            "address_id": "A-2015",
            "payment_method_id": "PM-3013",
            "variant_ids": ["V-4001"],
        },
        "customer C-1007 is suspended and cannot place orders",
    ),
    (
        "place_order",
        {
            "customer_id": "C-1002",
            "address_id": "A-2003",
            "payment_method_id": "PM-3003",
            "variant_ids": ["V-4001"],
        },
        "card PM-3003 expired in 2023-03",
    ),
    (
        "place_order",
        {
            "customer_id": "C-1004",
            "address_id": "A-2007",
            "payment_method_id": "PM-3006",
            "variant_ids": ["V-4001"],
        },
        "gift card PM-3006 has a balance of 12.50, less than the 18.00 to be charged",
    ),
    (
        "place_order",
        {
            "customer_id": "C-1001",
            "address_id": "A-2001",
            "payment_method_id": "PM-3001",
            "variant_ids": ["V-4008", "V-4008"],
        },
        "variant V-4008 has 1 in stock, 2 requested",
    ),
    (
        "place_order",
        {
            "customer_id": "C-1001",
            "address_id": "A-2001",
            "payment_method_id": "PM-3001",
            "variant_ids": ["V-4018"],
        },
        "product P-105 (Leather Chelsea Boots) is discontinued and cannot be ordered",
    ),
    (
        "place_order",
        {
            "customer_id": "C-1001",
            "address_id": "A-2003",
            "payment_method_id": "PM-3001",
            "variant_ids": ["V-4001"],
        },
        "address A-2003 does not belong to customer C-1001",
    ),
    (
        "cancel_order",
        {"customer_id": "C-1022", "order_id": "O-5032", "reason": "no_longer_needed"},
        "order O-5032 is shipped; only pending or processing orders can be cancelled",
    ),
    (
        "cancel_order",
        {"customer_id": "C-1001", "order_id": "O-5058", "reason": "no_longer_needed"},
        "order O-5058 does not belong to customer C-1001",
    ),
    (
        "update_order_address",
        {"customer_id": "C-1032", "order_id": "O-5061", "address_id": "A-2056"},
        "order O-5061 is processing; only pending orders can be changed",
    ),
    (
        "update_order_address",
        {"customer_id": "C-1021", "order_id": "O-5051", "address_id": "A-2001"},
        "address A-2001 does not belong to customer C-1021",
    ),
    (
        "change_order_item",
        {
            "customer_id": "C-1026",
            "order_id": "O-5057",
            "order_item_id": "OI-6103",
            "variant_id": "V-4021",
            "payment_method_id": "PM-3045",
        },
        "variant V-4021 belongs to product P-106, not P-108; "
        "an item can only be swapped for a variant of the same product",
    ),
    (
        "change_order_item",
        {
            "customer_id": "C-1026",
            "order_id": "O-5057",
            "order_item_id": "OI-6103",
            "variant_id": "V-4029",
            "payment_method_id": "PM-3045",
        },
        "variant V-4029 has 0 in stock, 1 needed",
    ),
    (
        "change_order_item",
        {
            "customer_id": "C-1026",
            "order_id": "O-5057",
            "order_item_id": "OI-6103",
            "variant_id": "V-4028",
            "payment_method_id": "PM-3044",
        },
        "card PM-3044 expired in 2024-02",
    ),
    (
        "change_order_item",
        {
            "customer_id": "C-1038",
            "order_id": "O-5053",
            "order_item_id": "OI-6094",
            "variant_id": "V-4024",
            "payment_method_id": "PM-3067",
        },
        "order O-5053 is processing; only pending orders can be changed",
    ),
    (
        "request_return",
        {
            "customer_id": "C-1005",
            "order_id": "O-5014",
            "order_item_ids": ["OI-6028"],
            "reason": "defective",
            "payment_method_id": "PM-3007",
        },
        "the 30-day return window of order O-5014 closed on 2024-06-05",
    ),
    (
        "request_return",
        {
            "customer_id": "C-1001",
            "order_id": "O-5018",
            "order_item_ids": ["OI-6035"],
            "reason": "defective",
            "payment_method_id": "PM-3001",
        },
        "order item OI-6035 is already return requested",
    ),
    (
        "request_return",
        {
            "customer_id": "C-1030",
            "order_id": "O-5058",
            "order_item_ids": ["OI-6104"],
            "reason": "changed_mind",
            "payment_method_id": "PM-3053",
        },
        "order O-5058 is pending; only delivered orders can be returned",
    ),
    (
        "request_return",
        {
            "customer_id": "C-1029",
            "order_id": "O-5033",
            "order_item_ids": ["OI-6059"],
            "reason": "changed_mind",
            "payment_method_id": "PM-3049",
        },
        "order O-5033 was not paid with PM-3049; refunds go to a payment method the order was charged with "
        "or to one of the customer's gift cards",
    ),
    (
        "request_return",
        {
            "customer_id": "C-1001",
            "order_id": "O-5031",
            "order_item_ids": ["OI-6055", "OI-6035"],
            "reason": "changed_mind",
            "payment_method_id": "PM-3001",
        },
        "order item OI-6035 is not part of order O-5031",
    ),
    (
        "cancel_return",
        {"customer_id": "C-1001", "return_id": "R-7004"},
        "return R-7004 is refunded; only requested returns can be cancelled",
    ),
    (
        "cancel_return",
        {"customer_id": "C-1002", "return_id": "R-7007"},
        "order O-5018 does not belong to customer C-1002",
    ),
    (
        "add_address",
        {"customer_id": "C-1005", "line1": "1 Main Street", "city": "Boston", "state": "MA", "zip": "02116"},
        "customer C-1005 already has 4 addresses, the maximum",
    ),
    (
        "add_address",
        {
            "customer_id": "C-1001",
            "line1": "6262 spring street",
            "line2": "Suite 821",
            "city": "Austin",
            "state": "TX",
            "zip": "78701",
        },
        "customer C-1001 already has this address as A-2001",
    ),
    (
        "add_address",
        {
            "customer_id": "C-1008",
            "line1": "1 Main Street",
            "city": "Boston",
            "state": "Mass",
            "zip": "02116",
        },
        "state must be a two-letter code such as 'TX', got 'Mass'",
    ),
]


@pytest.mark.parametrize(
    ("tool", "args", "message"), REFUSALS, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(REFUSALS)]
)
async def test_refusal_leaves_state_unchanged(
    fleet: Fleet, ep: str, tool: str, args: dict[str, Any], message: str
) -> None:
    state_before, before = await fleet.export(ep)
    result = await fleet.call(ep, tool, args)
    assert result.is_error
    assert result.text == f"Error: {message}"
    state_after, after = await fleet.export(ep)
    assert after == before and state_after == state_before


def test_every_write_tool_has_a_refusal_case(env: Environment) -> None:
    writes = {name for name, spec in env.tools.items() if not spec.read_only}
    assert writes == {tool for tool, _, _ in REFUSALS}


# --- determinism -------------------------------------------------------------------------------

SEQUENCE: list[tuple[str, dict[str, Any]]] = [
    (
        "place_order",
        {
            "customer_id": "C-1014",
            "address_id": "A-2027",
            "payment_method_id": "PM-3024",
            "variant_ids": ["V-4043", "V-4030"],
        },
    ),
    ("cancel_order", {"customer_id": "C-1030", "order_id": "O-5060", "reason": "no_longer_needed"}),
    (
        "change_order_item",
        {
            "customer_id": "C-1029",
            "order_id": "O-5049",
            "order_item_id": "OI-6086",
            "variant_id": "V-4024",
            "payment_method_id": "PM-3049",
        },
    ),
    (
        "request_return",
        {
            "customer_id": "C-1027",
            "order_id": "O-5030",
            "order_item_ids": ["OI-6054"],
            "reason": "defective",
            "payment_method_id": "PM-3047",
        },
    ),
    ("cancel_return", {"customer_id": "C-1009", "return_id": "R-7011"}),
    (
        "add_address",
        {"customer_id": "C-1014", "line1": "9 Oak Avenue", "city": "Tampa", "state": "FL", "zip": "33602"},
    ),
    ("update_order_address", {"customer_id": "C-1014", "order_id": "O-5064", "address_id": "A-2070"}),
    ("cancel_order", {"customer_id": "C-1014", "order_id": "O-5064", "reason": "ordered_by_mistake"}),
]


async def test_same_calls_give_the_same_state_in_fresh_episodes(fleet: Fleet, env: Environment) -> None:
    hashes = []
    for _ in range(2):
        episode = await fleet.create_episode(env.name)
        for tool, args in SEQUENCE:
            result = await fleet.call(episode.id, tool, args)
            assert not result.is_error, (tool, result.text)
        state, digest = await fleet.export(episode.id)
        check_invariants(state)
        hashes.append(digest)
        await fleet.close_episode(episode.id)
    assert hashes[0] == hashes[1] != env.seed_hash()
